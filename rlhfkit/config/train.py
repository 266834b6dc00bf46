"""TrainConfig: the fields every trainer shares, with TRL's and transformers' names, meanings and defaults.

Each field's metadata holds its ``--help`` text and its rule (config/rules.py); ``__post_init__`` checks every field,
then the rules that tie fields together, before anything is loaded or written.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, TypeVar

from rlhfkit.config import trl_flags
from rlhfkit.config.rules import (
    FLAG,
    JSON_OBJECT,
    PATH,
    TEXT,
    Checked,
    ListOf,
    OneOf,
    OrNone,
    check_fields,
    decode_json_fields,
    integer,
    meta,
    number,
    on_off_flags,
)
from rlhfkit.data import PROMPT_OVERFLOW
from rlhfkit.errors import ConfigError
from rlhfkit.health.rules import HEALTH_MODES, parse_thresholds
from rlhfkit.logs import note
from rlhfkit.optim import LR_SCHEDULER_TYPES, OPTIMIZERS, lr_factor, other_optimizers, other_schedules
from rlhfkit.tracking.trackers import REPORT_TO_NAMES, parse_report_to

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # Python 3.10: typing_extensions comes with torch
    from typing_extensions import dataclass_transform

# transformers' names (TrainingArguments) for the strategies rlhfkit.trainers.run schedules rows, evaluations and
# checkpoints by.
LOGGING_STRATEGIES = ("steps", "epoch", "no")
EVAL_STRATEGIES = ("no", "steps", "epoch")
SAVE_STRATEGIES = ("steps", "no", "epoch")


def _best_checkpoint() -> dict[str, str]:
    return {
        "best": "it needs --metric_for_best_model, and an RL run has no evaluation loss to rank checkpoints by: "
        "rlhfkit keeps the latest ones, --save_total_limit of them"
    }


def _report_to_complaint(value: Any) -> str | None:
    """Spelling only: whether a named tracker is installed is checked when the run starts."""
    try:
        parse_report_to(value)
    except ValueError as e:
        return str(e)
    return None


def _steps_complaint(zero: bool):
    """A step interval as transformers reads it: an integer >= 1 (or 0 where `zero`: never), or a share of the run's
    steps in (0, 1) (ceil(share x steps) steps: rlhfkit.trainers.schedule.interval)."""
    low = 0 if zero else 1

    def complaint(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"must be {STEPS_TEXT[zero]}"
        if 0 < value < 1 or (value >= low and float(value).is_integer()):
            return None
        return f"must be {STEPS_TEXT[zero]}"

    return complaint


STEPS_TEXT = {
    False: "an integer >= 1, or a number in (0, 1) for that share of the run's steps",
    True: "an integer >= 0, or a number in (0, 1) for that share of the run's steps",
}


def _steps(zero: bool = False, example: Any = None) -> Checked:
    return Checked(STEPS_TEXT[zero], _steps_complaint(zero), example)


_Config = TypeVar("_Config", bound="CheckedConfig")


class CheckedConfig:
    """Base of every config dataclass (each declared with :func:`config_dataclass`). ``__post_init__`` turns JSON text
    into dicts, applies the accepted spellings (``_apply_aliases``), checks every field's rule, then the rules that tie
    fields together (``_check_combinations``). Subclasses extend those two cooperatively, each calling ``super()``, so
    a dataclass made of several groups (PPOArguments: PPOConfig, ScriptArguments and ModelConfig) runs every group's.

    A training config given a field of its script or model arguments (``PPOConfig(model_name_or_path=...)``) is its
    full arguments class instead (``full_arguments``: PPOArguments, a PPOConfig subclass holding every flag of
    ``rlhfkit ppo``), so rlhfkit's one-config Python use keeps working while TRL's parsers see TRL's field groups."""

    # The TRL command whose flags explain a keyword the config does not take (config/trl_flags.py); the groups both
    # commands share are screened as trl ppo's.
    trl_command = "ppo"

    def __new__(cls: type[_Config], *args: Any, **kwargs: Any) -> _Config:
        # Python runs __init__ of the object's own class, once, when it is an instance of `cls` (as PPOArguments is a
        # PPOConfig): the full arguments' __init__ then takes the keywords.
        full = getattr(cls, "full_arguments", cls)
        if full is not cls and _init_names(full) & (kwargs.keys() - _init_names(cls)):
            return super().__new__(full)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        decode_json_fields(self)  # JSON text of a dict field (from the command line) becomes the dict
        self._apply_aliases()
        check_fields(self)
        self._check_combinations()

    def _apply_aliases(self) -> None:
        """Accepted spellings turned into the canonical value, before the rules see them."""

    def _check_combinations(self) -> None:
        """Rules that tie fields together (each field has passed its own rule)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __getattr__(self, name: str) -> Any:
        """A field of TRL's config (a transformers TrainingArguments field included) that this config does not hold:
        TRL's default, which is what rlhfkit runs with (a config takes such a field only at its default), so a TRL
        script that reads ``args.dataloader_num_workers`` reads what TRL's config would say. An accepted-and-ignored
        field given another value keeps that value (the constructor sets it)."""
        if not name.startswith("_"):
            default = trl_flags.trl_default(type(self).trl_command, name)
            if default is not MISSING:
                return default
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


@dataclass_transform(field_specifiers=(field,))
def config_dataclass(cls: type[_Config]) -> type[_Config]:
    """Class decorator of every config: ``@dataclass``, ``--no_NAME`` for its on/off fields (rules.on_off_flags), and
    an ``__init__`` that explains a keyword the dataclass does not take before Python's bare "unexpected keyword
    argument": a TRL field at TRL's default is dropped, as are the accepted-and-ignored ones (after one note at
    another value); the others rlhfkit refuses raise FieldNotTakenError with the command line's reason, other names
    get the closest flag (trl_flags.screen_keyword)."""
    cls = on_off_flags(dataclass(cls))
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: CheckedConfig, *args: Any, **kwargs: Any) -> None:
        config = type(self)
        taken = _init_names(config)
        ignored = {}  # accepted-and-ignored keywords at another value than TRL's: kept as given, for scripts to read
        if not taken.issuperset(kwargs):
            flags = _init_names(getattr(config, "full_arguments", config))  # the flags of the command line
            for name in [name for name in kwargs if name not in taken]:
                # raises FieldNotTakenError, or returns None (TRL's default) or the note of an ignored keyword
                value = kwargs.pop(name)
                explained = trl_flags.screen_keyword(config.__name__, config.trl_command, name, value, flags)
                if explained is not None:
                    note(explained)
                    ignored[name] = value
        init(self, *args, **kwargs)
        for name, value in ignored.items():  # not fields: asdict, the run's recorded config and resumes skip them
            object.__setattr__(self, name, value)

    cls.__init__ = __init__
    return cls


@functools.cache
def _init_names(cls: type) -> frozenset[str]:
    """The keywords the dataclass `cls` takes."""
    return frozenset(f.name for f in fields(cls) if f.init)


def _thresholds_complaint(value: Any) -> str | None:
    try:
        parse_thresholds(value)
    except (TypeError, ValueError) as e:
        return f"{e} (see docs/health.md)"
    return None


@config_dataclass
class TrainConfig(CheckedConfig):
    """Fields shared by every trainer (names and meanings as TRL's / transformers' TrainingArguments)."""

    # --- where things go -------------------------------------------------------------------------
    output_dir: str | None = field(
        default=None,
        metadata=meta(
            "Run directory: resolved config, metrics.jsonl, samples, checkpoints. Default: runs/<run_name>.",
            OrNone(PATH),
        ),
    )
    exp_name: str = field(default="run", metadata=meta("Experiment name, used in the default run name.", TEXT))
    run_name: str | None = field(
        default=None,
        metadata=meta("Run name shown by the trackers. Default: <exp_name>-<seed>-<time>.", OrNone(TEXT)),
    )
    project: str = field(
        default="huggingface",
        metadata=meta(
            "Tracker project (Trackio, and W&B unless $WANDB_PROJECT names it), TRL's default name included.", TEXT
        ),
    )
    report_to: list[str] | None = field(
        default_factory=lambda: ["trackio"],
        metadata=meta(
            "Trackers (several allowed).",
            Checked(f"tracker names: {', '.join(REPORT_TO_NAMES)}", _report_to_complaint),
        ),
    )
    logging_dir: str | None = field(
        default=None, metadata=meta("TensorBoard log directory. Default: <output_dir>/runs.", OrNone(PATH))
    )
    log_legacy_names: bool = field(
        default=False,
        metadata=meta(
            "Also send every metric to the trackers under the name TRL's original PPOTrainer used "
            "(env/reward_mean, ppo/mean_scores, ppo/policy/approxkl, ...), for dashboards built for it.",
            FLAG,
        ),
    )
    logging_steps: float = field(
        default=1,
        metadata=meta(
            "Log metrics every this many training steps (logging_strategy steps); a number in (0, 1) is that share "
            "of the run's steps, rounded up (as in transformers).",
            _steps(),
        ),
    )
    logging_strategy: str = field(
        default="steps",
        metadata=meta(
            "When a row of training metrics is logged (each row pools every step since the previous one): steps "
            "(every logging_steps steps and after the last), epoch (after each pass over the prompts and after the "
            "last step), no (no training rows: evaluation rows are still logged, but the health checks, which read "
            "the rows, do not run).",
            OneOf(LOGGING_STRATEGIES),
        ),
    )
    logging_first_step: bool = field(
        default=False, metadata=meta("Also log a row after the first step (whatever logging_strategy).", FLAG)
    )
    save_strategy: str = field(
        default="steps",
        metadata=meta(
            "When checkpoints are saved during training: steps (every save_steps steps), epoch (after each pass "
            "over the prompts), no (none). Either way the final checkpoint and the trained model are saved at the "
            "end.",
            OneOf(SAVE_STRATEGIES, unsupported=_best_checkpoint),
        ),
    )
    save_steps: float = field(
        default=500,
        metadata=meta(
            "Save a checkpoint every this many training steps with save_strategy steps (0: none during training; a "
            "number in (0, 1): that share of the run's steps, rounded up, as in transformers); the final checkpoint "
            "and the model are saved at the end either way.",
            _steps(zero=True),
        ),
    )
    save_total_limit: int | None = field(
        default=None,
        metadata=meta(
            "Keep at most this many checkpoints (oldest removed). Default: all.", OrNone(integer(ge=1, example=2))
        ),
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata=meta(
            "Continue a run exactly from a checkpoint-N directory, or 'latest' in --output_dir.", OrNone(PATH)
        ),
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata=meta("Start afresh in an --output_dir that already holds a run (its files are replaced).", FLAG),
    )
    allow_config_change: bool = field(
        default=False,
        metadata=meta(
            "With resume_from_checkpoint: continue even though settings that shape the saved state or the run "
            "(batch shape, models, data, seed, learning rate, algorithm settings, run length, ...) differ from the "
            "checkpoint's. Without it such a resume is refused, listing each difference; logging, saving, "
            "evaluation and tracker settings may change freely. Either way the changes are recorded in "
            "output_dir/run_config_history.jsonl.",
            FLAG,
        ),
    )
    push_to_hub: bool = field(
        default=False,
        metadata=meta(
            "Upload output_dir (the trained model, its logs and report files) to the Hugging Face Hub repository "
            "hub_model_id once training has ended (rlhfkit ppo|grpo; in Python, trainer.push_to_hub()).",
            FLAG,
        ),
    )
    hub_model_id: str | None = field(
        default=None,
        metadata=meta(
            "Hub repository to upload to (push_to_hub). Default: output_dir's name under your user.", OrNone(TEXT)
        ),
    )
    hub_token: str | None = field(
        default=None, metadata=meta("Hub token for push_to_hub. Default: the token of `hf auth login`.", OrNone(TEXT))
    )
    hub_private_repo: bool | None = field(
        default=None,
        metadata=meta("Create the hub repository private (push_to_hub). Default: the hub's default.", OrNone(FLAG)),
    )
    max_nonfinite_steps: int = field(
        default=3,
        metadata=meta(
            "Optimizer steps with a NaN/inf loss or gradient are skipped; after this many in a row training stops "
            "with a checkpoint of the last good state.",
            integer(ge=1),
        ),
    )
    seed: int = field(
        default=42,
        metadata=meta(
            "Random seed (sampling, data order, initialisation).",
            # accelerate adds the process index to the seed, and NumPy refuses seeds of 2**32 or more.
            integer(ge=0, le=2**31 - 1),
        ),
    )
    health: str = field(
        default="warn",
        metadata=meta(
            "Health checks on the logged metrics (docs/health.md): off; warn (print, log and record findings in "
            "health.jsonl); stop (also end training with a checkpoint on a critical finding, exit status 3).",
            OneOf(HEALTH_MODES),
        ),
    )
    health_thresholds: str | None = field(
        default=None,
        metadata=meta(
            "Override health-check thresholds: 'name=value,name=value' (docs/health.md).",
            OrNone(Checked("name=value pairs of docs/health.md's thresholds", _thresholds_complaint)),
        ),
    )

    # --- models and data (the model and dataset names are ModelConfig's and ScriptArguments', config/script.py) ---
    trust_remote_code: bool = field(
        default=False, metadata=meta("Allow custom model code from the checkpoints. Off unless asked.", FLAG)
    )
    disable_dropout: bool = field(
        default=True,
        metadata=meta(
            "Turn dropout off in every model, so that a rollout's log-probs and the update's agree: PPO's first "
            "ratio is exactly 1, and GRPO's reused batches (num_iterations > 1) stay exact. On by default for both "
            "trainers, as TRL's PPO always does; TRL's GRPO defaults to false. --disable_dropout false keeps the "
            "checkpoints' dropout.",
            FLAG,
        ),
    )
    dataset_text_field: str = field(default="prompt", metadata=meta("Column holding the prompt text.", TEXT))
    max_prompt_length: int | None = field(
        default=None,
        metadata=meta(
            "Prompts longer than this many tokens are dropped or truncated (prompt_overflow).",
            OrNone(integer(ge=1, example=512)),
        ),
    )
    prompt_overflow: str = field(
        default="drop",
        metadata=meta(
            "What to do with prompts longer than max_prompt_length: drop them, or truncate them (keep the last "
            "max_prompt_length tokens, as TRL does). Either way the count is reported.",
            OneOf(PROMPT_OVERFLOW),
        ),
    )
    shuffle_dataset: bool = field(
        default=True,
        metadata=meta(
            "Draw the prompts in a new random order (from seed) on every pass; false: in dataset order, pass after "
            "pass. A resumed run continues the order exactly either way.",
            FLAG,
        ),
    )
    dataset_num_proc: int | None = field(
        default=None,
        metadata=meta(
            "Processes for the dataset's map/filter while preparing the prompts (unset: this process).",
            OrNone(integer(ge=1, example=4)),
        ),
    )
    task: str | None = field(
        default=None,
        metadata=meta(
            "task.json (or its directory) whose check function measures true success (eval/task_success).",
            OrNone(PATH),
        ),
    )

    # --- rewards: weights; each trainer adds its reward models and functions ---------------------------------
    reward_weights: list[float] | None = field(
        default=None,
        metadata=meta(
            "Weight of each reward, in the order PPO scores them: reward_funcs, then reward_model_path. Default: all 1.",
            OrNone(ListOf(number(), example=[1.0, 0.5])),
        ),
    )

    # --- LoRA adapters: their settings are ModelConfig's (config/script.py) ----------------------------------
    merge_adapter: bool = field(
        default=False,
        metadata=meta(
            "With use_peft: also save the policy with the adapter merged into its weights, a plain transformers "
            "model, in output_dir/merged/ (after the final checkpoint, which keeps the adapter).",
            FLAG,
        ),
    )
    # --- optimisation ------------------------------------------------------------------------------
    learning_rate: float = field(
        default=3e-6,
        metadata=meta(
            "Peak learning rate, scaled step by step by lr_scheduler_type (default: linear decay to 0).", number(gt=0)
        ),
    )
    lr_scheduler_type: str = field(
        default="linear",
        metadata=meta(
            "Learning-rate schedule, computed by transformers' own schedules as TRL steps them: step s (1-based) "
            "uses learning_rate x the schedule's factor after s-1 scheduler steps, so a warm-up starts at 0. "
            "constant ignores the warm-up (as in transformers); cosine_with_min_lr needs lr_scheduler_kwargs "
            "min_lr_rate or min_lr.",
            OneOf(LR_SCHEDULER_TYPES, unsupported=other_schedules),
        ),
    )
    lr_scheduler_kwargs: dict | str | None = field(
        default=None,
        metadata=meta(
            "Extra arguments of the schedule, as JSON on the command line: e.g. '{\"min_lr_rate\": 0.1}' for "
            "cosine_with_min_lr, '{\"num_cycles\": 0.5}' for cosine.",
            OrNone(JSON_OBJECT),
        ),
    )
    warmup_steps: float = field(
        default=0,
        metadata=meta(
            "Warm-up steps (linear from 0 to learning_rate): a count, or a number in (0, 1) for that share of the "
            "steps, as in transformers 5. Overrides warmup_ratio.",
            number(ge=0),
        ),
    )
    warmup_ratio: float = field(
        default=0.0,
        metadata=meta("Share of the steps used for linear warm-up (older transformers' flag).", number(ge=0, lt=1)),
    )
    optim: str = field(
        default="adamw_torch_fused",
        metadata=meta(
            "Optimizer: adamw_torch (torch's AdamW), adamw_torch_fused (the same, fused into one kernel where torch "
            "has one for the device), sgd (torch's SGD, no momentum), adafactor (transformers' Adafactor at "
            "learning_rate: no relative step, no parameter scaling, as transformers' Trainer builds it).",
            OneOf(OPTIMIZERS, unsupported=other_optimizers),
        ),
    )
    per_device_train_batch_size: int = field(default=64, metadata=meta("Micro-batch size per device.", integer(ge=1)))
    per_device_eval_batch_size: int = field(
        default=64, metadata=meta("Batch size per device for sample generations.", integer(ge=1))
    )
    gradient_accumulation_steps: int = field(
        default=1, metadata=meta("Micro-batches accumulated per device into each optimizer step.", integer(ge=1))
    )
    num_train_epochs: float = field(
        default=3.0, metadata=meta("Passes over the prompts when no length is set.", number(gt=0))
    )
    max_grad_norm: float | None = field(
        default=None,
        metadata=meta(
            "Clip the gradient norm to this value (0 or unset: no clipping, as in transformers).",
            OrNone(number(ge=0, example=1.0)),
        ),
    )
    weight_decay: float = field(
        default=0.0,
        metadata=meta(
            "Weight decay of the optimizer, on every parameter (transformers' Trainer exempts biases and norm "
            "weights).",
            number(ge=0),
        ),
    )
    adam_beta1: float = field(default=0.9, metadata=meta("AdamW beta1 (adamw_* optimizers).", number(ge=0, lt=1)))
    adam_beta2: float = field(default=0.999, metadata=meta("AdamW beta2 (adamw_* optimizers).", number(ge=0, lt=1)))
    # 0 is legal in torch, but a parameter whose gradient stays 0 then gets 0 / 0 = NaN updates.
    adam_epsilon: float = field(default=1e-8, metadata=meta("AdamW epsilon (adamw_* optimizers).", number(gt=0)))
    temperature: float = field(
        default=0.7, metadata=meta("Sampling temperature (also applied to the log-probs).", number(gt=0))
    )
    num_sample_generations: int = field(
        default=10,
        metadata=meta(
            "With eval_strategy no: how many times during training (and before it) to log sample completions and "
            "evaluate (0: never), as TRL's PPO does.",
            integer(ge=0),
        ),
    )
    eval_strategy: str = field(
        default="no",
        metadata=meta(
            "When to evaluate (eval metrics on the eval split and the completions table) instead of the "
            "num_sample_generations schedule: no (that schedule), steps (every eval_steps steps and after the "
            "last), epoch (after each pass over the prompts and after the last step).",
            OneOf(EVAL_STRATEGIES),
        ),
    )
    eval_steps: float | None = field(
        default=None,
        metadata=meta(
            "Evaluate every this many steps with eval_strategy steps (a number in (0, 1): that share of the run's "
            "steps, rounded up). Default: logging_steps (as transformers).",
            OrNone(_steps(example=100)),
        ),
    )
    eval_on_start: bool = field(
        default=False,
        metadata=meta("Also evaluate before the first step (the num_sample_generations schedule always does).", FLAG),
    )
    metric_for_best_model: str | None = field(
        default=None,
        metadata=meta(
            "An evaluation metric (task_success, reward, scores; eval_ prefix optional) that state.best_metric "
            "tracks for transformers callbacks such as EarlyStoppingCallback. Checkpoints are kept newest-first all "
            "the same.",
            OrNone(TEXT),
        ),
    )
    greater_is_better: bool | None = field(
        default=None,
        metadata=meta(
            "Whether a larger metric_for_best_model is better. Default: true, as transformers sets it for any "
            "metric that is not a loss.",
            OrNone(FLAG),
        ),
    )

    # --- precision and memory ----------------------------------------------------------------------
    bf16: bool | None = field(
        default=None,
        metadata=meta(
            "bfloat16 mixed precision (accelerate's autocast over fp32 weights), as in TRL. Default: the accelerate "
            "launch config's mixed_precision, else on where the device is fast at it (a CUDA GPU with bf16 units); "
            "off on a CPU, where bf16 is ~9x slower than fp32.",
            OrNone(FLAG),
        ),
    )
    fp16: bool = field(
        default=False,
        metadata=meta("float16 mixed precision with loss scaling (accelerate's GradScaler); CUDA GPUs only.", FLAG),
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata=meta(
            "Recompute activations in the backward pass instead of keeping them (policy and value model): less "
            "memory, about a third more compute. TRL turns it on by default; rlhfkit leaves the choice to you.",
            FLAG,
        ),
    )
    padding_free: bool = field(
        default=False,
        metadata=meta(
            "Run the policy's and the reference's forwards on the batch's real tokens packed into one row (TRL's "
            "SFT/DPO name): no compute or memory spent on padding, the same log-probs and gradients. Needs an "
            "attention implementation that reads separate sequences from position ids (flash_attention_2/3, sdpa, "
            "eager, flex_attention) in a transformers model; value and reward models keep the padded batch. Off by "
            "default until a GPU measurement says it pays (bench/gpu).",
            FLAG,
        ),
    )
    trim_cpu_heap: bool | None = field(
        default=None,
        metadata=meta(
            "On a CPU: have glibc map every allocation of 1 MB or more on its own and give the freed C heap back "
            "after sampling and before each optimizer step (malloc_trim). Default (None): on for a policy whose "
            "vocabulary has 32,768 tokens or more, where the decoding loop's logits rows otherwise pile up in the "
            "heap (GRPO at Qwen's 151,936 tokens, 8 x 512: a peak of 4.20 GB without it), off below, where it only "
            "costs time (15 to 30 percent of a run on the built-in task). No effect on GPUs (bench/README.md, "
            "'Real shapes (CPU)').",
            OrNone(FLAG),
        ),
    )
    gradient_checkpointing_kwargs: dict | str | None = field(
        default=None,
        metadata=meta(
            "Arguments of transformers' gradient_checkpointing_enable, as JSON: e.g. '{\"use_reentrant\": true}'. "
            "Default: use_reentrant false (no input gradients needed, works with frozen embeddings and LoRA).",
            OrNone(JSON_OBJECT),
        ),
    )
    ds3_gather_for_generation: bool = field(
        default=True,
        metadata=meta(
            "Under DeepSpeed ZeRO-3 or FSDP (accelerate launch --config_file): gather the policy's full weights on "
            "every process while it samples, as TRL does, so decoding runs without a collective per token. rlhfkit "
            "always gathers (sampling sharded is not supported): false is refused.",
            FLAG,
        ),
    )

    @property
    def load_best_model_at_end(self) -> bool:
        """Always False: an RL run keeps its newest checkpoints and final model (docs/trl-flags.md says why); read by
        transformers callbacks such as EarlyStoppingCallback."""
        return False

    def _apply_aliases(self) -> None:
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        if self.metric_for_best_model is not None and self.greater_is_better is None:  # transformers' default
            self.greater_is_better = not self.metric_for_best_model.endswith("loss")
        # Whole numbers of steps are ints (a flag or YAML may give 10.0); shares in (0, 1) stay floats.
        for name in ("logging_steps", "save_steps", "eval_steps"):
            value = getattr(self, name)
            if isinstance(value, float) and value >= 1 and value.is_integer():
                setattr(self, name, int(value))
        # transformers (so TRL) turns clipping off with max_grad_norm=0, and a flag cannot say None; clipping to a
        # norm of 0 would zero every gradient.
        if self.max_grad_norm == 0:
            self.max_grad_norm = None
        super()._apply_aliases()

    def _check_combinations(self) -> None:
        """Rules that tie fields together (each field has passed its own rule)."""
        if self.fp16 and self.bf16:
            raise ConfigError("fp16=True and bf16=True: choose one precision. Pass only one of --fp16 and --bf16.")
        if self.lr_scheduler_kwargs or self.lr_scheduler_type == "cosine_with_min_lr":
            self._check_schedule()
        # Without reward functions named the count may be the task's (GRPO), known once the task is loaded: the
        # trainer checks.
        sources = self.weighted_rewards()
        if self.reward_weights is not None and sources is not None and len(self.reward_weights) != len(sources):
            raise ConfigError(
                f"reward_weights={self.reward_weights!r}: needs one weight per reward, in the order "
                f"{self.REWARD_ORDER} ({', '.join(map(str, sources))}), but has "
                f"{len(self.reward_weights)}. Pass e.g. --reward_weights {' '.join(['1.0'] * len(sources))}."
            )
        super()._check_combinations()

    REWARD_ORDER = "reward_funcs, then reward_model_path"  # the order of weighted_rewards(), in words

    def weighted_rewards(self) -> list[str] | None:
        """The rewards named by the flags, in the order --reward_weights weighs them; None when no reward function
        is named (each trainer defines it: PPOConfig, GRPOArguments)."""
        return None

    def _check_schedule(self) -> None:
        """Build the schedule for a short run, so arguments the schedule does not take (or lacks) fail now, naming
        the flags, rather than when training starts."""
        try:
            factor = lr_factor(self, num_steps=10)
            values = [self.learning_rate * factor(step - 1) for step in (1, 5, 10)]
        except (TypeError, ValueError) as e:
            kind = self.lr_scheduler_type
            fix = (
                """Pass e.g. --lr_scheduler_kwargs '{"min_lr_rate": 0.1}'."""
                if kind == "cosine_with_min_lr"
                else f"Pass only arguments of transformers' {kind} schedule, or leave --lr_scheduler_kwargs out."
            )
            raise ConfigError(
                f"lr_scheduler_type={kind!r} with lr_scheduler_kwargs={self.lr_scheduler_kwargs!r}: {e}. {fix}"
            ) from None
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ConfigError(
                f"lr_scheduler_kwargs={self.lr_scheduler_kwargs!r} give lr_scheduler_type {self.lr_scheduler_type!r} "
                f"learning rates {values} (steps 1, 5 and 10 of 10): they must be finite and >= 0."
            )


def config_field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]
