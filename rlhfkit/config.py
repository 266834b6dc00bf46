"""Training configurations with TRL's field names, so a TRL command line works unchanged.

``TrainConfig`` holds what every trainer shares (where things go, models and data, optimisation, precision);
``PPOConfig`` and ``GRPOConfig`` add their algorithm's fields with TRL's names, meanings and defaults. Each
field's ``help`` metadata is the ``--help`` text of the CLI. Derived batch sizes are computed by
:func:`ppo_batch_sizes` / :func:`grpo_batch_sizes` with exact division and an error that names the flags.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple

KL_ESTIMATORS = ("k1", "k3")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")


def _help(text: str, **extra: Any) -> dict:
    return {"help": text, **extra}


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field(s) and the fix."""


@dataclass
class TrainConfig:
    """Fields shared by every trainer (names and meanings as TRL's / transformers' TrainingArguments)."""

    # --- where things go -------------------------------------------------------------------------
    output_dir: str | None = field(
        default=None,
        metadata=_help(
            "Run directory: resolved config, metrics.jsonl, samples, checkpoints. Default: runs/<run_name>."
        ),
    )
    exp_name: str = field(default="run", metadata=_help("Experiment name, used in the default run name."))
    run_name: str | None = field(
        default=None, metadata=_help("Run name shown by the trackers. Default: <exp_name>-<seed>-<time>.")
    )
    project: str = field(default="rlhfkit", metadata=_help("Tracker project (Trackio / W&B project name)."))
    report_to: list[str] | None = field(
        default_factory=lambda: ["trackio"],
        metadata=_help("Trackers: trackio, wandb, tensorboard, all or none (several allowed)."),
    )
    logging_dir: str | None = field(
        default=None, metadata=_help("TensorBoard log directory. Default: <output_dir>/runs.")
    )
    logging_steps: int = field(default=1, metadata=_help("Log metrics every this many training steps."))
    save_steps: int = field(
        default=500, metadata=_help("Save a checkpoint every this many training steps (and the model at the end).")
    )
    save_total_limit: int | None = field(
        default=None, metadata=_help("Keep at most this many checkpoints (oldest removed).")
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata=_help("Continue a run exactly from a checkpoint-N directory, or 'latest' in --output_dir."),
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata=_help("Start afresh in an --output_dir that already holds a run (its files are replaced)."),
    )
    max_nonfinite_steps: int = field(
        default=3,
        metadata=_help(
            "Optimizer steps with a NaN/inf loss or gradient are skipped; after this many in a row training stops "
            "with a checkpoint of the last good state."
        ),
    )
    seed: int = field(default=42, metadata=_help("Random seed (sampling, data order, initialisation)."))
    health: str = field(
        default="warn",
        metadata=_help(
            "Health checks on the logged metrics (docs/health.md): off; warn (print, log and record findings in "
            "health.jsonl); stop (also end training with a checkpoint on a critical finding, exit status 3).",
            choices=["off", "warn", "stop"],
        ),
    )
    health_thresholds: str | None = field(
        default=None, metadata=_help("Override health-check thresholds: 'name=value,name=value' (docs/health.md).")
    )

    # --- models and data -------------------------------------------------------------------------
    model_name_or_path: str | None = field(
        default=None,
        metadata=_help("Policy (and tokenizer) path. Without any model flag, the built-in task is used."),
    )
    trust_remote_code: bool = field(
        default=False, metadata=_help("Allow custom model code from the checkpoints. Off unless asked.")
    )
    dataset_name: str | None = field(
        default=None,
        metadata=_help(
            "Prompt dataset: a directory saved with datasets' save_to_disk, or a .json/.jsonl/.csv/.parquet file. "
            "Default: the built-in task's prompts."
        ),
    )
    dataset_train_split: str = field(default="train", metadata=_help("Split used for training."))
    dataset_test_split: str = field(
        default="test", metadata=_help("Split used for sample generations and evaluation.")
    )
    dataset_text_field: str = field(default="prompt", metadata=_help("Column holding the prompt text."))
    max_prompt_length: int | None = field(
        default=None,
        metadata=_help("Prompts longer than this many tokens are dropped or truncated (prompt_overflow)."),
    )
    prompt_overflow: str = field(
        default="drop",
        metadata=_help(
            "What to do with prompts longer than max_prompt_length: drop them, or truncate them (keep the last "
            "max_prompt_length tokens, as TRL does). Either way the count is reported.",
            choices=["drop", "truncate"],
        ),
    )
    task: str | None = field(
        default=None,
        metadata=_help("task.json (or its directory) whose check function measures true success (eval/task_success)."),
    )

    # --- optimisation ------------------------------------------------------------------------------
    learning_rate: float = field(default=3e-6, metadata=_help("Initial learning rate (AdamW), decayed linearly to 0."))
    warmup_steps: int = field(
        default=0, metadata=_help("Steps of linear warm-up from 0 to learning_rate (overrides warmup_ratio).")
    )
    warmup_ratio: float = field(default=0.0, metadata=_help("Share of the steps used for linear warm-up."))
    per_device_train_batch_size: int = field(default=64, metadata=_help("Micro-batch size per device."))
    per_device_eval_batch_size: int = field(
        default=64, metadata=_help("Batch size per device for sample generations.")
    )
    gradient_accumulation_steps: int = field(
        default=1, metadata=_help("Micro-batches accumulated per device into each optimizer step.")
    )
    num_train_epochs: float = field(default=3.0, metadata=_help("Passes over the prompts when no length is set."))
    max_grad_norm: float | None = field(default=None, metadata=_help("Clip the gradient norm to this value."))
    weight_decay: float = field(default=0.0, metadata=_help("AdamW weight decay."))
    adam_epsilon: float = field(default=1e-8, metadata=_help("AdamW epsilon."))
    temperature: float = field(default=0.7, metadata=_help("Sampling temperature (also applied to the log-probs)."))
    num_sample_generations: int = field(
        default=10,
        metadata=_help("How many times during training to log sample completions and evaluate (0: never)."),
    )

    # --- precision ---------------------------------------------------------------------------------
    bf16: bool | None = field(
        default=None,
        metadata=_help("bfloat16 weights. Default: only where the device is fast at it (CUDA with bf16)."),
    )
    fp16: bool = field(default=False, metadata=_help("float16 weights (CUDA only)."))

    def __post_init__(self) -> None:
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        if self.health not in ("off", "warn", "stop"):
            raise ConfigError(f"health={self.health!r}: use off, warn or stop.")
        if self.prompt_overflow not in ("drop", "truncate"):
            raise ConfigError(f"prompt_overflow={self.prompt_overflow!r}: use drop or truncate.")
        if self.warmup_steps < 0 or not 0 <= self.warmup_ratio < 1:
            raise ConfigError(
                f"warmup_steps must be >= 0 and warmup_ratio in [0, 1), got {self.warmup_steps} and {self.warmup_ratio}."
            )
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            raise ConfigError(f"max_prompt_length must be >= 1 when set, got {self.max_prompt_length}.")
        for name in self._positive_fields():
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}.")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0 (the trainers sample), got {self.temperature}.")

    def _positive_fields(self) -> tuple[str, ...]:
        return (
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "per_device_eval_batch_size",
            "max_nonfinite_steps",
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PPOConfig(TrainConfig):
    """Hyper-parameters of :class:`rlhfkit.PPOTrainer` (names and meanings as in TRL's ``PPOConfig``)."""

    exp_name: str = field(default="ppo", metadata=_help("Experiment name, used in the default run name."))
    sft_model_path: str | None = field(
        default=None, metadata=_help("Policy and reference initialisation. Default: model_name_or_path.")
    )
    reward_model_path: str | None = field(
        default=None,
        metadata=_help(
            "Reward model (sequence classification, 1 label); the value model starts from it. "
            "Default: a randomly initialised score head on the SFT model (a smoke test, as TRL's example)."
        ),
    )
    value_model_path: str | None = field(
        default=None, metadata=_help("Value model initialisation. Default: reward_model_path.")
    )

    # --- batch sizes and length of training ------------------------------------------------------
    per_device_train_batch_size: int = field(
        default=64, metadata=_help("Micro-batch size per device for the PPO updates.")
    )
    gradient_accumulation_steps: int = field(
        default=1,
        metadata=_help(
            "Each device collects per_device_train_batch_size x gradient_accumulation_steps rollouts per update."
        ),
    )
    num_mini_batches: int = field(default=1, metadata=_help("Mini-batches (optimizer steps) per PPO epoch."))
    num_ppo_epochs: int = field(default=4, metadata=_help("Passes over each rollout batch."))
    total_episodes: int | None = field(
        default=None, metadata=_help("Total prompts to train on. Default: num_train_epochs x dataset size.")
    )
    local_rollout_forward_batch_size: int = field(
        default=64, metadata=_help("Per-device batch size of generation and scoring forwards.")
    )
    max_grad_norm: float | None = field(
        default=None, metadata=_help("Clip the gradient norm to this value (off by default, as TRL's PPO).")
    )

    # --- generation --------------------------------------------------------------------------------
    response_length: int = field(default=53, metadata=_help("Maximum new tokens per response."))
    stop_token: str | None = field(
        default=None, metadata=_help("'eos': truncate responses after the EOS token.", choices=["eos"])
    )
    stop_token_id: int | None = field(default=None, metadata=_help("Truncate responses after this token id."))
    missing_eos_penalty: float | None = field(
        default=None, metadata=_help("Subtract this from the score of responses without the stop token.")
    )
    non_eos_penalty: bool = field(
        default=False, metadata=_help("Replace the score of responses without the stop token by penalty_reward_value.")
    )
    penalty_reward_value: float = field(default=-1.0, metadata=_help("Score given by non_eos_penalty."))

    # --- PPO ---------------------------------------------------------------------------------------
    kl_coef: float = field(default=0.05, metadata=_help("KL penalty coefficient (initial value when adaptive)."))
    kl_estimator: str = field(
        default="k1",
        metadata=_help("Per-token KL estimator in the reward: k1 (log-ratio) or k3.", choices=list(KL_ESTIMATORS)),
    )
    kl_target: float | None = field(
        default=None, metadata=_help("Adaptive KL: target of objective/kl (off when unset).")
    )
    kl_horizon: int = field(default=10000, metadata=_help("Adaptive KL: horizon in episodes."))
    cliprange: float = field(default=0.2, metadata=_help("Policy ratio clip range."))
    cliprange_value: float = field(default=0.2, metadata=_help("Value clip range."))
    vf_coef: float = field(default=0.1, metadata=_help("Value loss coefficient."))
    gamma: float = field(default=1.0, metadata=_help("Discount factor."))
    lam: float = field(default=0.95, metadata=_help("GAE lambda."))
    whiten_rewards: bool = field(
        default=False, metadata=_help("Whiten the per-token rewards (keeping their mean) before GAE.")
    )

    # --- older TRL API (accepted as aliases) -------------------------------------------------------
    model_name: str | None = field(default=None, metadata=_help("Alias of model_name_or_path (older TRL API)."))
    log_with: str | None = field(default=None, metadata=_help("Alias of report_to (older TRL API)."))
    project_kwargs: dict | None = field(
        default=None, metadata=_help("Older TRL API: {'logging_dir': PATH} sets logging_dir.")
    )

    def __post_init__(self) -> None:
        if self.model_name and not self.model_name_or_path:
            self.model_name_or_path = self.model_name
        if self.log_with:
            self.report_to = [self.log_with]
        if self.project_kwargs and self.project_kwargs.get("logging_dir") and not self.logging_dir:
            self.logging_dir = str(self.project_kwargs["logging_dir"])
        super().__post_init__()
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ConfigError(
                f"kl_estimator={self.kl_estimator!r} is not supported: use one of {', '.join(KL_ESTIMATORS)}."
            )
        if self.stop_token not in (None, "eos"):
            raise ConfigError(
                f"stop_token={self.stop_token!r}: the only named stop token is 'eos'; use stop_token_id for others."
            )
        if self.kl_target is not None and self.kl_target <= 0:
            raise ConfigError(f"kl_target must be > 0 when set, got {self.kl_target}.")

    def _positive_fields(self) -> tuple[str, ...]:
        return (
            *super()._positive_fields(),
            "num_mini_batches",
            "num_ppo_epochs",
            "local_rollout_forward_batch_size",
            "response_length",
        )


@dataclass
class GRPOConfig(TrainConfig):
    """Hyper-parameters of :class:`rlhfkit.GRPOTrainer` (names, meanings and defaults as in TRL's ``GRPOConfig``).

    As in TRL, ``per_device_train_batch_size`` counts completions: 16 with ``num_generations=8`` is 2 prompts.
    """

    exp_name: str = field(default="grpo", metadata=_help("Experiment name, used in the default run name."))
    reward_funcs: list[str] | None = field(
        default=None,
        metadata=_help(
            "Reward functions: names of the task's built-in rewards (e.g. correctness) or 'module:function' "
            "references to f(prompts, completions, **columns) -> list[float | None]. Default: the task's rewards."
        ),
    )
    reward_model_path: list[str] | None = field(
        default=None,
        metadata=_help("Reward models (sequence classification, 1 label, own tokenizer) added to reward_funcs."),
    )
    reward_weights: list[float] | None = field(
        default=None, metadata=_help("Weight of each reward (reward_funcs, then reward models). Default: all 1.")
    )

    # --- batch sizes and length of training ------------------------------------------------------
    learning_rate: float = field(default=1e-6, metadata=_help("Initial learning rate (AdamW), decayed linearly to 0."))
    per_device_train_batch_size: int = field(
        default=8,
        metadata=_help("Completions per device per micro-batch; a multiple of num_generations (whole groups)."),
    )
    max_steps: int = field(
        default=-1, metadata=_help("Optimizer steps to train for; -1: num_train_epochs passes over the prompts.")
    )
    num_iterations: int = field(
        default=1, metadata=_help("Optimizer steps on each generated batch (mu in the GRPO paper).")
    )
    max_grad_norm: float | None = field(default=1.0, metadata=_help("Clip the gradient norm to this value."))
    logging_steps: int = field(default=10, metadata=_help("Log metrics every this many optimizer steps."))
    log_completions: bool = field(
        default=False,
        metadata=_help(
            "Also log the completions table at every logging step (it is always logged num_sample_generations times)."
        ),
    )
    num_completions_to_print: int | None = field(
        default=8, metadata=_help("Rows of each completions table printed to the console (all are logged).")
    )

    # --- generation --------------------------------------------------------------------------------
    num_generations: int = field(default=8, metadata=_help("Completions sampled per prompt (the group size G)."))
    max_prompt_length: int | None = field(default=512, metadata=_help("Drop prompts longer than this many tokens."))
    max_completion_length: int = field(default=256, metadata=_help("Maximum new tokens per completion."))
    temperature: float = field(default=1.0, metadata=_help("Sampling temperature (also applied to the log-probs)."))
    top_p: float = field(
        default=1.0, metadata=_help("Nucleus sampling: keep the smallest set of tokens with this mass.")
    )
    top_k: int = field(default=0, metadata=_help("Sample among the k most likely tokens (0: all)."))

    # --- GRPO --------------------------------------------------------------------------------------
    beta: float = field(
        default=0.0, metadata=_help("KL coefficient to the reference model (k3); 0 loads no reference model.")
    )
    epsilon: float = field(default=0.2, metadata=_help("Lower clip range of the ratio: clip(r, 1 - epsilon, ...)."))
    epsilon_high: float | None = field(
        default=None, metadata=_help("Upper clip range: clip(r, ..., 1 + epsilon_high). Default: epsilon.")
    )
    loss_type: str = field(
        default="dapo",
        metadata=_help(
            "How per-token losses are averaged: grpo (per sequence, then over sequences), bnpo (over the tokens "
            "of the micro-batch), dr_grpo (sum / (completions x max_completion_length)), dapo (over all tokens of "
            "the step, every process).",
            choices=list(LOSS_TYPES),
        ),
    )
    scale_rewards: str = field(
        default="group",
        metadata=_help(
            "Divide group-centred rewards by the std of the group, of the batch, or not at all "
            "(group | batch | none; true = group, false = none)."
        ),
    )
    mask_truncated_completions: bool = field(
        default=False, metadata=_help("Leave completions that hit max_completion_length out of the loss.")
    )

    def __post_init__(self) -> None:
        scale = self.scale_rewards
        if isinstance(scale, bool) or str(scale).lower() in ("true", "false"):
            self.scale_rewards = "group" if str(scale).lower() == "true" else "none"
        super().__post_init__()
        if self.loss_type not in LOSS_TYPES:
            raise ConfigError(f"loss_type={self.loss_type!r} is not supported: use one of {', '.join(LOSS_TYPES)}.")
        if self.scale_rewards not in SCALE_REWARDS:
            raise ConfigError(
                f"scale_rewards={self.scale_rewards!r}: use one of {', '.join(SCALE_REWARDS)} (or true / false)."
            )
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        if self.epsilon < 0 or self.epsilon_high < 0:
            raise ConfigError(f"epsilon and epsilon_high must be >= 0, got {self.epsilon} and {self.epsilon_high}.")
        if self.beta < 0:
            raise ConfigError(f"beta must be >= 0, got {self.beta}.")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 = no limit), got {self.top_k}.")
        if self.num_generations < 2:
            raise ConfigError(
                f"num_generations must be >= 2, got {self.num_generations}: group-relative advantages compare "
                "completions of the same prompt."
            )
        if self.per_device_train_batch_size % self.num_generations:
            raise ConfigError(
                f"per_device_train_batch_size ({self.per_device_train_batch_size}) must be a multiple of "
                f"num_generations ({self.num_generations}): it counts completions, and each prompt's "
                f"{self.num_generations} completions stay together. Try per_device_train_batch_size "
                f"{self.num_generations * max(1, self.per_device_train_batch_size // self.num_generations)}."
            )

    def _positive_fields(self) -> tuple[str, ...]:
        return (*super()._positive_fields(), "num_iterations", "max_completion_length", "num_generations")


class PPOBatchSizes(NamedTuple):
    """Batch arithmetic of one PPO update (see docs/algorithms/ppo.md)."""

    local_batch_size: int  # rollouts per device per update = per_device_train_batch_size x gradient_accumulation_steps
    batch_size: int  # rollouts per update, all devices
    local_mini_batch_size: int  # rollouts per device per optimizer step
    micro_batches_per_mini_batch: int  # forward/backward passes accumulated into one optimizer step
    num_total_batches: int  # PPO updates in the run


def exact_div(a: int, b: int, message: str) -> int:
    if b == 0 or a % b:
        raise ConfigError(f"{message} (got {a} / {b}).")
    return a // b


def ppo_batch_sizes(args: PPOConfig, world_size: int, dataset_size: int) -> PPOBatchSizes:
    local_batch_size = args.per_device_train_batch_size * args.gradient_accumulation_steps
    local_mini = exact_div(
        local_batch_size,
        args.num_mini_batches,
        "per_device_train_batch_size x gradient_accumulation_steps must be divisible by num_mini_batches",
    )
    micro = exact_div(
        local_mini,
        args.per_device_train_batch_size,
        "gradient_accumulation_steps must be divisible by num_mini_batches "
        "(each mini-batch is a whole number of per_device_train_batch_size micro-batches)",
    )
    batch_size = local_batch_size * world_size
    total = args.total_episodes
    if total is None:
        total = int(args.num_train_epochs * dataset_size)
    if total < 1:
        raise ConfigError("total_episodes must be >= 1 (or set num_train_epochs with a non-empty dataset).")
    return PPOBatchSizes(local_batch_size, batch_size, local_mini, micro, math.ceil(total / batch_size))


class GRPOBatchSizes(NamedTuple):
    """Batch arithmetic of GRPO (see docs/algorithms/grpo.md)."""

    local_completions: int  # completions per device per generation = per_device_train_batch_size x GA
    local_prompts: int  # prompts per device per generation = local_completions / num_generations
    completions: int  # completions per generation, all devices
    num_steps: int  # optimizer steps in the run (num_iterations of them per generation)


def grpo_batch_sizes(args: GRPOConfig, world_size: int, dataset_size: int) -> GRPOBatchSizes:
    local_completions = args.per_device_train_batch_size * args.gradient_accumulation_steps
    local_prompts = exact_div(
        local_completions,
        args.num_generations,
        "per_device_train_batch_size must be a multiple of num_generations",
    )
    if args.max_steps > 0:
        num_steps = args.max_steps
    else:
        generations = math.ceil(args.num_train_epochs * dataset_size / (local_prompts * world_size))
        num_steps = generations * args.num_iterations
    if num_steps < 1:
        raise ConfigError("max_steps must be >= 1 (or set num_train_epochs with a non-empty dataset).")
    return GRPOBatchSizes(local_completions, local_prompts, local_completions * world_size, num_steps)


def warmup_steps(args: TrainConfig, num_steps: int) -> int:
    """Warm-up steps of a run of `num_steps` steps: warmup_steps when set, else ceil(warmup_ratio x num_steps)."""
    return min(args.warmup_steps or math.ceil(args.warmup_ratio * num_steps), num_steps - 1)


def config_field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def default_run_name(args: TrainConfig) -> str:
    import time

    return f"{args.exp_name}-{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


RUN_FILES = ("run_config.json", "metrics.jsonl")


def resolve_output_dir(args: TrainConfig) -> str:
    """Fill in run_name and output_dir, and refuse an output_dir holding another run (nothing is written yet).

    A run is only continued with --resume_from_checkpoint and only replaced with --overwrite_output_dir: losing a
    finished run's logs to a repeated command is the kind of mistake that costs a day of compute.
    """
    if args.resume_from_checkpoint and args.output_dir is None:
        raise ConfigError("--resume_from_checkpoint needs --output_dir: the run directory to continue.")
    if args.run_name is None:
        if args.resume_from_checkpoint:
            previous = _previous_config(args.output_dir)
            args.run_name = previous.get("run_name") or default_run_name(args)
        else:
            args.run_name = default_run_name(args)
    if args.output_dir is None:
        args.output_dir = os.path.join("runs", args.run_name)
    if holds_run(args.output_dir) and not (args.resume_from_checkpoint or args.overwrite_output_dir):
        held = [name for name in RUN_FILES if os.path.isfile(os.path.join(args.output_dir, name))]
        raise ConfigError(
            f"--output_dir {args.output_dir} already holds a run ({', '.join(held)}). Continue it with "
            "--resume_from_checkpoint latest, replace it with --overwrite_output_dir, or choose another --output_dir."
        )
    return args.output_dir


def holds_run(output_dir: str) -> bool:
    """Whether output_dir holds another run: one that logged metrics, or a run_config.json without metrics.jsonl.
    A run_config.json beside an empty metrics.jsonl is a run that never logged a step (a trainer built, never
    trained) and may be reused."""
    config, metrics = (os.path.join(output_dir, name) for name in RUN_FILES)
    if os.path.isfile(metrics):
        return os.path.getsize(metrics) > 0
    return os.path.isfile(config) and os.path.getsize(config) > 0


def _previous_config(output_dir: str) -> dict:
    path = os.path.join(output_dir, "run_config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
