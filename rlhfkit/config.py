"""Training configurations with TRL's field names, so a TRL command line works unchanged.

Each field's ``help`` metadata is the ``--help`` text of the CLI. Derived batch sizes are computed by
:func:`ppo_batch_sizes` with exact division and an error that names the flags involved.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple

KL_ESTIMATORS = ("k1", "k3")


def _help(text: str, **extra: Any) -> dict:
    return {"help": text, **extra}


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field(s) and the fix."""


@dataclass
class PPOConfig:
    """Hyper-parameters of :class:`rlhfkit.PPOTrainer` (names and meanings as in TRL's ``PPOConfig``)."""

    # --- where things go -------------------------------------------------------------------------
    output_dir: str | None = field(
        default=None,
        metadata=_help(
            "Run directory: resolved config, metrics.jsonl, samples, checkpoints. Default: runs/<run_name>."
        ),
    )
    exp_name: str = field(default="ppo", metadata=_help("Experiment name, used in the default run name."))
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
    logging_steps: int = field(default=1, metadata=_help("Log metrics every this many PPO updates."))
    save_steps: int = field(
        default=500, metadata=_help("Save the policy and value model every this many PPO updates (and at the end).")
    )
    save_total_limit: int | None = field(
        default=None, metadata=_help("Keep at most this many checkpoints (oldest removed).")
    )
    seed: int = field(default=42, metadata=_help("Random seed (sampling, data order, initialisation)."))

    # --- models and data -------------------------------------------------------------------------
    model_name_or_path: str | None = field(
        default=None,
        metadata=_help("Tokenizer (and default policy) path. Without any model flag, the built-in task is used."),
    )
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
    max_prompt_length: int | None = field(default=None, metadata=_help("Drop prompts longer than this many tokens."))
    task: str | None = field(
        default=None,
        metadata=_help("task.json (or its directory) whose check function measures true success (eval/task_success)."),
    )

    # --- batch sizes and length of training ------------------------------------------------------
    learning_rate: float = field(default=3e-6, metadata=_help("Initial learning rate (AdamW), decayed linearly to 0."))
    per_device_train_batch_size: int = field(
        default=64, metadata=_help("Micro-batch size per device for the PPO updates.")
    )
    per_device_eval_batch_size: int = field(
        default=64, metadata=_help("Batch size per device for sample generations.")
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
    num_train_epochs: float = field(default=3.0, metadata=_help("Used only when total_episodes is not set."))
    local_rollout_forward_batch_size: int = field(
        default=64, metadata=_help("Per-device batch size of generation and scoring forwards.")
    )
    max_grad_norm: float | None = field(
        default=None, metadata=_help("Clip the gradient norm to this value (off by default, as TRL's PPO).")
    )
    weight_decay: float = field(default=0.0, metadata=_help("AdamW weight decay."))
    adam_epsilon: float = field(default=1e-8, metadata=_help("AdamW epsilon."))

    # --- generation --------------------------------------------------------------------------------
    response_length: int = field(default=53, metadata=_help("Maximum new tokens per response."))
    temperature: float = field(default=0.7, metadata=_help("Sampling temperature (also applied to the log-probs)."))
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
    num_sample_generations: int = field(
        default=10, metadata=_help("How many times during training to log sample completions (0: never).")
    )

    # --- precision ---------------------------------------------------------------------------------
    bf16: bool | None = field(
        default=None,
        metadata=_help("bfloat16 weights. Default: only where the device is fast at it (CUDA with bf16)."),
    )
    fp16: bool = field(default=False, metadata=_help("float16 mixed precision (CUDA only)."))

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
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ConfigError(
                f"kl_estimator={self.kl_estimator!r} is not supported: use one of {', '.join(KL_ESTIMATORS)}."
            )
        if self.stop_token not in (None, "eos"):
            raise ConfigError(
                f"stop_token={self.stop_token!r}: the only named stop token is 'eos'; use stop_token_id for others."
            )
        for name in (
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "num_mini_batches",
            "num_ppo_epochs",
            "local_rollout_forward_batch_size",
            "response_length",
            "per_device_eval_batch_size",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}.")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0 (PPO samples), got {self.temperature}.")
        if self.kl_target is not None and self.kl_target <= 0:
            raise ConfigError(f"kl_target must be > 0 when set, got {self.kl_target}.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def config_field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def default_run_name(args: PPOConfig) -> str:
    import time

    return f"{args.exp_name}-{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def resolve_output_dir(args: PPOConfig) -> str:
    if args.run_name is None:
        args.run_name = default_run_name(args)
    if args.output_dir is None:
        args.output_dir = os.path.join("runs", args.run_name)
    return args.output_dir
