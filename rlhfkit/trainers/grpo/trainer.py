"""GRPO for language models: group-relative advantages from reward functions and reward models, no value model.

Variant: GRPO as in DeepSeekMath (Shao et al., 2024, section 4.1, outcome supervision) with the options TRL's
``GRPOTrainer`` exposes under the same names:

* each prompt gets ``num_generations`` (G) completions; every reward source (function or model) scores each one,
  and R_i = sum_k w_k r_ik (``reward_weights``; a source returning None is left out for that completion);
* the advantage of completion i is R_i minus its group's mean, divided by the group std (``scale_rewards=group``),
  the batch std (``batch``) or nothing (``none``, Dr. GRPO), and shared by all of i's tokens;
* per-token loss -min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A) + beta * KL_k3(policy || reference),
  r = exp(logp - logp_old), one ratio per token or per completion (``importance_sampling_level``, GSPO); TRL 1.16's
  ``loss_type`` chooses the loss and how it is averaged: grpo, bnpo, dr_grpo, dapo, luspo, or the variants that
  replace the clip, cispo, sapo and vespo (docs/algorithms/grpo.md);
* one generation holds ``per_device_train_batch_size x steps_per_generation`` completions per process (TRL's
  ``generation_batch_size``, all processes), split in order into ``steps_per_generation`` micro-batches and served
  ``num_iterations`` times; an optimizer step accumulates ``gradient_accumulation_steps`` micro-batches, so a
  generation may serve several steps (logp_old saved at generation then) or a step draw on several generations;
* ``mask_truncated_completions`` leaves completions without a terminator out of the loss (DAPO);
* ``off_policy_mask_threshold`` (DeepSeek-V3.2's off-policy sequence mask): a completion with a negative advantage
  whose mean per-token drift log pi_behaviour - log pi (the sampler's log-probs against the current policy's) exceeds
  the threshold gets no policy term; its KL term stays (ops.off_policy_sequence_mask);
* ``multi_objective_aggregation``: the weighted sum of the rewards normalised as above (``sum_then_normalize``), or
  each reward normalised in its group and their weighted sum normalised over the batch (``normalize_then_sum``,
  GDPO; ops.decoupled_group_advantages);
* ``cast_lm_head_to_fp32``: the LM head's weights and logits in float32 (models.cast_lm_head_to_fp32);
  ``pad_to_multiple_of`` pads the prompts and completions of the training forwards to a multiple of tokens;
* ``dynamic_sampling`` (DAPO): groups whose rewards have no spread are dropped and further batches of prompts are
  generated until the generation batch is full of groups with spread, at most ``max_num_gen_batches`` rounds, after
  which zero-spread groups fill it (ops.select_groups; each process keeps whole groups it generated). Advantages and
  the completions table are the kept batch's; completions/*, rewards/* and frac_reward_zero_std describe every
  completion generated;
* entropy regularisation (``entropy_coef``): the loss minus coef x the mean policy entropy over the tokens the policy
  term trains on, divided by gradient_accumulation_steps; ``use_adaptive_entropy`` moves coef by
  ``entropy_coef_delta`` after each optimizer step towards ``entropy_target`` and applies it only after a step whose
  entropy was at or below the target (Skywork-OR1; ops/entropy.py, docs/algorithms/grpo.md);
* learning rate decays linearly to 0 over the steps (--lr_scheduler_type: transformers' schedules, stepped once per
  optimizer step as TRL does).

Deliberate differences from TRL (docs/algorithms/grpo.md gives the details):
* metrics pool sums and counts over micro-batches, steps of the logging window and processes before dividing;
* the generation batch is split into micro-batches in order (TRL shuffles it first): only bnpo's per-micro-batch
  token mean depends on the split (docs/algorithms/grpo.md).

Asynchronous generation (--async_generation): the off-policy variant of TRL 1.16's asynchronous GRPO. A worker process
samples each generation with a copy of the policy up to ``max_staleness`` optimizer steps older than the weights it
trains; the ratio r stays relative to logp_old (the trainer's log-probs), and a stale batch's per-token loss is
multiplied by the truncated or masked importance weight pi_old / pi_behaviour (``vllm_importance_sampling_*``;
trainers/generation_worker.py, trainers/offpolicy.py, docs/async.md). ``max_staleness 0`` is the synchronous algorithm
exactly.

LoRA (--use_peft): the policy trains an adapter; the reference (beta > 0) is the policy with its adapter disabled, not
a copy (GRPOGeneration.reference_logprobs).

The loop's phases are numbered as docs/algorithms/grpo.md numbers the steps; steps 1-4 (a generation) live in
generation.py.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from fractions import Fraction

import torch
from accelerate.utils import gather_object
from datasets import Dataset, IterableDataset
from torch import nn
from transformers import PreTrainedTokenizerBase
from transformers.trainer_utils import TrainOutput

from rlhfkit import ops
from rlhfkit.agents import ToolBox
from rlhfkit.agents.environments import Environments
from rlhfkit.agents.episodes import (
    CustomRollout,
    ToolEpisodes,
    check_agent_arguments,
    environment_prompts,
    tool_episodes,
    tool_metrics,
    with_environment_prompts,
)
from rlhfkit.checkpoint import REF_MODEL_DIR, load_weights
from rlhfkit.config import GRPOConfig, grpo_batch_sizes
from rlhfkit.data import endless_batches, prompt_text
from rlhfkit.errors import ConfigError
from rlhfkit.metrics import registry as M
from rlhfkit.metrics.accumulate import MetricAccumulator
from rlhfkit.models import (
    LORA_FLAGS,
    Hub,
    cast_lm_head_to_fp32,
    completion_token_stats,
    disable_dropout,
    frozen_copy,
    load_tokenizer,
    load_trained_policy,
    weight_dtype,
    with_lora,
)
from rlhfkit.ops.losses import CLIPPED_LOSS_TYPES, STEP_NORMALISED_LOSS_TYPES, GRPOLossOutput
from rlhfkit.rewards import RewardSources, reward_sources
from rlhfkit.sampling import decode, sampling_config, terminator_ids
from rlhfkit.trainers.api import TRLTrainerAPI, trl_constructor_arguments
from rlhfkit.trainers.datasets import take_streamed, tokenize_datasets
from rlhfkit.trainers.evaluation import count_task_success, eval_chunks
from rlhfkit.trainers.generation_worker import AsyncGeneration, generating, start_generation_worker
from rlhfkit.trainers.grpo.generation import GRPOBatch, GRPOGeneration, MicroBatch
from rlhfkit.trainers.grpo.loss import GRPOLoss
from rlhfkit.trainers.offpolicy import log_sampling_mismatch, off_policy_weights
from rlhfkit.trainers.run import TrainingRun
from rlhfkit.trainers.sampler import Sampler
from rlhfkit.trainers.schedule import epoch_end_steps
from rlhfkit.trainers.scoring import score_chunk, take_reward_logs


class GRPOTrainer(TRLTrainerAPI):
    """GRPO trainer; see the module docstring for the exact variant. ``train()`` runs the whole loop.

    model: a causal LM or the hub id or local path of one. reward_funcs: one or a list of callables
    ``f(prompts, completions, **columns) -> list[float | None]``, reward-model paths, or sequence-classification
    models. processing_class: the policy's tokenizer (default: loaded from the model's path).
    reward_processing_classes: tokenizers of reward models given as modules (default: from their paths).
    task: a built-in ``Task`` whose checker measures true success (rollout/ and eval/task_success). The other
    arguments and the methods are TRL 1.16's (api.py: callbacks, state, save_model, evaluate, log, ...; peft_config
    is a LoRA config, which sets --use_peft and the lora_* fields; quantization_config a BitsAndBytesConfig).
    tools: TRL 1.16's tools, typed functions with Google-style docstrings (sync or async) the policy may call in
    multi-turn episodes, up to max_tool_calling_iterations rounds of results (agents/episodes.py, docs/agents.md); kept as
    ``trainer.tools``. environment_factory: TRL 1.16's environments, a class (or a dict name -> class routing rows by
    their ``environment`` column) built once per episode, whose public methods are the episode's tools, ``reset``
    begins it and an optional ``get_reward`` scores it (agents/environments.py); with one, train_dataset may be
    omitted (max_steps > 0: reset writes the prompts). rollout_func: TRL 1.16's ``rollout_func(prompts, trainer) ->
    dict`` sampling the completions instead of the trainer (episodes.custom_rollout).
    """

    def __init__(
        self,
        model: str | nn.Module,
        reward_funcs: Callable | str | nn.Module | Sequence[Callable | str | nn.Module] | None = None,
        args: GRPOConfig | None = None,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset: Dataset | Mapping[str, Dataset] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        reward_processing_classes: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase | None] | None = None,
        callbacks: Sequence | None = None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools: Sequence[Callable] | None = None,
        rollout_func: Callable | None = None,
        environment_factory=None,
        task=None,
    ):
        args = trl_constructor_arguments(args or GRPOConfig(), peft_config, quantization_config, optimizers)
        self.args = args  # a GRPOArguments: a TRL script's GRPOConfig gets the script and model groups' defaults
        if args.model_init_kwargs:  # TRL's script sets them after building the config
            args.apply_model_init_kwargs()
        # 1. Agents: tool schemas and environments checked before anything loads (each environment built once, as a
        #    probe); an environment that writes the prompts stands in for a train_dataset.
        environments = None if environment_factory is None else Environments(environment_factory, tools or [])
        toolbox = environments.toolbox if environments else ToolBox(tools) if tools else None
        check_agent_arguments("GRPOTrainer", args, toolbox, rollout_func, environment_factory)
        self.eval_dataset = eval_dataset  # as given (transformers' attribute); eval_prompts: tokenized, below
        if train_dataset is None:
            train_dataset = environment_prompts(args, environments)
        elif environments is not None:  # rows without a prompt: reset() writes it into an empty user message
            train_dataset = with_environment_prompts(train_dataset, args.dataset_text_field)
            eval_dataset = with_environment_prompts(eval_dataset, args.dataset_text_field)
        reward_funcs = given_reward_funcs(reward_funcs, environments)
        # 2. The run: output_dir, trackers, checkpoint to resume (read, nothing written yet); async_generation's worker
        #    starts now and imports while the models load (it gets the policy at the end).
        self.run = run = TrainingRun(args)
        self.accelerator = run.accelerator
        self.generation_worker: AsyncGeneration | None = (
            start_generation_worker(run, args) if args.async_generation else None
        )
        # 3. The policy (loaded by name, with its LoRA adapter) and its tokenizer.
        hub = Hub(
            revision=args.model_revision,
            trust_remote_code=args.trust_remote_code,
            attn_implementation=args.attn_implementation,
        )
        model, tok = self.load_policy(model, processing_class, hub)
        self.tokenizer, self.task = tok, task
        self.stop_ids = terminator_ids(tok, model)
        model.generation_config.pad_token_id = tok.pad_token_id
        # 4. Rewards: the reward functions and models, then the environments' own; TRL 1.16's attributes for them.
        self.rewards = self.reward_sources(reward_funcs, reward_processing_classes, environments, hub)
        self.reward_funcs, self.reward_func_names = self.rewards.sources, self.rewards.names
        self.reward_weights = torch.tensor(self.rewards.weights, dtype=torch.float32)
        self.reward_processing_classes = self.rewards.processing_classes
        # 5. Data: a streamed train set held as the rows its steps draw; the prompts tokenized (conversations shown
        #    their tools: TRL 1.16's `tools` attribute, empty without them); multi-turn sampling with tools (and
        #    environments) or a rollout_func in place of the plain one.
        self.streamed = isinstance(train_dataset, IterableDataset)
        if self.streamed:
            train_dataset = self.held_stream(train_dataset)
            args.accelerator_config = stream_accelerator_config(args.accelerator_config)
        self.tools = [] if toolbox is None else toolbox.functions
        self.train_dataset, self.eval_prompts = tokenize_datasets(
            args, tok, train_dataset, eval_dataset, self.tools or None
        )
        self.rollout_func = rollout_func
        self.episodes: ToolEpisodes | CustomRollout | None = None
        if toolbox is not None:
            self.episodes = tool_episodes(
                "GRPOTrainer", toolbox, tok, self.train_dataset, args, args.max_completion_length, environments
            )
        elif rollout_func is not None:
            self.episodes = CustomRollout(rollout_func, self, args.dataset_text_field)
        if self.generation_worker is not None and toolbox is not None:  # the worker runs the tools and environments
            self.generation_worker.sample_episodes_with(self.episodes)
        self.sizes = sizes = grpo_batch_sizes(args, run.accelerator.num_processes, len(self.train_dataset))
        # 6. The models prepared for the engine: the policy with its optimizer, the frozen reference (beta > 0, without
        #    LoRA, whose reference is the policy with its adapter disabled).
        if args.disable_dropout:  # logp_old and logp must agree exactly when a batch is reused (num_iterations > 1)
            disable_dropout(model)
        self.ref_model = None
        if args.beta != 0.0 and not args.use_peft:
            self.ref_model = run.prepare_frozen(frozen_copy(model))
        self.router_aux_loss_coef, self.aux_loss_enabled = router_aux_loss(model, args.router_aux_loss_coef)
        self.model, self.optimizer = run.prepare_trained(model, model, (model,))
        if args.cast_lm_head_to_fp32:
            self.cast_lm_heads()
        # 7. Steps 1-4, prompts to the batch the loss trains on; step 5's loss, its settings bound once; the entropy
        #    coefficient (TRL's attribute, moved by the adaptive controller) and the last step's mean entropy (inf
        #    before the first: the adaptive bonus waits for a measurement), both part of a checkpoint (state_dict).
        sampler = Sampler(self.sampling_config, self.episodes, self.generation_worker)
        self.generation = GRPOGeneration(
            args, sizes, run, self.model, self.ref_model, self.rewards, sampler, tok, self.train_dataset, task
        )
        self.loss = GRPOLoss.from_config(args)
        self.entropy_coef = args.entropy_coef
        self.last_window_entropy = float("inf")
        # 8. The run takes its trainer: the steps, the epochs' ends, the metrics this run adds, the callbacks.
        extra_metrics = [m for pair in self.rewards.metrics for m in pair] + tool_metrics(toolbox)
        self.eval_tool_metrics = tool_metrics(toolbox, evaluation=True)  # an evaluation's eval/tools/{tool}/...
        steps_per_generation = Fraction(sizes.micro_steps_per_generation, args.gradient_accumulation_steps)
        epoch_ends = epoch_end_steps(sizes.num_steps, len(self.train_dataset), sizes.prompts, steps_per_generation)
        run.start(self, sizes.num_steps, extra_metrics, epoch_ends=epoch_ends, callbacks=callbacks, loss=M.LOSS)

    def load_policy(
        self, model: str | nn.Module, processing_class, hub: Hub
    ) -> tuple[nn.Module, PreTrainedTokenizerBase]:
        """The policy (loaded by hub id or path, quantised and with its LM head in float32 as the flags say; with
        --use_peft, with its LoRA adapter) and its tokenizer (processing_class, else loaded from the model's path)."""
        args = self.args
        if isinstance(model, str):
            model = load_trained_policy(
                model,
                "model_name_or_path",
                hub,
                dtype=args.dtype,
                quantization=args.quantization(),
                lm_head_fp32=args.cast_lm_head_to_fp32,
            )
        if args.use_peft:  # LoRA: only the adapter trains; the reference is the model with it disabled
            lora = {flag: getattr(args, flag) for flag in LORA_FLAGS.values()}
            model = with_lora(model, lora, disable_dropout=args.disable_dropout, revision=args.model_revision)
        tok = processing_class or load_tokenizer(model.config._name_or_path, "model_name_or_path", hub)
        return model, tok

    def reward_sources(self, reward_funcs: list, processing_classes, environments, hub: Hub) -> RewardSources:
        """The reward functions and reward models of reward_funcs (reward models read with their own tokenizers,
        processing_classes), then each environment's get_reward, weighing 1 as in TRL; prepared for the engine."""
        args, acc = self.args, self.accelerator
        names, funcs = [], []
        if reward_funcs:
            dtype = weight_dtype(args.dtype)
            names, funcs = reward_sources(reward_funcs, processing_classes, self.tokenizer, dtype, acc.device, hub)
        weights = args.reward_weights
        environment_rewards = environments.reward_functions() if environments else []
        if environment_rewards:
            weights = None if weights is None else [*weights, *[1.0] * len(environment_rewards)]
            names, funcs = names + [f.__name__ for f in environment_rewards], funcs + environment_rewards
        rewards = RewardSources(names, funcs, weights, args.dataset_text_field)
        rewards.prepare_models(self.run.prepare_frozen)  # sharded for ZeRO-3 / FSDP as the policy is
        return rewards

    def held_stream(self, train_dataset: IterableDataset) -> Dataset:
        """TRL's streamed train set: the rows max_steps steps draw, in the stream's order, held in memory."""
        args = self.args
        if args.max_steps <= 0:
            raise ConfigError(
                f"train_dataset is a streamed IterableDataset, whose length is unknown, and max_steps is "
                f"{args.max_steps}: set max_steps (e.g. --max_steps 500), as TRL requires."
            )
        sizes = grpo_batch_sizes(args, self.accelerator.num_processes, 0)
        generations = math.ceil(args.max_steps * args.gradient_accumulation_steps / sizes.micro_steps_per_generation)
        return take_streamed(train_dataset, generations * sizes.prompts)

    # What the run lifecycle needs from its trainer (run.Trainee): models, own state, evaluation.
    def write_models(self, directory: str, state_dict: dict | None = None) -> None:
        """The policy and its tokenizer; with sync_ref_model also the reference, which then changes (ref_model/).
        state_dict: the policy's full weights gathered from a sharding engine (TrainingRun), else None."""
        self.policy.save_pretrained(directory, state_dict=state_dict)
        self.tokenizer.save_pretrained(directory)
        if self.args.sync_ref_model:
            self.ref_model.save_pretrained(os.path.join(directory, REF_MODEL_DIR))

    def load_models(self, directory, trained: bool = True) -> None:
        """The policy (unless `trained` is False: the engine restored it) and a synced reference of a checkpoint."""
        if trained:
            load_weights(self.policy, directory)
        if self.args.sync_ref_model:
            load_weights(self.ref_model, os.path.join(directory, REF_MODEL_DIR))

    def state_dict(self) -> dict:
        """A generation that still has micro-batches to serve is part of the state, and so is the adaptive entropy
        controller's (its coefficient and the last step's entropy)."""
        micro_steps = self.run.progress.step * self.args.gradient_accumulation_steps
        batch = self.generation.batch
        unfinished = batch is not None and micro_steps % self.sizes.micro_steps_per_generation != 0
        state = {"batch": asdict(batch) if unfinished else None}
        if self.args.use_adaptive_entropy:
            state["entropy_control"] = {
                "entropy_coef": self.entropy_coef,
                "last_window_entropy": self.last_window_entropy,
            }
        environments = self.environments
        if environments is not None:  # every process's pools, in process order (a collective)
            state["environments"] = gather_object([environments.state_dict()])
        return state

    @property
    def environments(self) -> Environments | None:
        """The environment_factory's pools, if the run has one."""
        return getattr(self.episodes, "environments", None)

    def load_state_dict(self, state: dict) -> None:
        if state.get("batch") is not None:
            # Checkpoints written before the batch's fields took the prompt / completion names keep the older ones.
            older = {"query_width": "prompt_width", "response_ids": "completion_ids"}
            self.generation.batch = GRPOBatch(**{older.get(k, k): v for k, v in state["batch"].items()})
        if self.environments is not None and state.get("environments") is not None:
            self.environments.load_state_dict(state["environments"][self.accelerator.process_index])
        control = state.get("entropy_control")
        if self.args.use_adaptive_entropy and control is not None:  # else the controller starts from the config
            self.entropy_coef = float(control["entropy_coef"])
            self.last_window_entropy = float(control["last_window_entropy"])

    def cast_lm_heads(self) -> None:
        """cast_lm_head_to_fp32 for a policy given as a model object (one loaded by name was cast as it loaded,
        models.load_trained_policy) and its reference. The models are already prepared: a head whose weights are not
        float32 yet can only change dtype where no engine or process group holds them."""
        reference = None if self.ref_model is None else self.accelerator.unwrap_model(self.ref_model)
        for model in (self.policy, reference):
            head = None if model is None else model.get_output_embeddings()
            if head is None or getattr(head, "_rlhfkit_fp32_logits", False):
                continue
            if head.weight.dtype != torch.float32 and (self.accelerator.num_processes > 1 or self.run.engine.sharded):
                raise ConfigError(
                    f"cast_lm_head_to_fp32 with a model object whose LM head is {head.weight.dtype}, under "
                    f"{self.accelerator.num_processes} processes ({self.run.engine}): its weights must become float32 "
                    "before the engine wraps them. Pass the model by name (the trainer casts it as it loads), or "
                    "call rlhfkit.models.cast_lm_head_to_fp32(model) before building the trainer."
                )
            cast_lm_head_to_fp32(model)

    @property
    def entropy_bonus_enabled(self) -> bool:
        """Whether the loss has an entropy term: a nonzero entropy_coef, or the adaptive controller (whose
        coefficient may sit at 0 for a while and rise again)."""
        return self.args.entropy_coef != 0.0 or self.args.use_adaptive_entropy

    @property
    def policy(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.model)

    # ------------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: bool | str | None = None) -> TrainOutput:
        """Train to the end (or a callback's stop); returns transformers' TrainOutput(global_step, training_loss,
        metrics), training_loss the mean of the logged loss over the optimizer steps of this call (api.py)."""
        run = self.run
        run.begin(resume_from_checkpoint)  # restores the checkpoint being resumed; opens the run directory
        args, sizes, progress = self.args, self.sizes, run.progress
        if self.generation_worker is not None:  # the policy's weights as training starts (a resumed run's too)
            with run.gathered(self.model) as policy:
                config = self.sampling_config(args.max_completion_length)
                self.generation_worker.load(policy, config, progress.step)
        # Every process draws the same prompts (the whole generation batch) and keeps its slice of the completions.
        prompts = endless_batches(
            len(self.train_dataset),
            sizes.prompts,
            args.seed,
            skip=progress.generations,
            shuffle=args.shuffle_dataset and not self.streamed,  # a stream's rows in its order, as TRL reads them
        )
        # The generation worker (async_generation) ends with the training, however it ends.
        with generating(self.generation_worker):
            self.training_loop(prompts)
        return self.run.train_output

    def training_loop(self, prompts: Iterator[list[int]]) -> None:
        run = self.run
        for step in run.steps():
            # 1-4. This step's micro-batches; a new generation whenever the last one has served its
            #      steps_per_generation x num_iterations micro-batches: G completions per prompt (async_generation: the
            #      worker's next generation), rewards, advantages, old and reference log-probs (generation.py).
            with run.phase("rollout"):
                micro_batches = self.generation.micro_batches(step, prompts)

            # 5-6. Loss and optimizer step over the gradient_accumulation_steps micro-batches (then the adaptive
            #      entropy controller's step and, with sync_ref_model, the reference's).
            with run.phase("optimization"):
                self.optimize(step, micro_batches)

            # 7. The completions table on evaluation steps (and logging steps with log_completions).
            self.log_completions(step)

            # 8. Log the window, health checks, evaluation and checkpoints on schedule; stop early if asked.
            run.end_step(step, self.last_scalars())

    def last_scalars(self) -> dict[str, float]:
        """What a row ending at this step logs as it stands now: the token count, learning rate and epoch (G
        completions per prompt)."""
        args, run, progress = self.args, self.run, self.run.progress
        epoch = progress.episode / (args.num_generations * len(self.train_dataset))
        return {M.NUM_TOKENS.name: progress.num_tokens, M.LEARNING_RATE.name: run.lr, M.EPOCH.name: epoch}

    # ------------------------------------------------------------------------------------------------
    def sampling_config(self, max_new_tokens: int):
        """The training sampler's GenerationConfig: temperature, top_k / top_p / min_p, repetition_penalty and
        generation_kwargs."""
        args, tok = self.args, self.tokenizer
        return sampling_config(
            max_new_tokens,
            args.temperature,
            tok.pad_token_id,
            self.stop_ids,
            args.top_p,
            args.top_k,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            generation_kwargs={"cache_implementation": args.cache_implementation, **(args.generation_kwargs or {})},
        )

    @torch.no_grad()
    def sync_reference(self) -> None:
        """sync_ref_model (TR-DPO, Gorbatovski et al. 2024): ref <- alpha x policy + (1 - alpha) x ref."""
        alpha = self.args.ref_model_mixup_alpha
        for ref, own in zip(self.ref_model.parameters(), self.policy.parameters(), strict=True):
            ref.mul_(1 - alpha).add_(own.detach().to(ref.dtype), alpha=alpha)

    def optimize(self, step: int, micro_batches: list[MicroBatch]) -> None:
        """Optimizer step `step` over micro-batches given as (generation, index of the micro-batch in it, whether the
        generation was made on the current weights); then the adaptive entropy controller's step and, every
        ref_model_sync_steps steps with sync_ref_model, the reference's."""
        args, run, size = self.args, self.run, self.args.per_device_train_batch_size
        entropy_coef, entropy_sums = None, None  # the entropy term's coefficient this step; None: no entropy term
        if self.entropy_bonus_enabled:  # every micro-batch of the step applies the same coefficient
            entropy_coef = ops.applied_entropy_coef(
                self.entropy_coef, self.last_window_entropy, args.entropy_target, args.use_adaptive_entropy
            )
            if args.use_adaptive_entropy:
                entropy_sums = torch.zeros(2, dtype=torch.float64, device=self.accelerator.device)
        step_loss = 0.0
        for k, (batch, index, fresh) in enumerate(micro_batches):
            with run.accumulating(self.model, last=k == len(micro_batches) - 1):
                idx = slice(index * size, (index + 1) * size)
                step_loss += self.micro_step(batch, idx, fresh, entropy_coef, entropy_sums)
        self.run.optimizer_step(self.model, self.optimizer)
        self.run.add_loss(step_loss)  # the loss metric, and the step's part of train_loss
        if entropy_sums is not None:
            self.adapt_entropy_coef(entropy_sums)
        if entropy_coef is not None:
            self.run.metrics.add(M.ENTROPY_COEF, self.entropy_coef, 1)
        if args.sync_ref_model and step % args.ref_model_sync_steps == 0:
            self.sync_reference()

    def adapt_entropy_coef(self, entropy_sums: torch.Tensor) -> None:
        """The adaptive controller's step (a collective): the step's token-weighted mean entropy over every
        micro-batch and process moves entropy_coef for the next step. A step whose entropy is not finite (NaN
        logits; its update was skipped) leaves the controller as it was."""
        args = self.args
        entropy = ops.window_entropy(self.accelerator.reduce(entropy_sums, "sum"))
        if not math.isfinite(entropy):
            return
        self.entropy_coef = ops.adaptive_entropy_coef(
            self.entropy_coef,
            entropy,
            args.entropy_target,
            args.entropy_coef_delta,
            args.entropy_coef_min,
            args.entropy_coef_max,
        )
        self.last_window_entropy = entropy

    def micro_step(
        self,
        batch: GRPOBatch,
        idx: slice,
        fresh: bool = False,
        entropy_coef: float | None = None,
        entropy_sums: torch.Tensor | None = None,
    ) -> float:
        """Forward, backward and statistics of one micro-batch; returns its (scaled) loss. `fresh`: the batch was
        generated on the current weights, so the training log-probs are compared with the sampler's (sampling/*).
        entropy_coef: the coefficient of the entropy term (None: the loss has none). entropy_sums: the adaptive
        controller's (entropy sum, token count) of the optimizer step, which this micro-batch adds to.
        A method of its own so that its activations are released when it returns, before the next micro-batch's
        forward."""
        args = self.args
        mask = batch.loss_mask[idx]
        self.run.count_training_tokens(batch.attention_mask[idx])  # perf/mfu
        # The entropy term backpropagates through the entropy; without one the entropy is only measured.
        stats = completion_token_stats(
            self.model, batch.input_ids[idx], batch.attention_mask[idx], batch.prompt_width,
            batch.completion_ids[idx], args.temperature, entropy=True, entropy_grad=entropy_coef is not None,
            padding_free=args.padding_free, router_aux=self.aux_loss_enabled,
        )  # fmt: skip
        logprobs, entropy_with_grad = stats.logprobs, stats.entropy
        entropy = entropy_with_grad.detach()
        old = batch.old_logprobs[idx] if batch.old_logprobs is not None else logprobs.detach()
        ref = batch.ref_logprobs[idx] if batch.ref_logprobs is not None else None
        token_mask = None
        if args.top_entropy_quantile < 1.0:  # the policy loss only on the micro-batch's highest-entropy tokens
            token_mask = self.get_high_entropy_mask(entropy, mask, 1.0 - args.top_entropy_quantile)
        policy_mask = token_mask  # the tokens the policy term trains on; the entropy bonus keeps token_mask
        if args.off_policy_mask_threshold is not None:  # DeepSeek-V3.2: drop drifted completions with A < 0
            # The behaviour policy is the sampler's (TRL: vLLM's log-probs where it has them, else logp_old).
            behaviour = batch.sampling_logprobs[idx] if batch.sampling_logprobs is not None else old
            keep = ops.off_policy_sequence_mask(
                logprobs, behaviour, batch.advantages[idx], mask, args.off_policy_mask_threshold
            )[:, None]
            policy_mask = keep if token_mask is None else token_mask & keep
        out = self.loss(logprobs, old, batch.advantages[idx], mask, ref, token_mask=policy_mask)
        per_token_loss = out.per_token_loss
        if self.generation_worker is not None and batch.sampling_logprobs is not None:  # the worker's copy sampled it
            m, sampling_logprobs = self.run.metrics, batch.sampling_logprobs[idx]
            weights = off_policy_weights(m, old.detach(), sampling_logprobs, mask, batch.staleness, args)
            if weights is not None:  # stale: TRL 1.16's importance-sampling correction
                per_token_loss = per_token_loss * weights
        loss = ops.aggregate_token_loss(
            per_token_loss, mask, args.loss_type, args.max_completion_length, batch.num_items
        )
        if args.loss_type not in STEP_NORMALISED_LOSS_TYPES:  # those already divide by the step's tokens
            loss = loss / args.gradient_accumulation_steps
        if entropy_coef is not None:  # mean entropy over the policy term's tokens, per micro-batch of the step
            # The loss without the bonus, TRL's policy_loss: each micro-batch holds 1/G of its step's.
            self.run.metrics.add(M.POLICY_LOSS, loss.detach() * args.gradient_accumulation_steps, 1)
            bonus = ops.entropy_bonus(entropy_with_grad, mask, token_mask) / args.gradient_accumulation_steps
            loss = loss - entropy_coef * bonus
            if entropy_sums is not None:
                entropy_sums += ops.entropy_window_sums(entropy, mask, token_mask)
        if stats.aux_loss is not None:  # a mixture of experts: its routers' load balance, as TRL 1.16 weighs it
            loss = loss + self.router_aux_loss_coef * stats.aux_loss / args.gradient_accumulation_steps
            self.run.metrics.add(M.AUX_LOSS, stats.aux_loss.detach().float(), 1)
        self.accelerator.backward(loss)
        with torch.no_grad():
            self.log_micro_step(out, entropy, mask)
            if fresh and batch.sampling_logprobs is not None:
                log_sampling_mismatch(self.run.metrics, logprobs, batch.sampling_logprobs[idx], mask)
        return loss.item()

    # TRL 1.16's helpers, under its names and shapes (a subclass or a test of TRL's may call them).
    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        """The tokens whose entropy is at least the `threshold`-quantile of the entropies of every process's
        tokens in `mask` (ops.high_entropy_mask; a collective: each process thresholds its own tokens by the pooled
        quantile, as TRL does). (B, T) bool."""
        mask, acc = mask.bool(), self.accelerator
        # -1 pads the shorter processes' tokens: no entropy is negative
        pooled = acc.gather(acc.pad_across_processes(entropies[mask].float(), dim=0, pad_index=-1.0))
        return ops.high_entropy_mask(entropies, mask, threshold, pooled_entropies=pooled[pooled >= 0])

    @staticmethod
    def get_off_policy_mask(
        advantages: torch.Tensor,
        per_token_logps: torch.Tensor,
        sampling_per_token_logps: torch.Tensor,
        mask: torch.Tensor,
        off_policy_threshold: float,
    ) -> torch.Tensor:
        """TRL's off-policy sequence mask (ops.off_policy_sequence_mask) with TRL's shapes: advantages (B,) or (B,
        1), a (B, 1) tensor of mask's dtype, 1 = kept."""
        keep = ops.off_policy_sequence_mask(
            per_token_logps, sampling_per_token_logps, advantages.reshape(-1), mask.bool(), off_policy_threshold
        )
        return keep[:, None].to(mask.dtype)

    def log_micro_step(self, out: GRPOLossOutput, entropy, mask) -> None:
        """Entropy, KL and the clip statistics of one micro-batch (per token; per completion for a sequence-level
        ratio, as TRL counts them)."""
        args, m = self.args, self.run.metrics
        tokens = mask.sum()
        m.add(M.ENTROPY, (entropy * mask).sum(), tokens)
        if args.beta != 0.0:
            m.add(M.KL, out.kl.sum(), tokens)
        if args.loss_type == "cispo":
            m.add(M.CISPO_CLIP_RATIO, out.cispo_clipped.sum(), tokens)
        if args.loss_type == "vespo":
            m.add_tensor(M.VESPO_PHI_SEQ_MEAN, out.phi.double())
        if args.loss_type not in CLIPPED_LOSS_TYPES:
            return
        low, high = out.low_clipped, out.high_clipped
        if args.importance_sampling_level == "sequence":  # one ratio per completion: count completions
            low, high, tokens = low.any(-1), high.any(-1), mask.any(-1).sum()
        m.add(M.CLIP_RATIO_LOW_MEAN, low.sum(), tokens)
        m.add(M.CLIP_RATIO_HIGH_MEAN, high.sum(), tokens)
        m.add(M.CLIP_RATIO_REGION_MEAN, (low | high).sum(), tokens)
        if tokens > 0:
            m.add_extreme(M.CLIP_RATIO_LOW_MIN, low.sum() / tokens)
            m.add_extreme(M.CLIP_RATIO_HIGH_MAX, high.sum() / tokens)

    # ------------------------------------------------------------------------------------------------
    def log_completions(self, step: int) -> None:
        """The latest generation's completions (this process's share) on evaluation steps, and on logging steps with
        log_completions: prompt, completion, rewards, advantage."""
        schedule, batch = self.run.schedule, self.generation.batch
        logged = schedule.is_log_step(step) or step == self.run.num_steps  # the last: the summary row logs it
        if not (schedule.is_eval_step(step) or (self.args.log_completions and logged)):
            return
        columns = ["prompt", "completion", *self.rewards.names, "advantage"]
        rewards = batch.rewards.t().tolist()
        # a conversation as the model read it
        prompts = [prompt_text(p, self.tokenizer, self.args.chat_template_kwargs, self.tools) for p in batch.prompts]
        rows = [
            [p, c, *[None if r != r else r for r in rs], a]
            for p, c, rs, a in zip(prompts, batch.completions, rewards, batch.advantages.tolist())
        ]
        console_rows = self.args.num_completions_to_print
        self.run.logger.log_table(
            "completions",
            columns,
            rows,
            step=step,
            console_rows=console_rows,
            extra_columns=batch.logged_columns,
            extra_before="advantage",  # where TRL puts them
        )

    @torch.inference_mode()
    def evaluation(self, step: int, dataset: Dataset) -> dict[str, float]:
        """Completions of the eval prompts of `dataset` (one greedy each, or num_generations_eval sampled as in
        training; with tools, multi-turn episodes whose tools run, their tools/* metrics not logged): mean total reward
        and, with a task, true success."""
        args, tok = self.args, self.tokenizer
        metrics = MetricAccumulator(self.eval_tool_metrics)  # its own: the training window's keeps accumulating
        max_new, sampled = args.max_completion_length, args.num_generations_eval
        config = (
            self.sampling_config(max_new)
            if sampled
            else sampling_config(max_new, None, tok.pad_token_id, self.stop_ids)
        )
        size, repeat = args.per_device_eval_batch_size, sampled or 1
        scored = []
        for part in eval_chunks(
            self.run, self.model, dataset, config, size, repeat=repeat, episodes=self.episodes, metrics=metrics
        ):
            chunk = part.chunk
            prompts = [r[args.dataset_text_field] for r in part.rows]
            texts = decode(tok, chunk.completion_ids, chunk.completion_mask)
            completions = texts if part.messages is None else part.messages  # with tools: each episode's messages
            outputs = score_chunk(self.rewards, part.rows, prompts, completions, chunk, self.state)
            total = self.rewards.total(outputs, prompts)
            metrics.add_tensor(M.EVAL_REWARD, total[: part.own])
            count_task_success(metrics, M.EVAL_TASK_SUCCESS, self.task, prompts[: part.own], texts[: part.own])
            scored.append((part, total, torch.stack([o.values for o in outputs])))
        self.add_eval_loss(metrics, scored, repeat)
        _, logged = take_reward_logs(self.rewards, self.accelerator, prefix="eval/")
        return {**metrics.reduce(self.accelerator).scalars, **{k: v for k, v in logged.items() if v == v}}

    @torch.inference_mode(False)
    @torch.no_grad()
    def add_eval_loss(self, metrics: MetricAccumulator, scored: list, group: int) -> None:
        """eval/loss (the registry's eval_loss): the training loss's formula on each evaluation batch, `scored` as
        (EvalChunk, total rewards (n,), each source's rewards (K, n)), its completions in groups of `group` per
        prompt (one greedy completion is a group of one: advantage 0). The completions come from the weights
        scoring them, so the ratio is 1; beta > 0 adds the KL to the reference. Weighted by each batch's own
        completions, as transformers averages its evaluation batches' losses. Outside inference mode (no gradients
        all the same): a LoRA reference disables and re-enables the adapter, which sets requires_grad on weights a
        sharding engine gathers, and a tensor made in inference mode refuses that."""
        args, device, generation = self.args, self.accelerator.device, self.generation
        totals = torch.cat([total for _, total, _ in scored]).double()
        per_source = torch.cat([values for _, _, values in scored], dim=1).double()
        advantages = generation.advantages(totals, per_source, group)
        start = 0
        for part, total, _ in scored:
            chunk, rows = part.chunk, slice(start, start + len(total))
            start += len(total)
            ids, mask, width = chunk.input_ids, chunk.attention_mask, chunk.prompt_ids.shape[1]
            logprobs = generation.logprobs(self.model, ids, mask, width, chunk.completion_ids)
            ref = generation.reference_logprobs(self.model, ids, mask, width, chunk.completion_ids)
            loss_mask = generation.loss_mask(chunk)
            out = self.loss(logprobs, logprobs, advantages[rows].float().to(device), loss_mask, ref)
            loss = ops.aggregate_token_loss(
                out.per_token_loss, loss_mask, args.loss_type, args.max_completion_length, loss_mask.sum()
            )
            metrics.add(M.EVAL_LOSS, loss * part.own, part.own)


def router_aux_loss(model: nn.Module, coef: float | None) -> tuple[float, bool]:
    """A mixture-of-experts policy's load-balancing loss, TRL 1.16's rule: (its weight, whether it is trained). The
    weight is `coef` (--router_aux_loss_coef), or the model config's own router_aux_loss_coef when None (0 where it
    has none); a model whose config has no output_router_logits has no routers, and a weight > 0 for it exits 2."""
    config = model.config.get_text_config()
    moe = hasattr(config, "output_router_logits")
    if coef and not moe:
        raise ConfigError(
            f"--router_aux_loss_coef {coef}: {type(model).__name__} is not a mixture of experts (its config has no "
            "output_router_logits), so it has no load-balancing loss to weigh. Leave router_aux_loss_coef unset "
            "(None) or 0."
        )
    weight = float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0) if coef is None else float(coef)
    return weight, moe and weight != 0.0


def stream_accelerator_config(given):
    """accelerator_config as TRL leaves it for a streamed train set: transformers' AcceleratorConfig (from None or a
    dict, with their entries) with dispatch_batches False, TRL's rule, and what rlhfkit does anyway: every process
    reads the stream's rows itself, no batch is dispatched from the main process."""
    from transformers.trainer_pt_utils import AcceleratorConfig

    entries = dict(given or {}) if not isinstance(given, AcceleratorConfig) else asdict(given)
    return AcceleratorConfig(**{**entries, "dispatch_batches": False})


def given_reward_funcs(reward_funcs, environments) -> list:
    """GRPOTrainer's reward_funcs as a list (one source, a list or tuple of them, or None); refused when there are
    none and no environment scores its episodes."""
    reward_funcs = [] if reward_funcs is None else reward_funcs
    reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not reward_funcs and not (environments and environments.reward_classes):
        raise ConfigError(
            "No reward source provided: GRPOTrainer needs reward_funcs (a reward function, a reward model as a path "
            "or module, or a list of them) or an environment_factory whose environments score their episodes (a "
            "get_reward method)."
        )
    return reward_funcs
