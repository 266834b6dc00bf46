"""Training configurations with TRL's field names, so a TRL command line works unchanged.

``TrainConfig`` holds what every trainer shares (where things go, models and data, optimisation, precision);
``PPOConfig`` and ``GRPOConfig`` add their algorithm's fields with TRL's names, meanings and defaults. Each
field's metadata holds its ``help`` (the ``--help`` text of the CLI) and its ``rule``: the values it accepts.
``__post_init__`` checks every field against its rule, then the rules that tie fields together, so a bad value
fails with a :class:`ConfigError` naming the field, the value, the valid range and a fix, before anything is
loaded or written. Derived batch sizes that need the world size or the dataset size are computed by
:func:`ppo_batch_sizes` / :func:`grpo_batch_sizes` with exact division and an error that names the flags.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any, NamedTuple

from rlhfkit.data import PROMPT_OVERFLOW
from rlhfkit.health.rules import HEALTH_MODES, parse_thresholds
from rlhfkit.ops.advantages import GROUP_SCALES
from rlhfkit.ops.kl import KL_ESTIMATORS
from rlhfkit.ops.losses import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES
from rlhfkit.tracking.trackers import REPORT_TO_NAMES, parse_report_to

# The KL penalty in PPO's reward offers what TRL's PPOConfig offers: every estimator of ops but k2 (biased).
PPO_KL_ESTIMATORS = tuple(e for e in KL_ESTIMATORS if e != "k2")

# transformers' names (TrainingArguments) for what rlhfkit.trainers.common and .run implement: the optimizers
# make_optimizer builds, the schedules lr_schedule computes through transformers' own, and the strategies TrainingRun
# schedules rows, evaluations and checkpoints by.
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "sgd", "adafactor")
LR_SCHEDULER_TYPES = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_min_lr")
LOGGING_STRATEGIES = ("steps", "epoch", "no")
EVAL_STRATEGIES = ("no", "steps", "epoch")
SAVE_STRATEGIES = ("steps", "no", "epoch")


def _other_optimizers() -> dict[str, str]:
    from transformers.training_args import OptimizerNames

    return {name.value: "a transformers optimizer that rlhfkit does not build" for name in OptimizerNames}


def _other_schedules() -> dict[str, str]:
    from transformers.trainer_utils import SchedulerType

    why = {
        "reduce_lr_on_plateau": "it steps on an evaluation loss, which an RL run does not have",
        "greedy": "it steps on an evaluation loss, which an RL run does not have",
    }
    return {
        kind.value: why.get(kind.value, "a transformers schedule that rlhfkit does not offer")
        for kind in SchedulerType
    }


def _best_checkpoint() -> dict[str, str]:
    return {
        "best": "it needs --metric_for_best_model, and an RL run has no evaluation loss to rank checkpoints by: "
        "rlhfkit keeps the latest ones, --save_total_limit of them"
    }


def _other_task_types() -> dict[str, str]:
    why = "the policy is a causal LM (PPO's value model gets its own SEQ_CLS adapter)"
    return {kind: why for kind in ("SEQ_CLS", "SEQ_2_SEQ_LM", "TOKEN_CLS", "QUESTION_ANS", "FEATURE_EXTRACTION")}


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field(s) and the fix."""


# ---------------------------------------------------------------------------------------------------------------------
# Rules: the values a field accepts, declared next to the field, checked in __post_init__, shown in --help
# ---------------------------------------------------------------------------------------------------------------------


class Rule(ABC):
    """The values a field accepts. `text` completes "must be ..." in errors and "Valid: ..." in --help."""

    example: Any = None  # a valid value for the fix in an error ("Pass e.g. --name EXAMPLE"); else the default
    in_help = True  # False where --help's type and default already say it all (text, paths, on/off flags)

    @property
    @abstractmethod
    def text(self) -> str: ...

    @abstractmethod
    def accepts(self, value: Any) -> bool: ...

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` ("must be ..."), or None when it is accepted."""
        return None if self.accepts(value) else f"must be {self.text}"


@dataclass(frozen=True)
class Number(Rule):
    """A finite real number (an int when `integer`) within the bounds given; `also`: values allowed outside them
    (max_steps=-1). NaN and inf never pass: no field means anything by them."""

    integer: bool = False
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    also: tuple[int, ...] = ()
    why: str = ""  # said after the range in errors, where the bound is not obvious
    example: Any = None

    def accepts(self, value: Any) -> bool:
        kind = numbers.Integral if self.integer else numbers.Real
        # True is an int to Python; 2.5 (from YAML, or "2.5" left as text by the flag parser) is no integer.
        if isinstance(value, bool) or not isinstance(value, kind):
            return False
        if value in self.also:
            return True
        return (
            (isinstance(value, numbers.Integral) or math.isfinite(value))
            and (self.gt is None or value > self.gt)
            and (self.ge is None or value >= self.ge)
            and (self.lt is None or value < self.lt)
            and (self.le is None or value <= self.le)
        )

    @property
    def text(self) -> str:
        # (bracket, comparison, bound) of each end that is bounded
        low = ("(", ">", self.gt) if self.gt is not None else ("[", ">=", self.ge) if self.ge is not None else None
        high = (")", "<", self.lt) if self.lt is not None else ("]", "<=", self.le) if self.le is not None else None
        if low and high:
            text = f"{'an integer' if self.integer else 'a number'} in {low[0]}{low[2]}, {high[2]}{high[0]}"
        else:
            text = "an integer" if self.integer else "a finite number"
            if low or high:
                _, comparison, bound = low or high
                text += f" {comparison} {bound}"
        text += "".join(f", or {value}" for value in self.also)
        return f"{text} ({self.why})" if self.why else text


def integer(**bounds: Any) -> Number:
    return Number(integer=True, **bounds)


def number(**bounds: Any) -> Number:
    return Number(**bounds)


@dataclass(frozen=True)
class OneOf(Rule):
    """One of `values`. `unsupported`: values that mean something elsewhere (transformers' optimizers, schedules,
    strategies) mapped to why rlhfkit refuses them, so the error says "not supported" rather than "misspelt"; a
    function, called only on the error path (it may import transformers)."""

    values: tuple[str, ...]
    example: Any = None
    unsupported: Callable[[], Mapping[str, str]] | None = None

    @property
    def text(self) -> str:
        return f"one of {', '.join(self.values)}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.values

    def problem(self, value: Any) -> str | None:
        if self.accepts(value):
            return None
        why = self.unsupported().get(value) if self.unsupported is not None and isinstance(value, str) else None
        return f"not supported by rlhfkit ({why}); must be {self.text}" if why else f"must be {self.text}"


@dataclass(frozen=True)
class Text(Rule):
    """Non-empty text; `path`: a file-system path, which may also be an os.PathLike (pathlib.Path from Python)."""

    path: bool = False
    in_help = False

    @property
    def text(self) -> str:
        return "a path" if self.path else "non-empty text"

    def accepts(self, value: Any) -> bool:
        if self.path and isinstance(value, os.PathLike):
            value = os.fspath(value)
        return isinstance(value, str) and value != ""


@dataclass(frozen=True)
class Kind(Rule):
    """Any value of type `kind` (bool for on/off flags; Mapping for older TRL's project_kwargs)."""

    kind: type
    description: str
    in_help = False

    @property
    def text(self) -> str:
        return self.description

    def accepts(self, value: Any) -> bool:
        return isinstance(value, self.kind)


@dataclass(frozen=True)
class ListOf(Rule):
    """A list whose every entry passes `entry`; an error names the first entry that does not."""

    entry: Rule
    example: Any = None

    @property
    def text(self) -> str:
        return f"a list, each entry {self.entry.text}"

    @property
    def in_help(self) -> bool:
        return self.entry.in_help

    def accepts(self, value: Any) -> bool:
        return self.problem(value) is None

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, (list, tuple)):
            return f"must be {self.text}"
        bad = next((i for i, entry in enumerate(value) if not self.entry.accepts(entry)), None)
        return None if bad is None else f"entry {bad} ({value[bad]!r}) must be {self.entry.text}"


@dataclass(frozen=True)
class OrNone(Rule):
    """`rule`, or None: the field is unset (its help says what unset means)."""

    rule: Rule

    @property
    def text(self) -> str:
        return f"{self.rule.text}, or unset"

    @property
    def in_help(self) -> bool:
        return self.rule.in_help

    @property
    def example(self) -> Any:
        return self.rule.example

    def accepts(self, value: Any) -> bool:
        return value is None or self.rule.accepts(value)

    def problem(self, value: Any) -> str | None:
        return None if value is None else self.rule.problem(value)


@dataclass(frozen=True)
class Checked(Rule):
    """Accepted when `complaint(value)` is None; otherwise the complaint says what is wrong."""

    description: str
    complaint: Callable[[Any], str | None]

    @property
    def text(self) -> str:
        return self.description

    def accepts(self, value: Any) -> bool:
        return self.complaint(value) is None

    def problem(self, value: Any) -> str | None:
        return self.complaint(value)


TEXT = Text()
PATH = Text(path=True)
FLAG = Kind(bool, "true or false")


def _report_to_complaint(value: Any) -> str | None:
    """Spelling only: whether a named tracker is installed is checked when the run starts."""
    try:
        parse_report_to(value)
    except ValueError as e:
        return str(e)
    return None


def _thresholds_complaint(value: Any) -> str | None:
    try:
        parse_thresholds(value)
    except (TypeError, ValueError) as e:
        return f"{e} (see docs/health.md)"
    return None


def _json_object_complaint(value: Any) -> str | None:
    """A mapping; JSON text from the command line has been parsed before the rules run (TrainConfig.__post_init__)."""
    if isinstance(value, Mapping):
        return None
    hint = """must be a JSON object, e.g. '{"key": value}'"""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError as e:
            return f"{hint} (it is not JSON: {e})"
    return hint


# A dict field, given as a JSON object on the command line as transformers reads its dict flags.
JSON_OBJECT = Checked("a JSON object", _json_object_complaint)


def _help(text: str, rule: Rule) -> dict:
    """Field metadata: the --help text, ending with the valid values where the type does not say them, and the rule."""
    return {"help": f"{text} Valid: {rule.text}." if rule.in_help else text, "rule": rule}


def _default(f: Field) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None if f.default is MISSING else f.default


def _rule_of(f: Field) -> Rule:
    rule = f.metadata["rule"]
    return rule.rule if isinstance(rule, OrNone) else rule


def _check_field(f: Field, value: Any) -> None:
    """Raise a ConfigError if `value` breaks field `f`'s rule: field, value, valid range and a fix."""
    rule: Rule = f.metadata["rule"]
    problem = rule.problem(value)
    if problem is None:
        return
    example = rule.example if rule.example is not None else _default(f)
    fix = ""
    if example is not None:
        shown = " ".join(map(str, example)) if isinstance(example, (list, tuple)) else example
        fix = f" Pass e.g. --{f.name} {shown}{', or leave it out' if isinstance(rule, OrNone) else ''}."
    raise ConfigError(f"{f.name}={value!r}: {problem}.{fix}")


@dataclass
class TrainConfig:
    """Fields shared by every trainer (names and meanings as TRL's / transformers' TrainingArguments)."""

    # --- where things go -------------------------------------------------------------------------
    output_dir: str | None = field(
        default=None,
        metadata=_help(
            "Run directory: resolved config, metrics.jsonl, samples, checkpoints. Default: runs/<run_name>.",
            OrNone(PATH),
        ),
    )
    exp_name: str = field(default="run", metadata=_help("Experiment name, used in the default run name.", TEXT))
    run_name: str | None = field(
        default=None,
        metadata=_help("Run name shown by the trackers. Default: <exp_name>-<seed>-<time>.", OrNone(TEXT)),
    )
    project: str = field(
        default="huggingface",
        metadata=_help(
            "Tracker project (Trackio, and W&B unless $WANDB_PROJECT names it), TRL's default name included.", TEXT
        ),
    )
    report_to: list[str] | None = field(
        default_factory=lambda: ["trackio"],
        metadata=_help(
            "Trackers (several allowed).",
            Checked(f"tracker names: {', '.join(REPORT_TO_NAMES)}", _report_to_complaint),
        ),
    )
    logging_dir: str | None = field(
        default=None, metadata=_help("TensorBoard log directory. Default: <output_dir>/runs.", OrNone(PATH))
    )
    log_legacy_names: bool = field(
        default=False,
        metadata=_help(
            "Also send every metric to the trackers under the name TRL's original PPOTrainer used "
            "(env/reward_mean, ppo/mean_scores, ppo/policy/approxkl, ...), for dashboards built for it.",
            FLAG,
        ),
    )
    logging_steps: int = field(
        default=1,
        metadata=_help("Log metrics every this many training steps (logging_strategy steps).", integer(ge=1)),
    )
    logging_strategy: str = field(
        default="steps",
        metadata=_help(
            "When a row of training metrics is logged (each row pools every step since the previous one): steps "
            "(every logging_steps steps and after the last), epoch (after each pass over the prompts and after the "
            "last step), no (no training rows: evaluation rows are still logged, but the health checks, which read "
            "the rows, do not run).",
            OneOf(LOGGING_STRATEGIES),
        ),
    )
    logging_first_step: bool = field(
        default=False, metadata=_help("Also log a row after the first step (whatever logging_strategy).", FLAG)
    )
    save_strategy: str = field(
        default="steps",
        metadata=_help(
            "When checkpoints are saved during training: steps (every save_steps steps), epoch (after each pass "
            "over the prompts), no (none). Either way the final checkpoint and the trained model are saved at the "
            "end.",
            OneOf(SAVE_STRATEGIES, unsupported=_best_checkpoint),
        ),
    )
    save_steps: int = field(
        default=500,
        metadata=_help(
            "Save a checkpoint every this many training steps with save_strategy steps (0: none during training); "
            "the final checkpoint and the model are saved at the end either way.",
            integer(ge=0),
        ),
    )
    save_total_limit: int | None = field(
        default=None,
        metadata=_help(
            "Keep at most this many checkpoints (oldest removed). Default: all.", OrNone(integer(ge=1, example=2))
        ),
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata=_help(
            "Continue a run exactly from a checkpoint-N directory, or 'latest' in --output_dir.", OrNone(PATH)
        ),
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata=_help("Start afresh in an --output_dir that already holds a run (its files are replaced).", FLAG),
    )
    max_nonfinite_steps: int = field(
        default=3,
        metadata=_help(
            "Optimizer steps with a NaN/inf loss or gradient are skipped; after this many in a row training stops "
            "with a checkpoint of the last good state.",
            integer(ge=1),
        ),
    )
    seed: int = field(
        default=42,
        metadata=_help(
            "Random seed (sampling, data order, initialisation).",
            # accelerate adds the process index to the seed, and NumPy refuses seeds of 2**32 or more.
            integer(ge=0, le=2**31 - 1),
        ),
    )
    health: str = field(
        default="warn",
        metadata=_help(
            "Health checks on the logged metrics (docs/health.md): off; warn (print, log and record findings in "
            "health.jsonl); stop (also end training with a checkpoint on a critical finding, exit status 3).",
            OneOf(HEALTH_MODES),
        ),
    )
    health_thresholds: str | None = field(
        default=None,
        metadata=_help(
            "Override health-check thresholds: 'name=value,name=value' (docs/health.md).",
            OrNone(Checked("name=value pairs of docs/health.md's thresholds", _thresholds_complaint)),
        ),
    )

    # --- models and data -------------------------------------------------------------------------
    model_name_or_path: str | None = field(
        default=None,
        metadata=_help(
            "Policy (and tokenizer): a hub id or a local directory. Without any model flag, the built-in task is used.",
            OrNone(PATH),
        ),
    )
    model_revision: str = field(
        default="main", metadata=_help("Revision (branch, tag or commit) of the hub ids of every model flag.", TEXT)
    )
    trust_remote_code: bool = field(
        default=False, metadata=_help("Allow custom model code from the checkpoints. Off unless asked.", FLAG)
    )
    disable_dropout: bool = field(
        default=True,
        metadata=_help(
            "Turn dropout off in every model, so that a rollout's log-probs and the update's agree: PPO's first "
            "ratio is exactly 1, and GRPO's reused batches (num_iterations > 1) stay exact. On by default for both "
            "trainers, as TRL's PPO always does; TRL's GRPO defaults to false. --disable_dropout false keeps the "
            "checkpoints' dropout.",
            FLAG,
        ),
    )
    dataset_name: str | None = field(
        default=None,
        metadata=_help(
            "Prompt dataset: a hub id, a directory (saved with save_to_disk, or holding data files) or a "
            ".json/.jsonl/.csv/.parquet file. Required with model flags; without them, the built-in task's prompts.",
            OrNone(PATH),
        ),
    )
    dataset_config: str | None = field(
        default=None, metadata=_help("Configuration (subset) of the dataset, as load_dataset's name.", OrNone(TEXT))
    )
    dataset_train_split: str = field(default="train", metadata=_help("Split used for training.", TEXT))
    dataset_test_split: str = field(
        default="test", metadata=_help("Split used for sample generations and evaluation.", TEXT)
    )
    dataset_text_field: str = field(default="prompt", metadata=_help("Column holding the prompt text.", TEXT))
    max_prompt_length: int | None = field(
        default=None,
        metadata=_help(
            "Prompts longer than this many tokens are dropped or truncated (prompt_overflow).",
            OrNone(integer(ge=1, example=512)),
        ),
    )
    prompt_overflow: str = field(
        default="drop",
        metadata=_help(
            "What to do with prompts longer than max_prompt_length: drop them, or truncate them (keep the last "
            "max_prompt_length tokens, as TRL does). Either way the count is reported.",
            OneOf(PROMPT_OVERFLOW),
        ),
    )
    shuffle_dataset: bool = field(
        default=True,
        metadata=_help(
            "Draw the prompts in a new random order (from seed) on every pass; false: in dataset order, pass after "
            "pass. A resumed run continues the order exactly either way.",
            FLAG,
        ),
    )
    dataset_num_proc: int | None = field(
        default=None,
        metadata=_help(
            "Processes for the dataset's map/filter while preparing the prompts (unset: this process).",
            OrNone(integer(ge=1, example=4)),
        ),
    )
    task: str | None = field(
        default=None,
        metadata=_help(
            "task.json (or its directory) whose check function measures true success (eval/task_success).",
            OrNone(PATH),
        ),
    )

    # --- rewards: functions (both trainers) and weights; each trainer adds its reward models ----------------
    reward_funcs: list[str] | None = field(
        default=None,
        metadata=_help(
            "Reward functions f(prompts, completions, **columns) -> list[float | None] (sync or async): the task's "
            "built-in rewards (e.g. correctness), TRL's built-in names (think_format_reward, "
            "get_soft_overlong_punishment, accuracy_reward with math-verify), or references 'module:function', "
            "'module.function' (TRL's form) or 'path/to/file.py:function'. GRPO's default: the task's rewards. PPO: "
            "scored beside reward_model_path, which becomes optional.",
            OrNone(ListOf(TEXT)),
        ),
    )
    reward_weights: list[float] | None = field(
        default=None,
        metadata=_help(
            "Weight of each reward: reward_funcs, then the reward models (reward_model_path). Default: all 1.",
            OrNone(ListOf(number(), example=[1.0, 0.5])),
        ),
    )

    # --- LoRA adapters (peft) and quantised loading: TRL's ModelConfig names and defaults -------------
    use_peft: bool = field(
        default=False,
        metadata=_help(
            "Train a LoRA adapter on the policy (peft) instead of all its weights. The reference is the same model "
            "with the adapter disabled (no second copy); PPO's value model gets its own adapter, its score head "
            "trained in full. Checkpoints and output_dir hold the adapters (docs/algorithms/ppo.md, LoRA).",
            FLAG,
        ),
    )
    lora_r: int = field(default=16, metadata=_help("LoRA rank (with use_peft).", integer(ge=1)))
    lora_alpha: int = field(
        default=32, metadata=_help("LoRA alpha: the adapter's output is scaled by alpha / r.", integer(ge=1))
    )
    lora_dropout: float = field(
        default=0.05,
        metadata=_help(
            "Dropout on the adapters' inputs. Like all dropout it is off while disable_dropout is on (the default, "
            "so that PPO's first ratio is exactly 1): pass --disable_dropout false to use it.",
            number(ge=0, lt=1),
        ),
    )
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata=_help(
            "Modules that get adapters: names (e.g. q_proj v_proj; a module matches when its name ends with one) "
            "or all-linear (every linear layer but the output head). Default: peft's choice for the architecture "
            "(q_proj and v_proj for Llama).",
            OrNone(ListOf(TEXT)),
        ),
    )
    lora_modules_to_save: list[str] | None = field(
        default=None,
        metadata=_help(
            "Policy modules trained in full beside the adapter and saved with it (e.g. lm_head).",
            OrNone(ListOf(TEXT)),
        ),
    )
    lora_task_type: str = field(
        default="CAUSAL_LM",
        metadata=_help(
            "peft task type of the policy's adapter (the policy is a causal LM; PPO's value adapter is SEQ_CLS).",
            OneOf(("CAUSAL_LM",), unsupported=_other_task_types),
        ),
    )
    use_rslora: bool = field(
        default=False, metadata=_help("Rank-stabilised LoRA: scale by alpha / sqrt(r) instead of alpha / r.", FLAG)
    )
    use_dora: bool = field(
        default=False, metadata=_help("DoRA: weight-decomposed LoRA (a magnitude vector per adapted layer).", FLAG)
    )
    merge_adapter: bool = field(
        default=False,
        metadata=_help(
            "With use_peft: also save the policy with the adapter merged into its weights, a plain transformers "
            "model, in output_dir/merged/ (after the final checkpoint, which keeps the adapter).",
            FLAG,
        ),
    )
    load_in_4bit: bool = field(
        default=False,
        metadata=_help(
            "Load the policy's base weights in 4 bits (bitsandbytes; QLoRA: needs use_peft and a CUDA GPU). "
            "Untested in rlhfkit's CI, which has no GPU.",
            FLAG,
        ),
    )
    load_in_8bit: bool = field(
        default=False,
        metadata=_help(
            "Load the policy's base weights in 8 bits (bitsandbytes; needs use_peft and a CUDA GPU). Untested in "
            "rlhfkit's CI, which has no GPU.",
            FLAG,
        ),
    )
    bnb_4bit_quant_type: str = field(
        default="nf4", metadata=_help("4-bit quantisation type (load_in_4bit).", OneOf(("nf4", "fp4")))
    )
    use_bnb_nested_quant: bool = field(
        default=False, metadata=_help("Quantise the 4-bit quantisation constants too (load_in_4bit).", FLAG)
    )
    bnb_4bit_quant_storage: str | None = field(
        default=None,
        metadata=_help(
            "dtype the 4-bit weights are stored in (load_in_4bit; e.g. bfloat16 to shard them with FSDP). Default: "
            "uint8.",
            OrNone(OneOf(("uint8", "float16", "bfloat16", "float32"))),
        ),
    )

    # --- optimisation ------------------------------------------------------------------------------
    learning_rate: float = field(
        default=3e-6,
        metadata=_help(
            "Peak learning rate, scaled step by step by lr_scheduler_type (default: linear decay to 0).", number(gt=0)
        ),
    )
    lr_scheduler_type: str = field(
        default="linear",
        metadata=_help(
            "Learning-rate schedule, computed by transformers' own schedules as TRL steps them: step s (1-based) "
            "uses learning_rate x the schedule's factor after s-1 scheduler steps, so a warm-up starts at 0. "
            "constant ignores the warm-up (as in transformers); cosine_with_min_lr needs lr_scheduler_kwargs "
            "min_lr_rate or min_lr.",
            OneOf(LR_SCHEDULER_TYPES, unsupported=_other_schedules),
        ),
    )
    lr_scheduler_kwargs: dict | str | None = field(
        default=None,
        metadata=_help(
            "Extra arguments of the schedule, as JSON on the command line: e.g. '{\"min_lr_rate\": 0.1}' for "
            "cosine_with_min_lr, '{\"num_cycles\": 0.5}' for cosine.",
            OrNone(JSON_OBJECT),
        ),
    )
    warmup_steps: float = field(
        default=0,
        metadata=_help(
            "Warm-up steps (linear from 0 to learning_rate): a count, or a number in (0, 1) for that share of the "
            "steps, as in transformers 5. Overrides warmup_ratio.",
            number(ge=0),
        ),
    )
    warmup_ratio: float = field(
        default=0.0,
        metadata=_help("Share of the steps used for linear warm-up (older transformers' flag).", number(ge=0, lt=1)),
    )
    optim: str = field(
        default="adamw_torch_fused",
        metadata=_help(
            "Optimizer: adamw_torch (torch's AdamW), adamw_torch_fused (the same, fused into one kernel where torch "
            "has one for the device), sgd (torch's SGD, no momentum), adafactor (transformers' Adafactor at "
            "learning_rate: no relative step, no parameter scaling, as transformers' Trainer builds it).",
            OneOf(OPTIMIZERS, unsupported=_other_optimizers),
        ),
    )
    per_device_train_batch_size: int = field(default=64, metadata=_help("Micro-batch size per device.", integer(ge=1)))
    per_device_eval_batch_size: int = field(
        default=64, metadata=_help("Batch size per device for sample generations.", integer(ge=1))
    )
    gradient_accumulation_steps: int = field(
        default=1, metadata=_help("Micro-batches accumulated per device into each optimizer step.", integer(ge=1))
    )
    num_train_epochs: float = field(
        default=3.0, metadata=_help("Passes over the prompts when no length is set.", number(gt=0))
    )
    max_grad_norm: float | None = field(
        default=None,
        metadata=_help(
            "Clip the gradient norm to this value (0 or unset: no clipping, as in transformers).",
            OrNone(number(ge=0, example=1.0)),
        ),
    )
    weight_decay: float = field(
        default=0.0,
        metadata=_help(
            "Weight decay of the optimizer, on every parameter (transformers' Trainer exempts biases and norm "
            "weights).",
            number(ge=0),
        ),
    )
    adam_beta1: float = field(default=0.9, metadata=_help("AdamW beta1 (adamw_* optimizers).", number(ge=0, lt=1)))
    adam_beta2: float = field(default=0.999, metadata=_help("AdamW beta2 (adamw_* optimizers).", number(ge=0, lt=1)))
    # 0 is legal in torch, but a parameter whose gradient stays 0 then gets 0 / 0 = NaN updates.
    adam_epsilon: float = field(default=1e-8, metadata=_help("AdamW epsilon (adamw_* optimizers).", number(gt=0)))
    temperature: float = field(
        default=0.7, metadata=_help("Sampling temperature (also applied to the log-probs).", number(gt=0))
    )
    num_sample_generations: int = field(
        default=10,
        metadata=_help(
            "With eval_strategy no: how many times during training (and before it) to log sample completions and "
            "evaluate (0: never), as TRL's PPO does.",
            integer(ge=0),
        ),
    )
    eval_strategy: str = field(
        default="no",
        metadata=_help(
            "When to evaluate (eval metrics on the eval split and the completions table) instead of the "
            "num_sample_generations schedule: no (that schedule), steps (every eval_steps steps and after the "
            "last), epoch (after each pass over the prompts and after the last step).",
            OneOf(EVAL_STRATEGIES),
        ),
    )
    eval_steps: int | None = field(
        default=None,
        metadata=_help(
            "Evaluate every this many steps with eval_strategy steps. Default: logging_steps (as transformers).",
            OrNone(integer(ge=1, example=100)),
        ),
    )
    eval_on_start: bool = field(
        default=False,
        metadata=_help("Also evaluate before the first step (the num_sample_generations schedule always does).", FLAG),
    )

    # --- precision and memory ----------------------------------------------------------------------
    bf16: bool | None = field(
        default=None,
        metadata=_help(
            "bfloat16 mixed precision (accelerate's autocast over fp32 weights), as in TRL. Default: the accelerate "
            "launch config's mixed_precision, else on where the device is fast at it (a CUDA GPU with bf16 units); "
            "off on a CPU, where bf16 is ~9x slower than fp32.",
            OrNone(FLAG),
        ),
    )
    fp16: bool = field(
        default=False,
        metadata=_help("float16 mixed precision with loss scaling (accelerate's GradScaler); CUDA GPUs only.", FLAG),
    )
    dtype: str | None = field(
        default=None,
        metadata=_help(
            "Weight dtype of the loaded models (TRL's ModelConfig): bfloat16 or float16 trains pure low-precision "
            "weights (no fp32 master copy), auto keeps the checkpoint's. Default: float32 weights (with --bf16 / "
            "--fp16 mixed precision on top).",
            OrNone(OneOf(("auto", "float32", "bfloat16", "float16"))),
        ),
    )
    attn_implementation: str | None = field(
        default=None,
        metadata=_help(
            "Attention implementation of the loaded models (TRL's ModelConfig), e.g. sdpa, eager or "
            "flash_attention_2; default: transformers' choice.",
            OrNone(TEXT),
        ),
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata=_help(
            "Recompute activations in the backward pass instead of keeping them (policy and value model): less "
            "memory, about a third more compute. TRL turns it on by default; rlhfkit leaves the choice to you.",
            FLAG,
        ),
    )
    gradient_checkpointing_kwargs: dict | str | None = field(
        default=None,
        metadata=_help(
            "Arguments of transformers' gradient_checkpointing_enable, as JSON: e.g. '{\"use_reentrant\": true}'. "
            "Default: use_reentrant false (no input gradients needed, works with frozen embeddings and LoRA).",
            OrNone(JSON_OBJECT),
        ),
    )
    ds3_gather_for_generation: bool = field(
        default=True,
        metadata=_help(
            "Under DeepSpeed ZeRO-3 or FSDP (accelerate launch --config_file): gather the policy's full weights on "
            "every process while it samples, as TRL does, so decoding runs without a collective per token. rlhfkit "
            "always gathers (sampling sharded is not supported): false is refused.",
            FLAG,
        ),
    )

    def __post_init__(self) -> None:
        for f in fields(self):  # JSON text of a dict field (from the command line) becomes the dict
            value = getattr(self, f.name)
            if _rule_of(f) is JSON_OBJECT and isinstance(value, str):
                try:
                    parsed = json.loads(value)
                except ValueError:
                    parsed = None  # the rule says what is wrong
                if isinstance(parsed, dict):
                    setattr(self, f.name, parsed)
        self._apply_aliases()
        for f in fields(self):
            _check_field(f, getattr(self, f.name))
        self._check_combinations()

    def _apply_aliases(self) -> None:
        """Accepted spellings turned into the canonical value, before the rules see them."""
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        # transformers (so TRL) turns clipping off with max_grad_norm=0, and a flag cannot say None; clipping to a
        # norm of 0 would zero every gradient.
        if self.max_grad_norm == 0:
            self.max_grad_norm = None

    def _check_combinations(self) -> None:
        """Rules that tie fields together (each field has passed its own rule)."""
        if self.fp16 and self.bf16:
            raise ConfigError("fp16=True and bf16=True: choose one precision. Pass only one of --fp16 and --bf16.")
        if self.lr_scheduler_kwargs or self.lr_scheduler_type == "cosine_with_min_lr":
            self._check_schedule()
        self._check_lora()
        # Without reward_funcs the count may be the task's (GRPO), known once the task is loaded: the trainer checks.
        if self.reward_weights is not None and self.reward_funcs:
            sources = [*self.reward_funcs, *self.reward_model_paths()]
            if len(self.reward_weights) != len(sources):
                raise ConfigError(
                    f"reward_weights={self.reward_weights!r}: needs one weight per reward, in the order of "
                    f"reward_funcs then reward_model_path ({', '.join(map(str, sources))}), but has "
                    f"{len(self.reward_weights)}. Pass e.g. --reward_weights {' '.join(['1.0'] * len(sources))}."
                )

    def reward_model_paths(self) -> list[str]:
        """The reward models named by path, weighted after reward_funcs (each trainer has its own field)."""
        return []

    def _check_lora(self) -> None:
        """LoRA and quantisation flags that only make sense together. (Whether bitsandbytes and a CUDA GPU exist is
        checked before the models load: models.quantization_config.)"""
        if self.load_in_4bit and self.load_in_8bit:
            raise ConfigError("load_in_4bit=True and load_in_8bit=True: choose one. Pass only one of them.")
        quantised = "load_in_4bit" if self.load_in_4bit else "load_in_8bit" if self.load_in_8bit else None
        if quantised and not self.use_peft:
            raise ConfigError(
                f"{quantised}=True without use_peft: quantised weights cannot be trained directly. Add --use_peft to "
                f"train a LoRA adapter on them (QLoRA), or leave --{quantised} out."
            )
        if self.merge_adapter and not self.use_peft:
            raise ConfigError("merge_adapter=True without use_peft: there is no adapter to merge. Add --use_peft.")
        if self.merge_adapter and quantised:
            raise ConfigError(
                f"merge_adapter=True with {quantised}=True: merging into quantised weights loses precision. Train "
                "with --merge_adapter false, then merge the saved adapter into the unquantised base model with peft "
                "(PeftModel.from_pretrained(base, output_dir).merge_and_unload())."
            )
        if self.lora_target_modules is not None and "all-linear" in self.lora_target_modules:
            if len(self.lora_target_modules) > 1:
                raise ConfigError(
                    f"lora_target_modules={self.lora_target_modules!r}: all-linear stands alone. Pass "
                    "--lora_target_modules all-linear, or module names only."
                )

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PPOConfig(TrainConfig):
    """Hyper-parameters of :class:`rlhfkit.PPOTrainer` (names and meanings as in TRL's ``PPOConfig``)."""

    exp_name: str = field(default="ppo", metadata=_help("Experiment name, used in the default run name.", TEXT))
    sft_model_path: str | None = field(
        default=None,
        metadata=_help(
            "Policy and reference initialisation (hub id or local directory). Default: model_name_or_path.",
            OrNone(PATH),
        ),
    )
    reward_model_path: str | None = field(
        default=None,
        metadata=_help(
            "Reward model (sequence classification, 1 label, the policy's vocabulary; hub id or local directory); "
            "the value model starts from it. Optional with reward_funcs; without either, a randomly initialised "
            "score head on the SFT model (a smoke test, as TRL's example).",
            OrNone(PATH),
        ),
    )
    value_model_path: str | None = field(
        default=None,
        metadata=_help(
            "Value model initialisation. Default: reward_model_path; with reward_funcs alone, the policy's weights "
            "with a fresh score head that starts at 0.",
            OrNone(PATH),
        ),
    )

    # --- batch sizes and length of training ------------------------------------------------------
    per_device_train_batch_size: int = field(
        default=64, metadata=_help("Micro-batch size per device for the PPO updates.", integer(ge=1))
    )
    gradient_accumulation_steps: int = field(
        default=1,
        metadata=_help(
            "Each device collects per_device_train_batch_size x gradient_accumulation_steps rollouts per update; "
            "a multiple of num_mini_batches.",
            integer(ge=1),
        ),
    )
    num_mini_batches: int = field(
        default=1, metadata=_help("Mini-batches (optimizer steps) per PPO epoch.", integer(ge=1))
    )
    num_ppo_epochs: int = field(default=4, metadata=_help("Passes over each rollout batch.", integer(ge=1)))
    total_episodes: int | None = field(
        default=None,
        metadata=_help(
            "Total prompts to train on. Default: num_train_epochs x dataset size.",
            OrNone(integer(ge=1, example=10000)),
        ),
    )
    local_rollout_forward_batch_size: int = field(
        default=64, metadata=_help("Per-device batch size of generation and scoring forwards.", integer(ge=1))
    )
    max_grad_norm: float | None = field(
        default=None,
        metadata=_help(
            "Clip the gradient norm to this value (0 or unset: no clipping, the default as in TRL's PPO).",
            OrNone(number(ge=0, example=1.0)),
        ),
    )

    # --- generation --------------------------------------------------------------------------------
    response_length: int = field(default=53, metadata=_help("Maximum new tokens per response.", integer(ge=1)))
    stop_token: str | None = field(
        default=None,
        metadata=_help("'eos': truncate responses after the EOS token.", OrNone(OneOf(("eos",), example="eos"))),
    )
    stop_token_id: int | None = field(
        default=None,
        metadata=_help("Truncate responses after this token id.", OrNone(integer(ge=0, why="a token id"))),
    )
    missing_eos_penalty: float | None = field(
        default=None,
        metadata=_help(
            "Subtract this from the score of responses without the stop token (TRL: a positive value).",
            OrNone(number(ge=0, example=1.0)),
        ),
    )
    non_eos_penalty: bool = field(
        default=False,
        metadata=_help("Replace the score of responses without the stop token by penalty_reward_value.", FLAG),
    )
    penalty_reward_value: float = field(default=-1.0, metadata=_help("Score given by non_eos_penalty.", number()))

    # --- PPO ---------------------------------------------------------------------------------------
    kl_coef: float = field(
        default=0.05, metadata=_help("KL penalty coefficient (initial value when adaptive).", number(ge=0))
    )
    kl_estimator: str = field(
        default="k1",
        metadata=_help("Per-token KL estimator in the reward: k1 (log-ratio) or k3.", OneOf(PPO_KL_ESTIMATORS)),
    )
    kl_target: float | None = field(
        default=None,
        metadata=_help("Adaptive KL: target of objective/kl (off when unset).", OrNone(number(gt=0, example=6.0))),
    )
    kl_horizon: int = field(default=10000, metadata=_help("Adaptive KL: horizon in episodes.", integer(ge=1)))
    cliprange: float = field(default=0.2, metadata=_help("Policy ratio clip range.", number(gt=0)))
    cliprange_value: float = field(default=0.2, metadata=_help("Value clip range.", number(gt=0)))
    vf_coef: float = field(default=0.1, metadata=_help("Value loss coefficient.", number(ge=0)))
    gamma: float = field(default=1.0, metadata=_help("Discount factor.", number(ge=0, le=1)))
    lam: float = field(default=0.95, metadata=_help("GAE lambda.", number(ge=0, le=1)))
    whiten_rewards: bool = field(
        default=False, metadata=_help("Whiten the per-token rewards (keeping their mean) before GAE.", FLAG)
    )

    # --- older TRL API (accepted as aliases) -------------------------------------------------------
    model_name: str | None = field(
        default=None, metadata=_help("Alias of model_name_or_path (older TRL API).", OrNone(PATH))
    )
    log_with: str | None = field(default=None, metadata=_help("Alias of report_to (older TRL API).", OrNone(TEXT)))
    project_kwargs: dict | str | None = field(
        default=None,
        metadata=_help(
            "Older TRL API: {'logging_dir': PATH} sets logging_dir (JSON on the command line).", OrNone(JSON_OBJECT)
        ),
    )

    def _apply_aliases(self) -> None:
        if self.model_name and not self.model_name_or_path:
            self.model_name_or_path = self.model_name
        if self.log_with:
            self.report_to = [self.log_with]
        if (
            isinstance(self.project_kwargs, Mapping)
            and self.project_kwargs.get("logging_dir")
            and not self.logging_dir
        ):
            self.logging_dir = str(self.project_kwargs["logging_dir"])
        super()._apply_aliases()

    def reward_model_paths(self) -> list[str]:
        return [self.reward_model_path] if self.reward_model_path else []

    def _check_combinations(self) -> None:
        super()._check_combinations()
        # A mini-batch, per_device x GA / num_mini_batches rollouts, must be a whole number of per_device
        # micro-batches: GA a multiple of num_mini_batches (ppo_batch_sizes relies on it).
        accumulation, mini_batches = self.gradient_accumulation_steps, self.num_mini_batches
        if accumulation % mini_batches:
            fewer = max(d for d in range(1, mini_batches) if accumulation % d == 0)
            raise ConfigError(
                f"gradient_accumulation_steps={accumulation}, num_mini_batches={mini_batches}: "
                "gradient_accumulation_steps must be a multiple of num_mini_batches, so that each mini-batch is a "
                f"whole number of per_device_train_batch_size ({self.per_device_train_batch_size}) micro-batches. "
                f"Pass e.g. --gradient_accumulation_steps {mini_batches}, or --num_mini_batches {fewer}."
            )


@dataclass
class GRPOConfig(TrainConfig):
    """Hyper-parameters of :class:`rlhfkit.GRPOTrainer` (names, meanings and defaults as in TRL's ``GRPOConfig``).

    As in TRL, ``per_device_train_batch_size`` counts completions: 16 with ``num_generations=8`` is 2 prompts.
    """

    exp_name: str = field(default="grpo", metadata=_help("Experiment name, used in the default run name.", TEXT))
    reward_model_path: list[str] | None = field(
        default=None,
        metadata=_help(
            "Reward models (sequence classification, 1 label, own tokenizer; hub ids or local directories) added to "
            "reward_funcs.",
            OrNone(ListOf(PATH)),
        ),
    )
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata=_help(
            "TRL's grpo script's name for one reward model: added to reward_model_path (after its entries).",
            OrNone(PATH),
        ),
    )

    # --- batch sizes and length of training ------------------------------------------------------
    learning_rate: float = field(
        default=1e-6,
        metadata=_help(
            "Peak learning rate, scaled step by step by lr_scheduler_type (default: linear decay to 0).", number(gt=0)
        ),
    )
    per_device_train_batch_size: int = field(
        default=8,
        metadata=_help(
            "Completions per device per micro-batch. A group's completions may span micro-batches and devices: "
            "only the generation batch must hold whole groups.",
            integer(ge=1),
        ),
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata=_help(
            "Micro-batches each generation is split into (TRL): one generation holds per_device_train_batch_size x "
            "steps_per_generation completions per device. Default: gradient_accumulation_steps (one generation per "
            "optimizer step). Set at most one of this and generation_batch_size.",
            OrNone(integer(ge=1)),
        ),
    )
    generation_batch_size: int | None = field(
        default=None,
        metadata=_help(
            "Completions per generation, all devices (TRL): a multiple of per_device_train_batch_size x processes "
            "and of num_generations. Default: per_device_train_batch_size x processes x steps_per_generation.",
            OrNone(integer(ge=1)),
        ),
    )
    max_steps: int = field(
        default=-1,
        metadata=_help(
            "Optimizer steps to train for; -1: num_train_epochs passes over the prompts.", integer(ge=1, also=(-1,))
        ),
    )
    num_iterations: int = field(
        default=1,
        metadata=_help("Optimizer steps on each generated batch (mu in the GRPO paper).", integer(ge=1)),
    )
    max_grad_norm: float | None = field(
        default=1.0,
        metadata=_help(
            "Clip the gradient norm to this value (0: no clipping, as in transformers).", OrNone(number(ge=0))
        ),
    )
    logging_steps: int = field(
        default=10,
        metadata=_help("Log metrics every this many optimizer steps (logging_strategy steps).", integer(ge=1)),
    )
    log_completions: bool = field(
        default=False,
        metadata=_help(
            "Also log the completions table at every logging step (it is always logged when the run evaluates: "
            "eval_strategy, by default num_sample_generations times).",
            FLAG,
        ),
    )
    num_completions_to_print: int | None = field(
        default=8,
        metadata=_help(
            "Rows of each completions table printed to the console (all are logged; unset: all).",
            OrNone(integer(ge=0)),
        ),
    )

    # --- generation --------------------------------------------------------------------------------
    num_generations: int = field(
        default=8,
        metadata=_help(
            "Completions sampled per prompt (the group size G).",
            integer(ge=2, why="group-relative advantages compare completions of the same prompt"),
        ),
    )
    max_prompt_length: int | None = field(
        default=512,
        metadata=_help(
            "Prompts longer than this many tokens are dropped or truncated (prompt_overflow).",
            OrNone(integer(ge=1)),
        ),
    )
    max_completion_length: int = field(
        default=256, metadata=_help("Maximum new tokens per completion.", integer(ge=1))
    )
    temperature: float = field(
        default=1.0, metadata=_help("Sampling temperature (also applied to the log-probs).", number(gt=0))
    )
    top_p: float = field(
        default=1.0,
        metadata=_help("Nucleus sampling: keep the smallest set of tokens with this mass.", number(gt=0, le=1)),
    )
    top_k: int = field(default=0, metadata=_help("Sample among the k most likely tokens (0: all).", integer(ge=0)))
    min_p: float | None = field(
        default=None,
        metadata=_help(
            "Drop tokens less likely than min_p x the most likely token's probability (transformers' min_p).",
            OrNone(number(ge=0, le=1, example=0.05)),
        ),
    )
    repetition_penalty: float = field(
        default=1.0,
        metadata=_help(
            "Divide the logits of tokens already in the prompt or completion by this (CTRL's penalty; 1: off). "
            "Sampling only: the log-probs of the loss are the unpenalised model's.",
            number(gt=0),
        ),
    )
    generation_kwargs: dict | str | None = field(
        default=None,
        metadata=_help(
            "Further transformers GenerationConfig fields, as JSON; they override the flags above. Options the "
            "lean decoding loop does not implement send generation to model.generate (said once).",
            OrNone(JSON_OBJECT),
        ),
    )
    cache_implementation: str | None = field(
        default=None,
        metadata=_help(
            "KV cache of the sampler (TRL's flag): unset or dynamic, transformers' DynamicCache with eager steps; "
            "static, a StaticCache and a torch.compile'd one-token step (compiled once per batch shape; a few "
            "percent faster generations on a CPU, unmeasured on a GPU: docs/algorithms/grpo.md).",
            OrNone(OneOf(("dynamic", "static"))),
        ),
    )
    num_generations_eval: int | None = field(
        default=None,
        metadata=_help(
            "Evaluation: sample this many completions per eval prompt at the training temperature (TRL). Unset: "
            "one greedy completion per prompt (rlhfkit's default, a deterministic curve).",
            OrNone(integer(ge=1)),
        ),
    )

    # --- GRPO --------------------------------------------------------------------------------------
    beta: float = field(
        default=0.0,
        metadata=_help("KL coefficient to the reference model (k3); 0 loads no reference model.", number(ge=0)),
    )
    # 0 is allowed: with num_iterations=1 every ratio is 1 and the clip never binds.
    epsilon: float = field(
        default=0.2,
        metadata=_help("Lower clip range of the ratio: clip(r, 1 - epsilon, ...).", number(ge=0)),
    )
    epsilon_high: float | None = field(
        default=None,
        metadata=_help(
            "Upper clip range: clip(r, ..., 1 + epsilon_high). Default: epsilon.",
            OrNone(number(ge=0, example=0.28)),
        ),
    )
    loss_type: str = field(
        default="dapo",
        metadata=_help(
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
        metadata=_help(
            "token: one ratio per token (GRPO); sequence: one ratio per completion, the exp of its mean token "
            "log-ratio (GSPO).",
            OneOf(IMPORTANCE_SAMPLING_LEVELS),
        ),
    )
    delta: float | None = field(
        default=None,
        metadata=_help(
            "Two-sided clipping: cap the unclipped ratio at delta as well (INTELLECT-2); greater than "
            "1 + epsilon_high. Unset: off.",
            OrNone(number(gt=1, example=4.0)),
        ),
    )
    use_bias_correction_kl: bool = field(
        default=True,
        metadata=_help(
            "Multiply the k3 KL term by the importance ratio, in the loss and in the logged kl (TRL 1.16's default; "
            "false: the plain k3 term of the GRPO paper). Only matters with beta > 0.",
            FLAG,
        ),
    )
    top_entropy_quantile: float = field(
        default=1.0,
        metadata=_help(
            "Policy loss only on the tokens whose entropy is in this top share of the micro-batch's completion "
            "tokens (Wang et al. 2025, 0.2 there); 1: every token.",
            number(gt=0, le=1),
        ),
    )
    sapo_temperature_pos: float = field(
        default=1.0,
        metadata=_help("loss_type sapo: temperature of the soft gate for positive advantages.", number(gt=0)),
    )
    sapo_temperature_neg: float = field(
        default=1.05,
        metadata=_help("loss_type sapo: temperature of the soft gate for negative advantages.", number(gt=0)),
    )
    vespo_k_pos: float = field(
        default=2.0, metadata=_help("loss_type vespo: shape k of the gamma weight, A >= 0.", number(ge=0))
    )
    vespo_lambda_pos: float = field(
        default=3.0, metadata=_help("loss_type vespo: rate lambda of the gamma weight, A >= 0.", number(ge=0))
    )
    vespo_k_neg: float = field(
        default=3.0, metadata=_help("loss_type vespo: shape k of the gamma weight, A < 0.", number(ge=0))
    )
    vespo_lambda_neg: float = field(
        default=2.0, metadata=_help("loss_type vespo: rate lambda of the gamma weight, A < 0.", number(ge=0))
    )
    sync_ref_model: bool = field(
        default=False,
        metadata=_help(
            "Move the reference towards the policy every ref_model_sync_steps steps (TR-DPO): "
            "ref <- alpha x policy + (1 - alpha) x ref. Needs beta > 0 and no --use_peft.",
            FLAG,
        ),
    )
    ref_model_mixup_alpha: float = field(
        default=0.6, metadata=_help("sync_ref_model: the policy's share alpha.", number(ge=0, le=1))
    )
    ref_model_sync_steps: int = field(
        default=512, metadata=_help("sync_ref_model: optimizer steps between syncs.", integer(ge=1))
    )
    scale_rewards: str = field(
        default="group",
        metadata=_help(
            "Divide group-centred rewards by the std of the group, of the batch, or not at all "
            "(true = group, false = none).",
            OneOf(GROUP_SCALES),
        ),
    )
    mask_truncated_completions: bool = field(
        default=False, metadata=_help("Leave completions that hit max_completion_length out of the loss.", FLAG)
    )

    def _apply_aliases(self) -> None:
        if self.reward_model_name_or_path:
            self.reward_model_path = [*(self.reward_model_path or []), self.reward_model_name_or_path]
            self.reward_model_name_or_path = None  # moved: a config built again from to_dict() must not add it twice
        scale = self.scale_rewards
        if isinstance(scale, bool) or str(scale).lower() in ("true", "false"):
            self.scale_rewards = "group" if str(scale).lower() == "true" else "none"
        super()._apply_aliases()

    def reward_model_paths(self) -> list[str]:
        return list(self.reward_model_path or [])

    def _check_combinations(self) -> None:
        super()._check_combinations()
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        owned = sorted(set(self.generation_kwargs or {}) & {"temperature", "max_new_tokens", "do_sample"})
        if owned:
            raise ConfigError(
                f"generation_kwargs sets {', '.join(owned)}: use --temperature / --max_completion_length instead; "
                "the loss's log-probs and the completion mask read those flags, so they must match the sampler."
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
        if self.sync_ref_model and (self.beta == 0.0 or self.use_peft):
            why = (
                "beta is 0, so there is no reference model"
                if self.beta == 0.0
                else ("with --use_peft the reference is the policy with its adapter disabled, not a model of its own")
            )
            raise ConfigError(
                f"sync_ref_model needs a reference model to move, but {why}. Set --beta > 0 without "
                "--use_peft, or leave sync_ref_model off."
            )
        # The launcher's process count (accelerate launch sets WORLD_SIZE); the trainer checks again with its own.
        grpo_generation_shape(self, int(os.environ.get("WORLD_SIZE", "1")))


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


def grpo_generation_shape(args: GRPOConfig, world_size: int) -> tuple[int, int]:
    """(steps_per_generation, global completions per generation) as TRL derives them; ConfigError when the
    generation batch does not hold whole groups or whole micro-batches."""
    micro = args.per_device_train_batch_size * world_size  # completions of one micro-step, all processes
    if args.generation_batch_size is not None:
        steps = exact_div(
            args.generation_batch_size,
            micro,
            f"generation_batch_size must be a multiple of per_device_train_batch_size x processes ({micro})",
        )
    else:
        steps = args.steps_per_generation or args.gradient_accumulation_steps
    completions = micro * steps
    if completions % args.num_generations:
        g = args.num_generations
        fits = g // math.gcd(g, micro)  # the smallest steps_per_generation that holds whole groups
        raise ConfigError(
            f"a generation of {completions} completions (per_device_train_batch_size {args.per_device_train_batch_size}"
            f" x {world_size} process(es) x steps_per_generation {steps}) does not hold whole groups of "
            f"num_generations {g}. Make it a multiple of {g}: e.g. --steps_per_generation "
            f"{fits * max(1, math.ceil(steps / fits))}, or --per_device_train_batch_size {g}."
        )
    return steps, completions


class GRPOBatchSizes(NamedTuple):
    """Batch arithmetic of GRPO as TRL's (see docs/algorithms/grpo.md)."""

    local_completions: (
        int  # completions per device per generation = per_device_train_batch_size x steps_per_generation
    )
    prompts: int  # prompts per generation, all devices
    completions: int  # completions per generation, all devices
    steps_per_generation: int  # micro-batches one generation is split into
    micro_steps_per_generation: int  # micro-batches a generation serves: steps_per_generation x num_iterations
    num_steps: int  # optimizer steps in the run (gradient_accumulation_steps micro-batches each)


def grpo_batch_sizes(args: GRPOConfig, world_size: int, dataset_size: int) -> GRPOBatchSizes:
    steps, completions = grpo_generation_shape(args, world_size)
    prompts = completions // args.num_generations
    served = steps * args.num_iterations
    if args.max_steps > 0:
        num_steps = args.max_steps
    else:
        generations = math.ceil(args.num_train_epochs * dataset_size / prompts)
        num_steps = math.ceil(generations * served / args.gradient_accumulation_steps)
    if num_steps < 1:
        raise ConfigError("max_steps must be >= 1 (or set num_train_epochs with a non-empty dataset).")
    local = args.per_device_train_batch_size * steps
    return GRPOBatchSizes(local, prompts, completions, steps, served, num_steps)


def warmup_steps(args: TrainConfig, num_steps: int) -> int:
    """Warm-up steps of a run of `num_steps` steps, as transformers counts them: warmup_steps when >= 1, a share of
    the steps when in (0, 1), else ceil(warmup_ratio x num_steps); at most num_steps - 1 (a one-step run learns)."""
    share = args.warmup_steps if 0 < args.warmup_steps < 1 else args.warmup_ratio
    count = int(args.warmup_steps) if args.warmup_steps >= 1 else math.ceil(share * num_steps)
    return max(0, min(count, num_steps - 1))


def lr_factor(args: TrainConfig, num_steps: int) -> Callable[[int], float]:
    """transformers' --lr_scheduler_type schedule for a `num_steps`-step run with warmup_steps(args, num_steps) of
    warm-up: the factor of learning_rate after k scheduler steps (k = 0, 1, ...), taken from the LambdaLR that
    transformers' get_scheduler builds (a pure function of k). rlhfkit.trainers.common.lr_schedule turns it into the
    learning rate of each step."""
    import torch
    from transformers import get_scheduler

    probe = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)  # the schedule reads nothing else
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        probe,
        num_warmup_steps=warmup_steps(args, num_steps),
        num_training_steps=num_steps,
        scheduler_specific_kwargs=dict(args.lr_scheduler_kwargs or {}),
    )
    (factor,) = scheduler.lr_lambdas
    return factor


def config_field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]
