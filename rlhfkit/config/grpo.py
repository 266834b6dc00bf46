"""GRPOConfig: the hyper-parameters of GRPOTrainer, with the names, meanings and defaults of TRL 1.16's GRPOConfig."""

from __future__ import annotations

import os
from dataclasses import field

from rlhfkit.config.asynchronous import AsyncGenerationConfig, check_async_adapter
from rlhfkit.config.batch_sizes import grpo_generation_shape
from rlhfkit.config.rules import (
    FLAG,
    JSON_OBJECT,
    PATH,
    Checked,
    ListOf,
    OneOf,
    OrNone,
    check_fields,
    field_rule,
    inherited,
    integer,
    meta,
    number,
)
from rlhfkit.config.script import GRPOScriptArguments, ModelConfig, check_adapter_merge
from rlhfkit.config.train import TrainConfig, config_dataclass
from rlhfkit.errors import ConfigError
from rlhfkit.logs import note
from rlhfkit.ops.advantages import GROUP_SCALES, MULTI_OBJECTIVE_AGGREGATIONS
from rlhfkit.ops.losses import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES


def _pad_multiple_complaint(value) -> str | None:
    """pad_to_multiple_of: TRL's "auto" (resolved to unset before the rules run: see GRPOConfig._apply_aliases), a
    positive integer, or unset."""
    if value is None or value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return "must be an integer >= 1, auto, or unset (none)"


# generation_kwargs keys that a flag also sets: they override the flag (as in TRL), so they pass the flag's rule.
SAMPLING_FLAG_KEYS = ("top_k", "top_p", "min_p", "repetition_penalty")


# model_init_kwargs key -> the field that carries it (what TRL's GRPO script puts there, from its ModelConfig)
MODEL_INIT_FIELDS = {
    "revision": "model_revision",
    "trust_remote_code": "trust_remote_code",
    "attn_implementation": "attn_implementation",
    "dtype": "dtype",
}


# apply_chat_template's own arguments, which rendering a prompt sets (data.prompt_text): not template variables.
CHAT_TEMPLATE_ARGUMENTS = frozenset(
    {"conversation", "tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message",
     "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
     "tokenizer_kwargs"}
)  # fmt: skip


@config_dataclass
class GRPOConfig(AsyncGenerationConfig, TrainConfig):
    """Hyper-parameters of :class:`rlhfkit.GRPOTrainer` (names, meanings and defaults as in TRL's ``GRPOConfig``).

    As in TRL, ``per_device_train_batch_size`` counts completions: 16 with ``num_generations=8`` is 2 prompts.
    """

    trl_command = "grpo"  # the keywords it does not take are explained as `trl grpo`'s flags (config/trl_flags.py)
    exp_name: str = inherited(TrainConfig, "exp_name", "grpo")
    model_init_kwargs: dict | str | None = field(
        default=None,
        metadata=meta(
            "from_pretrained arguments for a model given by name, as TRL's script sets them: revision, "
            "trust_remote_code, attn_implementation and dtype (torch_dtype), each moved into the field of that name "
            "(model_revision, ...). JSON on the command line.",
            OrNone(JSON_OBJECT),
        ),
    )
    reward_model_path: list[str] | None = field(
        default=None,
        metadata=meta(
            "Reward models (sequence classification, 1 label, own tokenizer; hub ids or local directories) added to "
            "reward_funcs.",
            OrNone(ListOf(PATH)),
        ),
    )
    reward_weights: list[float] | None = inherited(
        TrainConfig,
        "reward_weights",
        help="Weight of each reward, in `trl grpo`'s order: the reward models (reward_model_path, then "
        "reward_model_name_or_path), then reward_funcs. Default: all 1.",
    )

    # --- batch sizes and length of training ------------------------------------------------------
    learning_rate: float = inherited(TrainConfig, "learning_rate", 1e-6)
    per_device_train_batch_size: int = inherited(
        TrainConfig,
        "per_device_train_batch_size",
        8,
        help="Completions per device per micro-batch. A group's completions may span micro-batches and devices: "
        "only the generation batch must hold whole groups.",
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata=meta(
            "Micro-batches each generation is split into (TRL): one generation holds per_device_train_batch_size x "
            "steps_per_generation completions per device. Default: gradient_accumulation_steps (one generation per "
            "optimizer step). Set at most one of this and generation_batch_size.",
            OrNone(integer(ge=1)),
        ),
    )
    generation_batch_size: int | None = field(
        default=None,
        metadata=meta(
            "Completions per generation, all devices (TRL): a multiple of per_device_train_batch_size x processes "
            "and of num_generations. Default: per_device_train_batch_size x processes x steps_per_generation.",
            OrNone(integer(ge=1)),
        ),
    )
    max_steps: int = field(
        default=-1,
        metadata=meta(
            "Optimizer steps to train for; -1: num_train_epochs passes over the prompts.", integer(ge=1, also=(-1,))
        ),
    )
    num_iterations: int = field(
        default=1,
        metadata=meta("Optimizer steps on each generated batch (mu in the GRPO paper).", integer(ge=1)),
    )
    max_grad_norm: float | None = inherited(TrainConfig, "max_grad_norm", 1.0)
    logging_steps: int = inherited(TrainConfig, "logging_steps", 10)
    log_completions: bool = field(
        default=False,
        metadata=meta(
            "Also log the completions table at every logging step (it is always logged when the run evaluates: "
            "eval_strategy, by default num_sample_generations times).",
            FLAG,
        ),
    )
    num_completions_to_print: int | None = field(
        default=8,
        metadata=meta(
            "Rows of each completions table printed to the console (all are logged; unset: all).",
            OrNone(integer(ge=0)),
        ),
    )

    # --- the training forward ----------------------------------------------------------------------
    router_aux_loss_coef: float | None = field(
        default=None,
        metadata=meta(
            "A mixture-of-experts policy: the weight of its routers' load-balancing loss (aux_loss) in the training "
            "loss, as TRL 1.16. None: the model config's own router_aux_loss_coef (0 where it declares none); 0 "
            "turns it off. A value > 0 for a model without routers exits 2.",
            OrNone(number(ge=0)),
        ),
    )
    cast_lm_head_to_fp32: bool = field(
        default=False,
        metadata=meta(
            "Compute the LM head of the policy and the reference in float32 (ScaleRL's recipe, as TRL 1.16): its "
            "weights become float32 and its logits are computed from float32 hidden states outside autocast, for "
            "training, sampling and reference forwards. With tied word embeddings the shared weight becomes float32 "
            "and the embedding's output keeps its dtype (as TRL). Not with a LoRA adapter on lm_head.",
            FLAG,
        ),
    )
    pad_to_multiple_of: int | str | None = field(
        default="auto",
        metadata=meta(
            "Pad the prompts (on the left) and the completions (on the right) of the training, old and reference "
            "forwards to a multiple of this many tokens (TRL), for fewer distinct shapes; the padding is masked, so "
            "the log-probs are the same. auto (TRL's default): 128 on AWS Neuron, which compiles once per shape, "
            "else unset; rlhfkit runs on CPUs and GPUs, so auto is unset (no padding).",
            Checked("an integer >= 1, auto, or unset", _pad_multiple_complaint, example=64),
        ),
    )

    # --- generation --------------------------------------------------------------------------------
    num_generations: int = field(
        default=8,
        metadata=meta(
            "Completions sampled per prompt (the group size G).",
            integer(ge=2, why="group-relative advantages compare completions of the same prompt"),
        ),
    )
    max_prompt_length: int | None = inherited(TrainConfig, "max_prompt_length", 512)
    max_completion_length: int = field(default=256, metadata=meta("Maximum new tokens per completion.", integer(ge=1)))
    temperature: float = inherited(TrainConfig, "temperature", 1.0)
    top_p: float = field(
        default=1.0,
        metadata=meta("Nucleus sampling: keep the smallest set of tokens with this mass.", number(gt=0, le=1)),
    )
    top_k: int = field(default=0, metadata=meta("Sample among the k most likely tokens (0: all).", integer(ge=0)))
    min_p: float | None = field(
        default=None,
        metadata=meta(
            "Drop tokens less likely than min_p x the most likely token's probability (transformers' min_p).",
            OrNone(number(ge=0, le=1, example=0.05)),
        ),
    )
    repetition_penalty: float = field(
        default=1.0,
        metadata=meta(
            "Divide the logits of tokens already in the prompt or completion by this (CTRL's penalty; 1: off). "
            "Sampling only: the log-probs of the loss are the unpenalised model's.",
            number(gt=0),
        ),
    )
    generation_kwargs: dict | str | None = field(
        default=None,
        metadata=meta(
            "Further transformers GenerationConfig fields, as JSON; they override the flags above (top_k, top_p, "
            "min_p, repetition_penalty: with those flags' rules). temperature and max_new_tokens may only repeat "
            "--temperature and --max_completion_length, and do_sample only be true: the loss and the completion "
            "mask read the flags. Options the lean decoding loop does not implement (num_beams, suppress_tokens, "
            "...) send generation to model.generate (said once); stop_strings is refused (use eos_token_id).",
            OrNone(JSON_OBJECT),
        ),
    )
    chat_template_kwargs: dict | str | None = field(
        default=None,
        metadata=meta(
            "Variables of the policy tokenizer's chat template for conversational prompts, as JSON (TRL's flag), "
            'e.g. {"enable_thinking": false} for Qwen3. Not the arguments apply_chat_template sets itself.',
            OrNone(JSON_OBJECT),
        ),
    )
    cache_implementation: str | None = field(
        default=None,
        metadata=meta(
            "KV cache of the sampler (TRL's flag): unset or dynamic, transformers' DynamicCache with eager steps; "
            "static, a StaticCache and a torch.compile'd one-token step (compiled once per batch shape; a few "
            "percent faster generations on a CPU, unmeasured on a GPU: docs/algorithms/grpo.md).",
            OrNone(OneOf(("dynamic", "static"))),
        ),
    )
    num_generations_eval: int | None = field(
        default=None,
        metadata=meta(
            "Evaluation: sample this many completions per eval prompt at the training temperature (TRL). Unset: "
            "one greedy completion per prompt (rlhfkit's default, a deterministic curve).",
            OrNone(integer(ge=1)),
        ),
    )

    # --- GRPO --------------------------------------------------------------------------------------
    beta: float = field(
        default=0.0,
        metadata=meta("KL coefficient to the reference model (k3); 0 loads no reference model.", number(ge=0)),
    )
    # 0 is allowed: with num_iterations=1 every ratio is 1 and the clip never binds.
    epsilon: float = field(
        default=0.2,
        metadata=meta("Lower clip range of the ratio: clip(r, 1 - epsilon, ...).", number(ge=0)),
    )
    epsilon_high: float | None = field(
        default=None,
        metadata=meta(
            "Upper clip range: clip(r, ..., 1 + epsilon_high). Default: epsilon.",
            OrNone(number(ge=0, example=0.28)),
        ),
    )
    loss_type: str = field(
        default="dapo",
        metadata=meta(
            "The per-token loss and its average (docs/algorithms/grpo.md): grpo (token mean per completion, then "
            "over completions), bnpo (over the tokens of the micro-batch), dr_grpo (sum / (completions x "
            "max_completion_length)), dapo (over all tokens of the step, every process), luspo (token sum per "
            "completion, mean over completions), cispo (REINFORCE weighted by the ratio capped at epsilon_high), "
            "sapo (a soft sigmoid gate instead of the clip), vespo (a gamma-shaped weight of the sequence ratio).",
            OneOf(LOSS_TYPES),
        ),
    )
    importance_sampling_level: str = field(
        default="token",
        metadata=meta(
            "token: one ratio per token (GRPO); sequence: one ratio per completion, the exp of its mean token "
            "log-ratio (GSPO).",
            OneOf(IMPORTANCE_SAMPLING_LEVELS),
        ),
    )
    delta: float | None = field(
        default=None,
        metadata=meta(
            "Two-sided clipping: cap the unclipped ratio at delta as well (INTELLECT-2); greater than "
            "1 + epsilon_high. Unset: off.",
            OrNone(number(gt=1, example=4.0)),
        ),
    )
    use_bias_correction_kl: bool = field(
        default=True,
        metadata=meta(
            "Multiply the k3 KL term by the importance ratio, in the loss and in the logged kl (TRL 1.16's default; "
            "false: the plain k3 term of the GRPO paper). Only matters with beta > 0.",
            FLAG,
        ),
    )
    off_policy_mask_threshold: float | None = field(
        default=None,
        metadata=meta(
            "DeepSeek-V3.2's off-policy sequence mask (delta of its eq. 9, as TRL 1.16): a completion with a "
            "negative advantage whose mean per-token log-prob drift, sampler minus current policy, exceeds delta "
            "gets no policy loss (its KL term stays). The sampler's log-probs are the behaviour policy's. Unset: off.",
            OrNone(number(ge=0, example=0.5)),
        ),
    )
    top_entropy_quantile: float = field(
        default=1.0,
        metadata=meta(
            "Policy loss only on the tokens whose entropy is in this top share of the micro-batch's completion "
            "tokens (Wang et al. 2025, 0.2 there); 1: every token.",
            number(gt=0, le=1),
        ),
    )
    entropy_coef: float = field(
        default=0.0,
        metadata=meta(
            "Entropy regularisation: the loss minus entropy_coef x the mean entropy (nats) of the policy over the "
            "tokens the policy loss trains on, the same for every loss_type (docs/algorithms/grpo.md). Positive "
            "rewards exploration, negative sharpens the policy; 0: off. With use_adaptive_entropy, the starting "
            "coefficient.",
            number(),
        ),
    )
    use_adaptive_entropy: bool = field(
        default=False,
        metadata=meta(
            "Move entropy_coef after every optimizer step (Skywork-OR1, arXiv 2505.22312): up by entropy_coef_delta "
            "when the step's mean entropy was at or below entropy_target, down otherwise, within entropy_coef_min "
            "and entropy_coef_max; the bonus applies only in a step that follows one at or below the target.",
            FLAG,
        ),
    )
    entropy_coef_min: float = field(
        default=0.0,
        metadata=meta("use_adaptive_entropy: the smallest coefficient the controller sets.", number(ge=0)),
    )
    entropy_coef_max: float = field(
        default=1.0,
        metadata=meta("use_adaptive_entropy: the largest coefficient the controller sets.", number(ge=0)),
    )
    entropy_coef_delta: float = field(
        default=0.005,
        metadata=meta("use_adaptive_entropy: how far each optimizer step moves the coefficient.", number(ge=0)),
    )
    entropy_target: float = field(
        default=0.2,
        metadata=meta(
            "use_adaptive_entropy: the mean entropy per token (nats, over the tokens the policy loss trains on) "
            "below which the controller raises the coefficient and the bonus applies.",
            number(ge=0),
        ),
    )
    max_tool_calling_iterations: int | None = field(
        default=None,
        metadata=meta(
            "With GRPOTrainer(tools=[...]): rounds of tool results an episode gets at most; unset: no cap (an episode "
            "ends when a turn calls no tool or the completion reaches max_completion_length). docs/agents.md.",
            OrNone(integer(ge=0)),
        ),
    )
    sapo_temperature_pos: float = field(
        default=1.0,
        metadata=meta("loss_type sapo: temperature of the soft gate for positive advantages.", number(gt=0)),
    )
    sapo_temperature_neg: float = field(
        default=1.05,
        metadata=meta("loss_type sapo: temperature of the soft gate for negative advantages.", number(gt=0)),
    )
    vespo_k_pos: float = field(
        default=2.0, metadata=meta("loss_type vespo: shape k of the gamma weight, A >= 0.", number(ge=0))
    )
    vespo_lambda_pos: float = field(
        default=3.0, metadata=meta("loss_type vespo: rate lambda of the gamma weight, A >= 0.", number(ge=0))
    )
    vespo_k_neg: float = field(
        default=3.0, metadata=meta("loss_type vespo: shape k of the gamma weight, A < 0.", number(ge=0))
    )
    vespo_lambda_neg: float = field(
        default=2.0, metadata=meta("loss_type vespo: rate lambda of the gamma weight, A < 0.", number(ge=0))
    )
    sync_ref_model: bool = field(
        default=False,
        metadata=meta(
            "Move the reference towards the policy every ref_model_sync_steps steps (TR-DPO): "
            "ref <- alpha x policy + (1 - alpha) x ref. Needs beta > 0 and no --use_peft.",
            FLAG,
        ),
    )
    ref_model_mixup_alpha: float = field(
        default=0.6, metadata=meta("sync_ref_model: the policy's share alpha.", number(ge=0, le=1))
    )
    ref_model_sync_steps: int = field(
        default=512, metadata=meta("sync_ref_model: optimizer steps between syncs.", integer(ge=1))
    )
    scale_rewards: str = field(
        default="group",
        metadata=meta(
            "Divide group-centred rewards by the std of the group, of the batch, or not at all "
            "(true = group, false = none). No effect with multi_objective_aggregation normalize_then_sum.",
            OneOf(GROUP_SCALES),
        ),
    )
    multi_objective_aggregation: str = field(
        default="sum_then_normalize",
        metadata=meta(
            "How several rewards become one advantage (TRL 1.16): sum_then_normalize, the weighted sum of the "
            "rewards normalised as scale_rewards says; normalize_then_sum (GDPO), each reward normalised by its "
            "group's mean and std, the weighted sum of those normalised by the batch's mean and std (scale_rewards "
            "has no effect).",
            OneOf(MULTI_OBJECTIVE_AGGREGATIONS),
        ),
    )
    mask_truncated_completions: bool = field(
        default=False, metadata=meta("Leave completions that hit max_completion_length out of the loss.", FLAG)
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata=meta(
            "DAPO's dynamic sampling (AReaL's name): leave out the groups whose rewards have no spread (every "
            "advantage 0, no gradient) and generate further batches of prompts until the generation batch is full of "
            "groups with spread, at most max_num_gen_batches rounds (docs/algorithms/grpo.md). Each process keeps "
            "whole groups of its own completions, so per_device_train_batch_size x steps_per_generation must be a "
            "multiple of num_generations.",
            FLAG,
        ),
    )
    max_num_gen_batches: int = field(
        default=10,
        metadata=meta(
            "dynamic_sampling: generation rounds per generation batch at most, the first included (verl's name); "
            "0: no cap. When the cap is reached the batch is completed with zero-spread groups and the run goes on. "
            "10 (DAPO's recipe in verl) keeps filling batches while about 1 group in 10 has spread, and bounds the "
            "cost of a batch at 10 generations when almost none has.",
            integer(ge=0),
        ),
    )

    def _apply_aliases(self) -> None:
        scale = self.scale_rewards
        if isinstance(scale, bool) or str(scale).lower() in ("true", "false"):
            self.scale_rewards = "group" if str(scale).lower() == "true" else "none"
        self.pad_to_multiple_of = _pad_multiple(self.pad_to_multiple_of)
        super()._apply_aliases()

    def _check_combinations(self) -> None:
        super()._check_combinations()
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        if self.generation_kwargs:
            self._check_generation_kwargs()
        if self.importance_sampling_level == "sequence" and self.loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
            note(  # TRL 1.16's advice, in our words
                f"importance_sampling_level=sequence with loss_type={self.loss_type}: this loss sums the tokens' "
                "terms, so each sequence's ratio weighs as many times as it has tokens, not once as GSPO's "
                "per-sequence objective. For GSPO as published use loss_type=grpo."
            )
        owned = sorted(set(self.chat_template_kwargs or {}) & CHAT_TEMPLATE_ARGUMENTS)
        if owned:
            raise ConfigError(
                f"chat_template_kwargs sets {', '.join(owned)}: rlhfkit renders the prompts with apply_chat_template "
                "itself (tokenize=False, add_generation_prompt=True). Pass only the template's own variables, such as "
                '{"enable_thinking": false}.'
            )
        if self.multi_objective_aggregation == "normalize_then_sum" and self.scale_rewards != "group":
            note(
                f"scale_rewards={self.scale_rewards} has no effect with multi_objective_aggregation="
                "normalize_then_sum: each reward is divided by its group's std and their weighted sum by the batch's, "
                "as in TRL."
            )
        if self.steps_per_generation is not None and self.generation_batch_size is not None:
            raise ConfigError(
                f"steps_per_generation ({self.steps_per_generation}) and generation_batch_size "
                f"({self.generation_batch_size}) both set: set one (the other follows from it), as in TRL."
            )
        if self.delta is not None and self.delta <= 1 + self.epsilon_high:
            raise ConfigError(
                f"delta ({self.delta}) must be greater than 1 + epsilon_high ({1 + self.epsilon_high}): it caps the "
                "ratio above the clip range. Try --delta 4 or leave it unset."
            )
        if self.sync_ref_model and self.beta == 0.0:
            raise ConfigError(
                "sync_ref_model needs a reference model to move, but beta is 0, so there is no reference model. Set "
                "--beta > 0, or leave sync_ref_model off."
            )
        if self.use_adaptive_entropy:
            self._check_adaptive_entropy()
        if self.dynamic_sampling and self.max_num_gen_batches == 1:
            raise ConfigError(
                "max_num_gen_batches=1 with dynamic_sampling: one generation round per batch leaves no room for the "
                "extra rounds that replace the dropped groups, so dynamic sampling would change nothing. It must be "
                "0 (no cap) or >= 2: e.g. --max_num_gen_batches 10, or leave dynamic_sampling off."
            )
        if self.async_generation:
            self._check_async_generation()
        # The launcher's process count (accelerate launch sets WORLD_SIZE); the trainer checks again with its own.
        grpo_generation_shape(self, int(os.environ.get("WORLD_SIZE", "1")))

    def _check_generation_kwargs(self) -> None:
        """generation_kwargs may set what the sampler alone reads; what the loss or the completion mask also reads
        (the temperature of the log-probs, the length of a completion, sampling itself) only as the flags say."""
        kwargs = self.generation_kwargs
        if "do_sample" in kwargs and kwargs["do_sample"] is not True:
            raise ConfigError(
                f"generation_kwargs do_sample={kwargs['do_sample']!r}: GRPO compares num_generations sampled "
                "completions of each prompt, and greedy decoding makes them all the same (every advantage 0). Leave "
                "do_sample out (rlhfkit always samples) or set it to true."
            )
        for key, flag, reads in (
            ("temperature", "temperature", "the loss's log-probs are softmax(logits / --temperature)"),
            ("max_new_tokens", "max_completion_length", "the completion mask, mask_truncated_completions and "
             "dr_grpo's normaliser read --max_completion_length"),
        ):  # fmt: skip
            if key in kwargs and kwargs[key] != getattr(self, flag):
                raise ConfigError(
                    f"generation_kwargs {key}={kwargs[key]!r} differs from --{flag} {getattr(self, flag)!r}: {reads}, "
                    f"so the sampler must use the same value. Pass --{flag} {kwargs[key]!r} and leave {key} out of "
                    "generation_kwargs."
                )
        for key in SAMPLING_FLAG_KEYS:
            problem = field_rule(GRPOConfig.__dataclass_fields__[key]).problem(kwargs[key]) if key in kwargs else None
            if problem:
                raise ConfigError(f"generation_kwargs {key}={kwargs[key]!r}: {problem} (the rule of --{key}).")
        if kwargs.get("num_return_sequences") not in (None, 1):
            raise ConfigError(
                f"generation_kwargs num_return_sequences={kwargs['num_return_sequences']!r}: rlhfkit samples one "
                "completion per prompt row and repeats each prompt num_generations times; set --num_generations."
            )
        if kwargs.get("stop_strings"):
            raise ConfigError(
                "generation_kwargs stop_strings: completions end at token ids (the tokenizer's and the generation "
                "config's EOS ids), and model.generate needs a tokenizer for stop strings, which it is not given (nor "
                "in TRL). Put the ids of the stop tokens in generation_kwargs eos_token_id instead."
            )
        from rlhfkit.sampling.settings import generation_config_fields  # transformers: only when it is needed

        unknown = sorted(set(kwargs) - generation_config_fields())
        if unknown:
            raise ConfigError(
                f"generation_kwargs: {', '.join(map(repr, unknown))} is not a field of transformers' "
                "GenerationConfig. Check the spelling (see transformers' GenerationConfig documentation)."
            )

    def _check_async_generation(self) -> None:
        """async_generation bounds staleness by handing the worker one generation per optimizer step, so each step
        must take exactly one generation; and the worker samples with a whole, plain copy of the policy."""
        per_generation, _ = grpo_generation_shape(self, int(os.environ.get("WORLD_SIZE", "1")))
        steps = per_generation * self.num_iterations
        if steps != self.gradient_accumulation_steps:
            raise ConfigError(
                f"async_generation needs one generation per optimizer step: steps_per_generation "
                f"({per_generation}) x num_iterations "
                f"({self.num_iterations}) = {steps} micro-batches per generation, but gradient_accumulation_steps is "
                f"{self.gradient_accumulation_steps}. Leave steps_per_generation and generation_batch_size unset "
                "with num_iterations 1, or leave async_generation off."
            )
        if self.dynamic_sampling:
            raise ConfigError(
                "async_generation with dynamic_sampling is not supported yet: dynamic sampling draws a varying number "
                "of generation rounds per step, which the asynchronous schedule does not bound. Use one of the two."
            )

    def _check_adaptive_entropy(self) -> None:
        """use_adaptive_entropy: the controller keeps the coefficient in [entropy_coef_min, entropy_coef_max], so the
        range must exist and hold the starting value entropy_coef."""
        low, high = self.entropy_coef_min, self.entropy_coef_max
        if low > high:
            raise ConfigError(
                f"entropy_coef_min ({low}) is greater than entropy_coef_max ({high}): use_adaptive_entropy keeps "
                "the coefficient between them, so entropy_coef_min must be <= entropy_coef_max. Swap them, or pass "
                f"e.g. --entropy_coef_min 0 --entropy_coef_max {max(high, low)}."
            )
        if not low <= self.entropy_coef <= high:
            raise ConfigError(
                f"entropy_coef ({self.entropy_coef}) is outside [entropy_coef_min, entropy_coef_max] = [{low}, "
                f"{high}]: with use_adaptive_entropy it is the coefficient the controller starts from and keeps in "
                f"that range. Pass --entropy_coef {min(max(self.entropy_coef, low), high)}, or widen the range."
            )


def _pad_multiple(value):
    """pad_to_multiple_of as TRL's GRPOConfig reads it: the command line's text as a number or none, and "auto" as
    TRL resolves it off AWS Neuron (rlhfkit runs on CPUs and GPUs): unset."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("none", "null", "auto"):
            return None
        if text.isdigit():
            return int(text)
    return value


@config_dataclass
class GRPOArguments(GRPOConfig, GRPOScriptArguments, ModelConfig):
    """Every flag of ``rlhfkit grpo`` in one dataclass: GRPOConfig's training arguments with TRL's
    GRPOScriptArguments and ModelConfig groups (config/script.py). ``GRPOConfig(model_name_or_path=...)`` builds one;
    a trainer given a plain GRPOConfig (a TRL script's) completes it with the groups' defaults."""

    def _apply_aliases(self) -> None:
        if self.reward_model_name_or_path:
            self.reward_model_path = [*(self.reward_model_path or []), self.reward_model_name_or_path]
            self.reward_model_name_or_path = None  # moved: a config built again from to_dict() must not add it twice
        super()._apply_aliases()

    REWARD_ORDER = "reward_model_path, then reward_funcs (as trl grpo)"

    def weighted_rewards(self) -> list[str] | None:
        """`trl grpo`'s order (trl/scripts/grpo.py): the reward models first, then the functions."""
        if not self.reward_funcs:
            return None
        return [*(self.reward_model_path or []), *self.reward_funcs]

    def apply_model_init_kwargs(self) -> None:
        """Move model_init_kwargs into the fields that load the model (TRL's scripts set it after the config is
        built, so the trainer calls this too); an argument rlhfkit's loaders do not take is refused."""
        kwargs = dict(self.model_init_kwargs or {})
        if "torch_dtype" in kwargs:
            kwargs.setdefault("dtype", kwargs.pop("torch_dtype"))
        unknown = sorted(set(kwargs) - set(MODEL_INIT_FIELDS))
        if unknown:
            raise ConfigError(
                f"model_init_kwargs={self.model_init_kwargs!r}: rlhfkit loads models with the fields "
                f"{', '.join(MODEL_INIT_FIELDS.values())}, so it takes {', '.join(MODEL_INIT_FIELDS)} here, not "
                f"{', '.join(unknown)}. Set those in the checkpoint's config.json, or leave them out."
            )
        for key, value in kwargs.items():
            if value is not None:
                setattr(self, MODEL_INIT_FIELDS[key], value)
        self.model_init_kwargs = None
        check_fields(self)

    def _check_combinations(self) -> None:
        super()._check_combinations()
        if self.model_init_kwargs:
            self.apply_model_init_kwargs()
        check_adapter_merge(self)
        if self.cast_lm_head_to_fp32 and self.use_peft and "lm_head" in (self.lora_target_modules or ()):
            raise ConfigError(
                "cast_lm_head_to_fp32 with lm_head in lora_target_modules: the adapter's output would not be float32 "
                "(TRL refuses it too). Leave lm_head out of lora_target_modules (lora_modules_to_save may train it in "
                "full), or leave cast_lm_head_to_fp32 off."
            )
        if self.sync_ref_model and self.use_peft:
            raise ConfigError(
                "sync_ref_model needs a reference model to move, but with --use_peft the reference is the policy with "
                "its adapter disabled, not a model of its own. Leave --use_peft out, or leave sync_ref_model off."
            )
        check_async_adapter(self)


GRPOConfig.full_arguments = GRPOArguments
