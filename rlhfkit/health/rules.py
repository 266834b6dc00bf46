"""Health rules: the reference docs' "crucial values" and "watch for stability" advice as checks.

A rule reads a few metrics from the stream that the trainer logs (one row of scalars per step), and
says whether something looks wrong *now*: a severity, the numbers that triggered it, and a message.
Rules are data (a list of :class:`Rule` with a plain check function); every threshold lives in
:class:`Thresholds`, so calibrating a rule never means editing a check.

Windows count *observations of the metric*, not steps: rows at eval steps carry only ``eval/*`` keys
and GRPO rows may lack rollout metrics, so "the last 5 values of ``val/ratio``" skips those rows. A window's
length is set in steps of a run that logs every step; a run that logs every k steps (TRL's ``logging_steps``)
logs the mean of those k steps in each row, so its windows hold a k-th as many observations
(:meth:`Thresholds.for_interval`): a window means the same stretch of training whatever the logging interval.
Non-finite values are kept out of the windows (one NaN would turn every median into NaN); the
``nonfinite_metric`` and ``value_loss_spike`` rules look at them directly.

Metric names come from the registry. A rule's ``condition`` is documentation: its ``$name``
placeholders are Thresholds fields, filled in with their values in docs/health.md.

This module is pure Python (stdlib and the stdlib-only metric registry): the trainers, the ``doctor``
command and tests share it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

from rlhfkit.metrics import registry as M

INFO, WARNING, CRITICAL = "info", "warning", "critical"
SEVERITIES: tuple[str, ...] = (INFO, WARNING, CRITICAL)  # in increasing order of urgency
# --health: no checks; report findings; also end training on a critical one (HealthWatch, rlhfkit/health/watch.py).
HEALTH_MODES: tuple[str, ...] = ("off", "warn", "stop")

# The metrics the rules read.
RATIO, VALUE_LOSS, VALUE_CLIPFRAC = M.VAL_RATIO.name, M.LOSS_VALUE_AVG.name, M.VAL_CLIPFRAC_AVG.name
CLIPFRAC, APPROXKL = M.POLICY_CLIPFRAC_AVG.name, M.POLICY_APPROXKL_AVG.name
PPO_KL, GRPO_KL, KL_COEF = M.OBJECTIVE_KL.name, M.KL.name, M.OBJECTIVE_KL_COEF.name
ENTROPIES = (M.OBJECTIVE_ENTROPY.name, M.POLICY_ENTROPY_AVG.name, M.ENTROPY.name)
GRPO_REWARD = M.REWARD.name
CLIPPED, ZERO_STD = M.COMPLETIONS_CLIPPED_RATIO.name, M.FRAC_REWARD_ZERO_STD.name
CLIP_REGION = M.CLIP_RATIO_REGION_MEAN.name
RESPONSE_LENGTH = M.TOKENS_RESPONSES_LEN_MEAN.name  # to put PPO's KL per sequence on GRPO's per-token scale
# The per-token entropies (exact, at the sampling temperature) with the mean completion length of the same trainer:
# their product is the entropy of a whole completion.
TOKEN_ENTROPIES = ((M.POLICY_ENTROPY_AVG.name, RESPONSE_LENGTH), (M.ENTROPY.name, M.COMPLETIONS_MEAN_LENGTH.name))
LOGP_GAP = M.SAMPLING_LOGP_DIFFERENCE_MEAN.name
# Asynchronous generation: the policy that sampled a batch against the trainer's at the update.
MISMATCH_KL, MASKED_FRAC = M.OFF_POLICY_MISMATCH_KL.name, M.OFF_POLICY_MASKED_FRAC.name
STALENESS = M.ASYNC_STALENESS_MEAN.name
PPO_SCORES_STD, GRPO_REWARD_STD = M.OBJECTIVE_SCORES_STD.name, M.REWARD_STD.name
RETURNS_VAR = M.RETURNS_VAR.name
VPRED, VALUES_MEAN = M.VAL_VPRED.name, M.VAL_MEAN.name
# Over-optimisation: the score the policy is trained on (PPO: the reward model's / functions' score; GRPO: the total
# reward) against the task's true success (its checker), on sampled (rollout/) or greedy eval (eval/) completions.
PPO_SCORES, TRUE_SUCCESS = M.OBJECTIVE_SCORES.name, (M.ROLLOUT_TASK_SUCCESS.name, M.EVAL_TASK_SUCCESS.name)
# Agents: multi-turn episodes with tools. Each tool's own failure share is a templated name (tools/<tool>/...).
TOOL_CALLS, TOOL_FAILURES = M.TOOLS_CALL_FREQUENCY.name, M.TOOLS_FAILURE_FREQUENCY.name
TURN_CAP, ROLLED_BACK = M.TOOLS_TURN_CAP_RATIO.name, M.TOOLS_ROLLED_BACK_RATIO.name
TOOL_FAILURE_PREFIX, TOOL_FAILURE_SUFFIX = M.TOOLS_TOOL_FAILURE_FREQUENCY.name.split("{tool_name}")


def _knob(default: float | int, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Thresholds:
    """Every number the rules compare against, with its default. Units are the metric's own.

    Defaults are calibrated on the labelled run set of bench/health (healthy and sick PPO and GRPO runs of the
    built-in task): no finding on any healthy run, every failure mode caught; docs/health.md has the measurement and
    tests/bench/health/test_detection.py keeps it true.
    """

    # Windows, in observations of the metric concerned.
    smooth_window: int = _knob(5, "Observations whose median is a metric's current level (and its start level).")
    quiet_observations: int = _knob(
        10, "A rule that stopped firing must stay quiet this many evaluations before it is reported again."
    )
    # PPO probability ratio.
    ratio_warning_low: float = _knob(0.5, f"`{RATIO}` at or below this is a warning.")
    ratio_warning_high: float = _knob(2.0, f"`{RATIO}` at or above this is a warning.")
    ratio_critical_low: float = _knob(0.1, f"`{RATIO}` at or below this is critical.")
    ratio_critical_high: float = _knob(10.0, f"`{RATIO}` at or above this is critical.")
    # Value loss.
    value_loss_window: int = _knob(
        20, f"Previous observations of `{VALUE_LOSS}` whose median a spike is measured against."
    )
    value_loss_spike_factor: float = _knob(5.0, "A value loss this many times its recent median is a spike.")
    value_loss_critical_factor: float = _knob(
        100.0, "A single value loss this many times the run's first is critical (needs no history)."
    )
    value_loss_critical_min: float = _knob(
        1.0, "... and at least this large (squared reward units): a tiny first value loss does not make 0.05 a crisis."
    )
    value_clipfrac_warning: float = _knob(
        0.15, f"`{VALUE_CLIPFRAC}` level (median of smooth_window) at which the value model moves too fast."
    )
    value_still: float = _knob(
        4e-6,
        f"`{VPRED}` within this fraction of the returns' spread (sqrt of `{RETURNS_VAR}`) of `{VALUES_MEAN}`, median "
        "of smooth_window: the value model's predictions did not move in its updates (a frozen one: about 1e-6, "
        "float rounding; the nearest healthy run 1.5e-5).",
    )
    value_policy_moved: float = _knob(
        1e-10,
        f"... while `{APPROXKL}` (median of smooth_window) is at least this: the policy moved in the same updates. With "
        "one optimizer step per update neither moves before its step (float rounding, about 1e-14), and there is "
        "nothing to tell; a LoRA policy's smallest was 5e-9.",
    )
    # Policy update size.
    clipfrac_high: float = _knob(0.3, f"`{CLIPFRAC}` level that counts as high.")
    approxkl_high: float = _knob(0.1, f"`{APPROXKL}` level (nats/token) that counts as high.")
    approxkl_critical: float = _knob(
        1.0, f"A single `{APPROXKL}` above this (nats/token) is critical: one update moved the policy that far."
    )
    # KL to the reference.
    kl_window: int = _knob(20, "Observations per window of the KL checks.")
    kl_negative_below: float = _knob(-0.05, "A KL window mean below this counts as negative.")
    kl_growth_factor: float = _knob(2.5, "KL window median this many times the previous window's is runaway growth.")
    kl_trend_window: int = _knob(60, "Latest KL observations whose trend (a steady climb) is tested.")
    kl_trend_rise: float = _knob(
        0.25,
        "A KL climb over kl_trend_window observations (the Theil-Sen slope times the window, nats/token; PPO's per "
        "sequence divided by the median completion length) from which a steady climb is a runaway.",
    )
    kl_trend_z: float = _knob(
        3.0, "The climb must also be steady: a Mann-Kendall trend statistic (z) over the same window at least this."
    )
    kl_floor: float = _knob(5.0, f"PPO `{PPO_KL}` (nats/sequence) below this never counts as runaway.")
    grpo_kl_floor: float = _knob(0.05, f"GRPO `{GRPO_KL}` (nats/token) below this never counts as runaway.")
    kl_coef_rise_factor: float = _knob(2.0, f"`{KL_COEF}` this many times its first value has risen a lot.")
    kl_coef_window: int = _knob(10, f"Recent changes of `{KL_COEF}` inspected for a steady rise.")
    kl_coef_rise_share: float = _knob(0.8, "Share of those changes that must be increases.")
    kl_critical: float = _knob(
        2.0,
        "A single KL to the reference above this (nats/token; PPO's per sequence divided by the mean completion "
        "length) is critical.",
    )
    kl_level_warning: float = _knob(
        0.5, "A KL median over kl_window observations above this (nats/token) is a policy far from the reference."
    )
    kl_start_warning: float = _knob(
        0.01,
        "A KL above this (nats/token) at step 1, before any update, means the reference is not the starting policy.",
    )
    # Entropy.
    entropy_collapse_fraction: float = _knob(0.1, "Entropy below this fraction of its start level has collapsed.")
    entropy_critical_fraction: float = _knob(
        0.05, "A single entropy observation below this fraction of the run's first is critical (needs no window)."
    )
    entropy_rise_factor: float = _knob(
        2.0,
        "Per-token entropy level (median of smooth_window) at this many times its start level (median of its first "
        "smooth_window): the policy is going random.",
    )
    entropy_rise_with_fall: float = _knob(
        1.5,
        "... at this many times its start level while the trained-on score falls (reward_fall_z): critical, the policy "
        "going random.",
    )
    completion_entropy_low: float = _knob(
        round(math.log(2), 4),
        "Entropy of a whole completion (nats: the per-token entropy times the mean completion length, medians of "
        "smooth_window) below this, ln 2, means fewer than two equally likely completions per prompt: sampling is "
        "nearly greedy.",
    )
    # Reward against true success (over-optimisation).
    overopt_window: int = _knob(3, "Observations of the score and of rollout task success averaged into their levels.")
    overopt_success_drop: float = _knob(
        0.05, "The least fall of true success (a fraction) below its best level that counts as over-optimisation."
    )
    overopt_success_z: float = _knob(
        3.0, "The fall of true success must also be this many times the noise of a difference of two levels."
    )
    overopt_score_z: float = _knob(
        1.0, "The score must rise meanwhile by at least this many times the noise of a difference of two levels."
    )
    overopt_eval_window: int = _knob(3, "Latest evaluations of eval/task_success averaged for its current level.")
    overopt_score_rise: float = _knob(
        0.3, "Rise of the score over its start level (reward units) from which eval/task_success is checked."
    )
    overopt_success_gain: float = _knob(
        0.02, "eval/task_success at most this much above its start level (a fraction) counts as flat or falling."
    )
    # The trained-on reward itself.
    reward_collapse_spreads: float = _knob(
        0.75, "The reward's level this many spreads (its median std) below its best level is a collapse."
    )
    reward_history: int = _knob(50, "Observations of the reward and of true success whose levels are compared.")
    reward_fall_z: float = _knob(
        3.0,
        "The reward has fallen when its level (median of smooth_window) is this many noise units below its median over "
        "the earlier observations of the last reward_history (a noise unit: the step-to-step noise of the reward, the root mean square "
        "of its successive differences over sqrt(2), times sqrt(2 / smooth_window)): a flat, noisy reward's dips are "
        "not falls.",
    )
    # GRPO.
    clipped_ratio_warning: float = _knob(0.5, f"`{CLIPPED}` level that is a warning.")
    clipped_ratio_critical: float = _knob(
        0.9, f"`{CLIPPED}` level that is critical when held over clipped_sustained and the reward falls."
    )
    clipped_sustained: int = _knob(
        20, f"Observations over which `{CLIPPED}` (median) must stay at clipped_ratio_critical to be critical."
    )
    clipped_recovering: float = _knob(
        0.1,
        f"`{CLIPPED}` level this far below its highest level so far: the model is learning to stop (a starting model "
        "that rambles), which is no finding.",
    )
    zero_std_warning: float = _knob(0.5, f"`{ZERO_STD}` level that is a warning.")
    zero_std_critical: float = _knob(
        0.95,
        f"`{ZERO_STD}` level that is critical when held over zero_std_sustained near the reward's lowest level: "
        "nearly nothing left to learn from.",
    )
    zero_std_sustained: int = _knob(
        20, f"Observations over which `{ZERO_STD}` (median) must stay at zero_std_critical to be critical."
    )
    reward_top: float = _knob(
        0.67,
        "The reward's level at or above this position in the range of its observations so far (0: the lowest, 1: the "
        f"highest): groups without spread are solved ones, `{ZERO_STD}` reports info (nothing left to learn).",
    )
    reward_bottom: float = _knob(
        0.33,
        "The reward's level at or below this position in its range (or a reward that never moved): groups without "
        "spread are failed ones, no learning signal.",
    )
    clip_region_warning: float = _knob(0.2, f"`{CLIP_REGION}` level that is a warning.")
    # Sampling against training.
    logprob_gap_warning: float = _knob(
        0.05, f"`{LOGP_GAP}` (nats/token) above this is a warning: sampling and training disagree."
    )
    logprob_gap_critical: float = _knob(0.5, f"`{LOGP_GAP}` (nats/token) above this is critical.")
    # Asynchronous generation: the sampling policy against the training one.
    off_policy_kl_warning: float = _knob(
        0.2,
        f"`{MISMATCH_KL}` level (median of smooth_window, nats/token) at which the batches are too far off-policy "
        "for the correction to mend.",
    )
    off_policy_kl_critical: float = _knob(
        1.0, f"A single `{MISMATCH_KL}` above this (nats/token) is critical: the sampler's policy is another one."
    )
    off_policy_masked_warning: float = _knob(
        0.1, f"`{MASKED_FRAC}` level (median of smooth_window) at which too much of each batch no longer trains."
    )
    # Reward scale.
    reward_scale_factor: float = _knob(
        100.0, "A reward spread (std) this many times its median over the previous observations is a scale jump."
    )
    reward_scale_window: int = _knob(10, "Previous observations of the reward spread a jump is measured against.")
    # A solved task: a deterministic policy and groups without spread are convergence there, not a failure.
    solved_success: float = _knob(
        0.9,
        f"`{TRUE_SUCCESS[0]}` (its latest observation, or its best mean of overopt_window in a row) at or above "
        "this: the task was solved, and entropy_collapse, "
        "sampling_nearly_greedy and reward_zero_std report info, not warnings (only for tasks with a checker).",
    )
    # Agents (episodes with tools).
    tools_unused_level: float = _knob(
        0.02, f"`{TOOL_CALLS}` (calls per episode) at or below this counts as no tool use."
    )
    tools_unused_observations: int = _knob(
        10, f"Latest observations of `{TOOL_CALLS}` that must all show no tool use (the first smooth_window too)."
    )
    tool_failure_warning: float = _knob(
        0.5, f"`{TOOL_FAILURES}`, or one tool's failure share, at this level (median of smooth_window) is a warning."
    )
    turn_cap_warning: float = _knob(0.5, f"`{TURN_CAP}` level (median of smooth_window) that is a warning.")
    tool_use_start_level: float = _knob(
        0.2, f"`{TOOL_CALLS}` start level (median of its first smooth_window) from which abandoning the tools counts."
    )
    tool_use_drop_fraction: float = _knob(
        0.25, f"`{TOOL_CALLS}` level below this fraction of its start level has abandoned the tools."
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            if isinstance(f.default, int) and getattr(self, f.name) < 1:
                raise ValueError(f"health threshold {f.name} must be a positive integer, got {getattr(self, f.name)}")
        low_c, low_w, high_w, high_c = (
            self.ratio_critical_low, self.ratio_warning_low, self.ratio_warning_high, self.ratio_critical_high
        )  # fmt: skip
        if not low_c <= low_w < 1 < high_w <= high_c:
            raise ValueError(
                "health thresholds must satisfy ratio_critical_low <= ratio_warning_low < 1 < ratio_warning_high "
                "<= ratio_critical_high"
            )

    def for_interval(self, interval: int) -> Thresholds:
        """These thresholds for a run that logs every `interval` steps: each window of WINDOWS holds
        ceil(window / interval) observations (at least one), since each row is the mean of `interval` steps."""
        if interval <= 1:
            return self
        return replace(self, **{name: max(1, math.ceil(getattr(self, name) / interval)) for name in WINDOWS})

    def history_length(self) -> int:
        """How many recent observations of each metric the rules can look at."""
        windows = (self.smooth_window, self.value_loss_window + 1, 2 * self.kl_window, self.kl_coef_window + 1)
        windows += (self.kl_trend_window,)
        windows += (self.clipped_sustained, self.zero_std_sustained)
        return max(*windows, self.reward_history, self.reward_scale_window + 1, self.tools_unused_observations)

    def start_length(self) -> int:
        """How many first observations of each metric the rules can look at (their start levels)."""
        return max(self.smooth_window, self.overopt_window)


# The thresholds that count observations of a metric logged every step (Thresholds.for_interval).
WINDOWS: tuple[str, ...] = (
    "smooth_window",
    "quiet_observations",
    "value_loss_window",
    "kl_window",
    "kl_trend_window",
    "kl_coef_window",
    "overopt_window",
    "reward_history",
    "reward_scale_window",
    "tools_unused_observations",
    "clipped_sustained",
    "zero_std_sustained",
)


def parse_thresholds(spec: Thresholds | Mapping[str, Any] | str | None) -> Thresholds:
    """Thresholds from a mapping (YAML config), text ``name=value,name=value`` or a JSON object (CLI).

    Unnamed thresholds keep their defaults; an unknown name is an error listing the valid ones, so a
    typo cannot silently leave a default in place.
    """
    if isinstance(spec, Thresholds):
        return spec
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return Thresholds()
    if isinstance(spec, str):
        text = spec.strip()
        if text.startswith("{"):
            try:
                values = json.loads(text)
            except ValueError as e:
                raise ValueError(f"health thresholds are not valid JSON: {e}") from None
        else:
            values = {}
            for part in filter(None, (p.strip() for p in text.split(","))):
                name, sep, value = part.partition("=")
                if not sep:
                    raise ValueError(f"health threshold {part!r} is not of the form name=value")
                values[name.strip()] = value.strip()
    else:
        values = dict(spec)
    if not isinstance(values, dict):
        raise ValueError(f"health thresholds must be name=value pairs or a JSON object, got {spec!r}")
    defaults = {f.name: f.default for f in fields(Thresholds)}
    unknown = sorted(set(values) - set(defaults))
    if unknown:
        raise ValueError(f"unknown health threshold(s) {', '.join(unknown)}; known: {', '.join(defaults)}")
    return Thresholds(**{name: _convert(name, value, defaults[name]) for name, value in values.items()})


def _convert(name: str, value: Any, default: float | int) -> float | int:
    """`value` as a number of the default's type; an int threshold refuses 2.5 rather than truncating it."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if math.isnan(number) or (isinstance(default, int) and not number.is_integer()):
        kind = "an integer" if isinstance(default, int) else "a number"
        raise ValueError(f"health threshold {name}={value!r} is not {kind}")
    return int(number) if isinstance(default, int) else number


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class History:
    """What the rules may look at: the latest row, per metric its recent and its first finite values and the range
    of all of them, and the run's logging interval."""

    GAPS = 20  # step gaps between training rows from which the logging interval is taken

    def __init__(self, maxlen: int, first_n: int):
        self.step: int | None = None
        self.row: dict[str, float] = {}
        self._maxlen, self._first_n = maxlen, first_n
        self._recent: dict[str, deque[float]] = {}
        self._first: dict[str, list[float]] = {}
        self._count: dict[str, int] = {}
        self._range: dict[str, tuple[float, float]] = {}
        self._last_training_step: int | None = None
        self._gaps: list[int] = []

    def add(self, step: int, scalars: Mapping[str, Any]) -> None:
        self.step = step
        self.row = {k: float(v) for k, v in scalars.items() if _is_number(v)}
        for name, value in self.row.items():
            if not math.isfinite(value):
                continue
            self._recent.setdefault(name, deque(maxlen=self._maxlen)).append(value)
            self._count[name] = self._count.get(name, 0) + 1
            first = self._first.setdefault(name, [])
            if len(first) < self._first_n:
                first.append(value)
            low, high = self._range.get(name, (value, value))
            self._range[name] = (min(low, value), max(high, value))
        if any(not name.startswith("eval/") for name in self.row):  # an evaluation's row says nothing of the interval
            if (
                self._last_training_step is not None
                and step > self._last_training_step
                and len(self._gaps) < self.GAPS
            ):
                self._gaps.append(step - self._last_training_step)
            self._last_training_step = step

    @property
    def interval(self) -> int:
        """Steps between logged training rows (the median of the first gaps; 1 until there is one): TRL's
        logging_steps, rlhfkit's 1."""
        return statistics.median_low(self._gaps) if self._gaps else 1

    def range(self, name: str) -> tuple[float, float] | None:
        """The lowest and the highest finite observation of `name` in the run, or None before the first."""
        return self._range.get(name)

    def values(self, name: str) -> list[float]:
        """Recent finite observations of `name`, oldest first (at most `maxlen`)."""
        return list(self._recent.get(name, ()))

    def count(self, name: str) -> int:
        """How many finite observations of `name` the run has had."""
        return self._count.get(name, 0)

    def first(self, name: str) -> list[float]:
        """The first `first_n` finite observations of `name` in the run."""
        return list(self._first.get(name, ()))


class Hit(NamedTuple):
    """A rule firing at one step: how bad, the numbers behind it, what happened in words, and the threshold each
    metric was held against (the evidence a report draws)."""

    severity: str
    metrics: dict[str, float]
    message: str
    thresholds: Mapping[str, float] = {}


@dataclass(frozen=True)
class Rule:
    """One health check.

    name: snake_case id, used in findings, docs and health.jsonl.
    metrics: the metrics it reads. It is evaluated only on rows carrying at least one of them (an
        empty tuple: every row), so a PPO-only rule stays silent in a GRPO run and vice versa.
    severities: what it can report (for the docs).
    condition: when it fires, for the docs; ``$name`` placeholders are Thresholds fields.
    advice: what it usually means and what to try.
    check: (history, thresholds) -> Hit or None.
    """

    name: str
    metrics: tuple[str, ...]
    severities: tuple[str, ...]
    condition: str
    advice: str
    check: Callable[[History, Thresholds], Hit | None]

    def applies_to(self, row: Mapping[str, Any]) -> bool:
        return not self.metrics or any(m in row for m in self.metrics)


def _over(n: int) -> str:
    """How a level of n observations is described: the median of the last n, or the last one itself."""
    return "the last observation" if n == 1 else f"median of the last {n} observations"


def _g(x: float) -> str:
    return f"{x:.3g}"


# ----------------------------------------------------------------------------------------------
# Checks. Each returns a Hit or None and reads only what its Rule declares.
# ----------------------------------------------------------------------------------------------


def check_ratio(h: History, t: Thresholds) -> Hit | None:
    x = h.row.get(RATIO)
    if x is None or not math.isfinite(x):
        return None  # NaN is nonfinite_metric's business
    if not t.ratio_critical_low < x < t.ratio_critical_high:
        severity, low, high = CRITICAL, t.ratio_critical_low, t.ratio_critical_high
    elif not t.ratio_warning_low < x < t.ratio_warning_high:
        severity, low, high = WARNING, t.ratio_warning_low, t.ratio_warning_high
    else:
        return None
    crossed = low if x <= low else high
    return Hit(severity, {RATIO: x}, f"{RATIO} = {_g(x)}, not inside ({low:g}, {high:g}).", {RATIO: crossed})


def check_value_loss(h: History, t: Thresholds) -> Hit | None:
    x = h.row.get(VALUE_LOSS)
    if x is None:
        return None
    if not math.isfinite(x):
        return Hit(CRITICAL, {VALUE_LOSS: x}, f"{VALUE_LOSS} is {x}.")
    first = h.first(VALUE_LOSS)[0]
    limit = max(t.value_loss_critical_factor * first, t.value_loss_critical_min)
    if first > 0 and x >= limit:  # a catastrophe needs no window
        return Hit(
            CRITICAL, {VALUE_LOSS: x}, f"{VALUE_LOSS} = {_g(x)}, {x / first:.0f}x its first value {_g(first)}.",
            {VALUE_LOSS: limit},
        )  # fmt: skip
    previous = h.values(VALUE_LOSS)[:-1][-t.value_loss_window :]  # [-1] is x itself
    if len(previous) < t.smooth_window:
        return None  # too little history for a median worth comparing with
    median = statistics.median(previous)
    if median > 0 and x >= t.value_loss_spike_factor * median:
        return Hit(
            WARNING,
            {VALUE_LOSS: x},
            f"{VALUE_LOSS} = {_g(x)}, {x / median:.1f}x its median {_g(median)} over the previous "
            f"{len(previous)} observations.",
            {VALUE_LOSS: t.value_loss_spike_factor * median},
        )
    return None


def check_value_clipping(h: History, t: Thresholds) -> Hit | None:
    level = _level(h, VALUE_CLIPFRAC, t.smooth_window)
    if level is None or level < t.value_clipfrac_warning:
        return None
    return Hit(
        WARNING,
        {VALUE_CLIPFRAC: level},
        f"{VALUE_CLIPFRAC} = {_g(level)} ({_over(t.smooth_window)}): that share of the value "
        "predictions moved past cliprange_value in one update.",
        {VALUE_CLIPFRAC: t.value_clipfrac_warning},
    )


class ValueMovement(NamedTuple):
    moved: float  # |val/vpred - val/mean| / sqrt(returns/var), median of smooth_window
    policy: float  # policy/approxkl_avg, median of smooth_window


def value_movement(h: History, t: Thresholds) -> ValueMovement | None:
    """How far the value model's predictions moved within its updates: |val/vpred - val/mean| (the mean prediction
    during the update's optimizer steps against the rollout's) over the returns' spread, and how far the policy moved
    in the same updates; None until the window is full, without returns' variance, or while the policy did not move
    either (one optimizer step per update: neither moves before its step, and there is nothing to tell)."""
    n = t.smooth_window
    vpred, values, returns_var = h.values(VPRED)[-n:], h.values(VALUES_MEAN)[-n:], h.values(RETURNS_VAR)[-n:]
    policy = h.values(APPROXKL)[-n:]
    if VPRED not in h.row or min(len(vpred), len(values), len(returns_var), len(policy)) < n or min(returns_var) <= 0:
        return None
    moves = [abs(a - b) / math.sqrt(v) for a, b, v in zip(vpred, values, returns_var, strict=True)]
    found = ValueMovement(statistics.median(moves), statistics.median(policy))
    return found if found.policy >= t.value_policy_moved else None


def check_value_learning(h: History, t: Thresholds) -> Hit | None:
    """The value model stopped learning: its predictions during the update (val/vpred) equal the rollout's
    (val/mean) to float rounding, over smooth_window updates in which the policy moved. Its parameters are not
    trained (a learning rate scheduled to 0, parameters frozen or missing from the optimizer, no gradient). With
    one optimizer step per update neither model moves before its step, and the rule is silent."""
    found = value_movement(h, t)
    if found is None or found.moved >= t.value_still:
        return None
    return Hit(
        WARNING,
        {VPRED: h.row[VPRED], VALUES_MEAN: h.row[VALUES_MEAN]},
        f"{VPRED} - {VALUES_MEAN} is {_g(found.moved)} of the returns' spread ({_over(t.smooth_window)})"
        f" while the policy moved ({APPROXKL} median {_g(found.policy)}): the value model's predictions do "
        "not change when it is updated.",
    )


def check_nonfinite(h: History, t: Thresholds) -> Hit | None:
    bad = {name: value for name, value in h.row.items() if not math.isfinite(value)}
    if not bad:
        return None
    shown = ", ".join(f"{name} = {value}" for name, value in list(bad.items())[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return Hit(CRITICAL, bad, f"{len(bad)} non-finite metric(s): {shown}{more}.")


def check_update_size(h: History, t: Thresholds) -> Hit | None:
    now = h.row.get(APPROXKL)
    if now is not None and now >= t.approxkl_critical:  # one update that large is a catastrophe: no window
        return Hit(
            CRITICAL, {APPROXKL: now}, f"{APPROXKL} = {_g(now)} nats/token in one update (>= {t.approxkl_critical:g}).",
            {APPROXKL: t.approxkl_critical},
        )  # fmt: skip
    n = t.smooth_window
    clipfrac, approxkl = h.values(CLIPFRAC)[-n:], h.values(APPROXKL)[-n:]
    if len(clipfrac) < n or len(approxkl) < n:
        return None
    c, k = statistics.median(clipfrac), statistics.median(approxkl)
    if c >= t.clipfrac_high and k >= t.approxkl_high:
        return Hit(
            WARNING,
            {CLIPFRAC: c, APPROXKL: k},
            f"median over the last {n} updates: {CLIPFRAC} = {_g(c)} (>= {t.clipfrac_high:g}) and "
            f"{APPROXKL} = {_g(k)} (>= {t.approxkl_high:g}).",
            {CLIPFRAC: t.clipfrac_high, APPROXKL: t.approxkl_high},
        )
    return None


def _kl_metrics(h: History) -> list[str]:
    return [name for name in (PPO_KL, GRPO_KL) if name in h.row]


def check_kl_negative(h: History, t: Thresholds) -> Hit | None:
    for name in _kl_metrics(h):
        window = h.values(name)[-t.kl_window :]
        if len(window) == t.kl_window and statistics.fmean(window) < t.kl_negative_below:
            mean = statistics.fmean(window)
            return Hit(
                WARNING, {name: mean}, f"{name} averaged {_g(mean)} over the last {t.kl_window} observations.",
                {name: t.kl_negative_below},
            )  # fmt: skip
    return None


def theil_sen_slope(values: list[float]) -> float:
    """The median of the slopes between every pair of observations (per observation): a trend that a few outliers
    or one jump do not move (Theil 1950, Sen 1968)."""
    n = len(values)
    return statistics.median((values[j] - values[i]) / (j - i) for i in range(n) for j in range(i + 1, n))


def mann_kendall_z(values: list[float]) -> float:
    """The Mann-Kendall trend statistic: S, the number of later-larger pairs minus later-smaller ones, over its
    standard deviation when the values are exchangeable (no trend), with a continuity correction. Ranks only, so it
    is scale-free: about N(0, 1) without a trend; a series that rises in most of its pairs is many units above 0."""
    n = len(values)
    s = sum((b > a) - (b < a) for i, a in enumerate(values) for b in values[i + 1 :])
    if n < 3 or s == 0:
        return 0.0
    return (s - math.copysign(1, s)) / math.sqrt(n * (n - 1) * (2 * n + 5) / 18)


class KLClimb(NamedTuple):
    rise: float  # nats/token over the window: the Theil-Sen slope times kl_trend_window, per token
    z: float  # the Mann-Kendall z of the window
    length: float  # tokens per completion the KL is divided by (1 for GRPO's per-token kl)


def _kl_trend_window(h: History, name: str, t: Thresholds) -> tuple[list[float], list[float]] | None:
    """The last kl_trend_window observations of a KL metric and, for PPO's per-sequence KL, of the mean completion
    length (GRPO's kl is per token: no lengths); None until the window is full."""
    values = h.values(name)[-t.kl_trend_window :]
    if len(values) < t.kl_trend_window:
        return None
    return values, (h.values(RESPONSE_LENGTH)[-t.kl_trend_window :] if name == PPO_KL else [])


def kl_climb(h: History, name: str, t: Thresholds) -> KLClimb | None:
    """The trend of the last kl_trend_window observations of a KL metric, once there are that many (PPO's divided by
    the median completion length over the same observations)."""
    window = _kl_trend_window(h, name, t)
    if window is None:
        return None
    values, lengths = window
    length = 1.0
    if name == PPO_KL:
        length = statistics.median(lengths) if lengths else 0.0
        if length <= 0:
            return None
    return KLClimb(theil_sen_slope(values) * t.kl_trend_window / length, mann_kendall_z(values), length)


def _may_climb(h: History, name: str, t: Thresholds) -> bool:
    """Whether the last kl_trend_window observations of a KL metric span enough to climb by kl_trend_rise, a cheap
    necessary condition for kl_climb's test (which takes all pairs of the window, w^2 / 2 of them). If the median
    slope s of the pairs is at least kl_trend_rise / w (per token), half the pairs have a slope of at least s; fewer
    than that are less than floor(w / 4) apart, so one pair at least floor(w / 4) apart rises by floor(w / 4) * s or
    more, and the window's range is at least that."""
    window = _kl_trend_window(h, name, t)
    if window is None:
        return False
    values, lengths = window
    w = t.kl_trend_window
    length = min(lengths, default=0.0) if name == PPO_KL else 1.0  # the median length is at least the shortest
    return max(values) - min(values) >= (w // 4) * t.kl_trend_rise * length / w


def _kl_climb_hit(h: History, name: str, t: Thresholds) -> Hit | None:
    """A steady climb: over the last kl_trend_window observations, the KL's Theil-Sen slope times the window is at
    least kl_trend_rise nats/token, and its Mann-Kendall z at least kl_trend_z (a rise that stands out of the noise;
    a level shift that holds for half the window passes too)."""
    if not _may_climb(h, name, t):
        return None
    climb = kl_climb(h, name, t)
    if climb is None or climb.rise < t.kl_trend_rise or climb.z < t.kl_trend_z:
        return None
    values = h.values(name)[-t.kl_trend_window :]
    return Hit(
        WARNING,
        {name: statistics.median(values[-t.smooth_window :])},
        f"{name} climbed steadily over the last {t.kl_trend_window} observations: by {_g(climb.rise)} nats/token "
        f"(Theil-Sen slope times the window), Mann-Kendall z = {climb.z:.1f}.",
        {name: statistics.median(values[: t.smooth_window]) + t.kl_trend_rise * climb.length},
    )


def check_kl_runaway(h: History, t: Thresholds) -> Hit | None:
    for name in _kl_metrics(h):
        floor = t.kl_floor if name == PPO_KL else t.grpo_kl_floor
        w = t.kl_window
        values = h.values(name)[-2 * w :]
        if len(values) == 2 * w:
            before, now = statistics.median(values[:w]), statistics.median(values[w:])
            if now >= floor and now >= t.kl_growth_factor * max(before, 0.0):
                return Hit(
                    WARNING,
                    {name: now},
                    f"{name} median rose from {_g(before)} to {_g(now)} between the previous and the last {w} "
                    "observations.",
                    {name: max(floor, t.kl_growth_factor * max(before, 0.0))},
                )
        climb = _kl_climb_hit(h, name, t)
        if climb is not None:
            return climb
    return None


def check_kl_coef(h: History, t: Thresholds) -> Hit | None:
    values, first = h.values(KL_COEF), h.first(KL_COEF)
    w = t.kl_coef_window
    if len(values) < w + 1 or not first or first[0] <= 0:
        return None
    recent = values[-(w + 1) :]
    rises = sum(b > a for a, b in zip(recent, recent[1:]))
    now = values[-1]
    if now >= t.kl_coef_rise_factor * first[0] and rises >= t.kl_coef_rise_share * w:
        return Hit(
            WARNING,
            {KL_COEF: now},
            f"{KL_COEF} = {_g(now)}, {now / first[0]:.1f}x its first value {_g(first[0])}, and it rose in "
            f"{rises} of the last {w} updates.",
            {KL_COEF: t.kl_coef_rise_factor * first[0]},
        )
    return None


def _solved(h: History, t: Thresholds, hit: Hit | None) -> Hit | None:
    """`hit` as info when the task's checker says the task was solved: rollout/task_success's latest observation, or
    its best mean of overopt_window consecutive observations over the history kept, >= solved_success. A policy that
    is right nearly every time has little left to sample differently and its groups little spread: the run converged.
    A later fall of success is reward_collapse's and reward_overoptimised's to report. Tasks without a checker keep
    the hit as it is."""
    if hit is None or TRUE_SUCCESS[0] not in h.row:
        return hit
    values, n = h.values(TRUE_SUCCESS[0]), t.overopt_window
    success = max([h.row[TRUE_SUCCESS[0]], *_trailing_means(values, min(n, len(values)) or 1)] if values else [-1.0])
    if not success >= t.solved_success:
        return hit
    note = f" True success is {success:.0%}: the task looks solved, so this is the run converging, not a failure."
    return hit._replace(severity=INFO, message=hit.message + note)


def check_entropy(h: History, t: Thresholds) -> Hit | None:
    return _solved(h, t, _entropy_collapse(h, t))


def _entropy_collapse(h: History, t: Thresholds) -> Hit | None:
    n = t.smooth_window
    collapsed, limits, parts, severity = {}, {}, [], WARNING
    for name in ENTROPIES:
        values, first = h.values(name), h.first(name)
        if name not in h.row or not first or first[0] <= 0:
            continue
        now = h.row[name]
        if math.isfinite(now) and now < t.entropy_critical_fraction * first[0]:  # a collapse in one step
            collapsed[name], limits[name], severity = now, t.entropy_critical_fraction * first[0], CRITICAL
            parts.append(f"{name} = {_g(now)} ({now / first[0]:.0%} of its first value {_g(first[0])})")
            continue
        # The start level and the current level must not share observations.
        if len(first) < n or len(values) < n or h.count(name) < 2 * n:
            continue
        start, level = statistics.median(first[:n]), statistics.median(values[-n:])
        if start > 0 and level < t.entropy_collapse_fraction * start:
            collapsed[name], limits[name] = level, t.entropy_collapse_fraction * start
            parts.append(f"{name} median {_g(level)} ({level / start:.0%} of its start level {_g(start)})")
    if not collapsed:
        return None
    return Hit(severity, collapsed, "; ".join(parts) + ".", limits)


def check_entropy_rising(h: History, t: Thresholds) -> Hit | None:
    """The policy going random: a per-token entropy's level (median of smooth_window) at entropy_rise_factor times
    its start level (median of its first smooth_window, observations not shared with the level) is a warning; at
    entropy_rise_with_fall times it while the trained-on score falls (reward_fall), critical: the two together are
    the failure, so the rise needs less evidence of its own. The per-token entropies only: a sequence's entropy
    grows with its length."""
    n = t.smooth_window
    for name, _ in TOKEN_ENTROPIES:
        first = h.first(name)
        if name not in h.row or len(first) < n or h.count(name) < 2 * n:
            continue
        start, level = statistics.median(first[:n]), _level(h, name, n)
        if level is None or start <= 0 or level < min(t.entropy_rise_factor, t.entropy_rise_with_fall) * start:
            continue
        rose = f"{name} rose to {_g(level)} ({_over(n)}), {level / start:.1f}x its start level {_g(start)}"
        fall = reward_fall(h, t)
        if fall is not None and level >= t.entropy_rise_with_fall * start:
            return Hit(
                CRITICAL,
                {name: level, fall.name: fall.now},
                f"{rose}, while {fall.name} fell from {_g(fall.before)} to {_g(fall.now)}: the policy is going "
                "random.",
                {name: t.entropy_rise_with_fall * start},
            )
        if level >= t.entropy_rise_factor * start:
            return Hit(
                WARNING, {name: level}, rose + ": the policy is spreading its probability over more tokens.",
                {name: t.entropy_rise_factor * start},
            )  # fmt: skip
    return None


def check_kl_not_measured(h: History, t: Thresholds) -> Hit | None:
    """`kl` exactly 0 in every observation so far (at least smooth_window): the run has no KL term (beta = 0, TRL's
    default), so nothing was measured for the KL rules to judge. Said once, as info."""
    if h.count(GRPO_KL) < t.smooth_window or h.range(GRPO_KL) != (0.0, 0.0):
        return None
    return Hit(
        INFO,
        {GRPO_KL: 0.0},
        f"{GRPO_KL} is exactly 0 in all {h.count(GRPO_KL)} observations: the run has no KL term (beta = 0), so the "
        "policy's distance from the reference is not measured and the KL rules have nothing to judge.",
    )


class CompletionEntropy(NamedTuple):
    name: str  # the per-token entropy metric
    entropy: float  # its level (median of smooth_window), nats/token
    length: float  # the mean completion length's level, tokens

    @property
    def level(self) -> float:
        """Nats per completion."""
        return self.entropy * self.length


def completion_entropy(h: History, t: Thresholds) -> CompletionEntropy | None:
    """The entropy of a whole completion: the level (median of smooth_window) of the per-token entropy times that of
    the mean completion length, once the row carries one and both have smooth_window observations."""
    for name, length_name in TOKEN_ENTROPIES:
        if name in h.row:
            entropy, length = _level(h, name, t.smooth_window), _level(h, length_name, t.smooth_window)
            if entropy is not None and length is not None:
                return CompletionEntropy(name, entropy, length)
    return None


def check_completion_entropy(h: History, t: Thresholds) -> Hit | None:
    return _solved(h, t, _completion_entropy_low(h, t))


def _completion_entropy_low(h: History, t: Thresholds) -> Hit | None:
    """exp of the entropy of a whole completion is the number of equally likely completions it is worth, whatever
    the vocabulary, the task or the length; below two, a prompt's samples are nearly all the same text."""
    found = completion_entropy(h, t)
    if found is None or found.level >= t.completion_entropy_low:
        return None
    name, entropy, length = found
    return Hit(
        WARNING,
        {name: entropy},
        f"{name} = {_g(entropy)} nats/token over completions of {_g(length)} tokens (medians of the last "
        f"{t.smooth_window} steps): {_g(found.level)} nats per completion, worth {math.exp(found.level):.2f} equally "
        "likely completions per prompt.",
        {name: t.completion_entropy_low / length},
    )


def _trailing_means(values: list[float], n: int) -> list[float]:
    """The mean of each run of n consecutive values, oldest first."""
    return [statistics.fmean(values[i - n : i]) for i in range(n, len(values) + 1)]


def _score_name(h: History) -> str:
    """The score the policy is trained on: PPO's objective/scores, GRPO's total reward."""
    return PPO_SCORES if h.count(PPO_SCORES) else GRPO_REWARD


def _noise(values: list[float], n: int) -> float:
    """The standard deviation of a difference of two means of n observations, from the step-to-step noise of the
    observations: the root mean square of their successive differences over sqrt(2), which a trend or a sudden fall
    barely inflates (von Neumann's estimator), times sqrt(2 / n)."""
    diffs = [b - a for a, b in zip(values, values[1:])]
    return math.sqrt(sum(d * d for d in diffs) / (2 * len(diffs))) * math.sqrt(2 / n)


def check_overoptimisation(h: History, t: Thresholds) -> Hit | None:
    """True success falls while the trained-on score rises: the policy exploits the reward. Over the last
    reward_history observations, the mean of the latest overopt_window observations is compared with the window
    where true success was best (not overlapping the latest); both changes are measured against the step-to-step
    noise of their own metric, so sampling noise in a small batch does not count as a fall. On evaluations
    (eval/task_success), the first one (before training) against the mean of the last overopt_eval_window, once the
    score rose by overopt_score_rise."""
    score_name, (rollout, evaluation) = _score_name(h), TRUE_SUCCESS
    n = t.overopt_window
    success, score = h.values(rollout)[-t.reward_history :], h.values(score_name)[-t.reward_history :]
    shared = min(len(success), len(score))
    if rollout in h.row and shared >= 2 * n:
        success, score = success[-shared:], score[-shared:]
        success_levels, score_levels = _trailing_means(success, n), _trailing_means(score, n)
        best = max(range(len(success_levels) - n), key=success_levels.__getitem__)
        drop, rise = success_levels[best] - success_levels[-1], score_levels[-1] - score_levels[best]
        needed_drop = max(t.overopt_success_drop, t.overopt_success_z * _noise(success, n))
        if drop >= needed_drop and rise >= t.overopt_score_z * _noise(score, n):
            return Hit(
                WARNING,
                {rollout: success_levels[-1], score_name: score_levels[-1]},
                f"{rollout} fell from {_g(success_levels[best])} to {_g(success_levels[-1])} while {score_name} rose "
                f"from {_g(score_levels[best])} to {_g(score_levels[-1])} (means of {n} observations, {shared - n} "
                "apart at most): the policy earns more reward for worse answers.",
                {rollout: success_levels[best] - needed_drop, score_name: score_levels[best]},
            )
    if evaluation not in h.row or h.count(score_name) < 2 * n:
        return None
    score_start, score_now = statistics.fmean(h.first(score_name)[:n]), statistics.fmean(h.values(score_name)[-n:])
    if score_now - score_start < t.overopt_score_rise or h.count(evaluation) < 1 + t.overopt_eval_window:
        return None
    start, now = h.first(evaluation)[0], statistics.fmean(h.values(evaluation)[-t.overopt_eval_window :])
    if now - start <= t.overopt_success_gain:
        return Hit(
            WARNING,
            {score_name: score_now, evaluation: now},
            f"{score_name} rose from {_g(score_start)} to {_g(score_now)} (means of its first and last {n} "
            f"observations) while {evaluation} went from {_g(start)} to {_g(now)}.",
            {score_name: score_start + t.overopt_score_rise, evaluation: start + t.overopt_success_gain},
        )
    return None


def check_reward_collapse(h: History, t: Thresholds) -> Hit | None:
    """The trained-on score fell and stayed down: its level (median of smooth_window observations) is
    reward_collapse_spreads spreads (the median of the score's std so far) below its level before (reward_fall: the
    median of the earlier observations of the last reward_history), and reward_fall_z noise units of its level."""
    spread_name = PPO_SCORES_STD if _score_name(h) == PPO_SCORES else GRPO_REWARD_STD
    spreads, fall = h.values(spread_name), reward_fall(h, t)
    if fall is None or fall.name not in h.row or not spreads:
        return None
    spread = statistics.median(spreads)
    if spread > 0 and fall.now <= fall.before - t.reward_collapse_spreads * spread:
        return Hit(
            WARNING,
            {fall.name: fall.now},
            f"{fall.name} fell to {_g(fall.now)} ({_over(t.smooth_window)}) from {_g(fall.before)} (its "
            f"median before, over the last {t.reward_history}): {(fall.before - fall.now) / spread:.1f} times its "
            f"typical spread {_g(spread)} and {(fall.before - fall.now) / fall.noise:.1f} times the noise of its level.",
            {
                fall.name: min(
                    fall.before - t.reward_collapse_spreads * spread, fall.before - t.reward_fall_z * fall.noise
                )
            },
        )
    return None


class RewardFall(NamedTuple):
    name: str  # the score the policy is trained on
    before: float  # its level before: the median of its earlier observations in the last reward_history
    now: float  # its latest level (median of smooth_window)
    noise: float  # the noise unit of a difference of two levels


def reward_fall(h: History, t: Thresholds) -> RewardFall | None:
    """The trained-on score's fall: its latest level (median of smooth_window) reward_fall_z noise units or more below
    its level before (the median of the earlier observations of the last reward_history); None otherwise. The level
    before is a median, not the best level: the best of many noisy levels sits high by chance, and a flat, noisy
    reward would fall from it again and again."""
    name, n = _score_name(h), t.smooth_window
    values = h.values(name)[-t.reward_history :]
    if len(values) < 2 * n:
        return None
    noise = _noise(values, n)
    fall = RewardFall(name, statistics.median(values[:-n]), statistics.median(values[-n:]), noise)
    return fall if noise > 0 and fall.before - fall.now >= t.reward_fall_z * noise else None


def reward_position(h: History, t: Thresholds) -> float | None:
    """Where the trained-on score's level (median of smooth_window) lies in the range of all its observations so
    far: 0 at the lowest, 1 at the highest. None before smooth_window observations, or for a score that never moved
    (a constant reward has no range: nothing tells its top from its bottom)."""
    name = _score_name(h)
    level, bounds = _level(h, name, t.smooth_window), h.range(name)
    if level is None or bounds is None:
        return None
    low, high = bounds
    if high - low <= 1e-9 * max(1.0, abs(high)):
        return None
    return (level - low) / (high - low)


def _level(h: History, name: str, n: int) -> float | None:
    """Median of the last n observations of `name`, or None while there are fewer than n."""
    values = h.values(name)[-n:]
    return statistics.median(values) if len(values) == n else None


def check_tools_never_called(h: History, t: Thresholds) -> Hit | None:
    n, first = t.tools_unused_observations, h.first(TOOL_CALLS)
    recent = h.values(TOOL_CALLS)[-n:]
    if len(recent) < n or len(first) < t.smooth_window:
        return None
    if max(recent + first) > t.tools_unused_level:
        return None
    # Calls the turn cap or the length budget left unanswered are not counted as made (TRL's count): episodes that
    # end on a pending call did call, which is the turn cap's rule to report.
    if any(v > t.tools_unused_level for name in (TURN_CAP, ROLLED_BACK) for v in h.values(name)[-n:]):
        return None
    return Hit(
        WARNING,
        {TOOL_CALLS: max(recent)},
        f"The policy has been offered tools for {h.count(TOOL_CALLS)} steps and made at most {_g(max(recent + first))} "
        f"calls per episode, in its first {len(first)} steps and its last {n}.",
        {TOOL_CALLS: t.tools_unused_level},
    )


def check_tool_failures(h: History, t: Thresholds) -> Hit | None:
    """The failure share of all calls, and of each tool's (tools/<tool>/failure_frequency), at their levels."""
    failing, limits = {}, {}
    names = [TOOL_FAILURES] + [
        k
        for k in h.row
        if k.startswith(TOOL_FAILURE_PREFIX) and k.endswith(TOOL_FAILURE_SUFFIX) and k != TOOL_FAILURES
    ]
    for name in names:
        level = _level(h, name, t.smooth_window)
        if level is not None and level >= t.tool_failure_warning:
            failing[name], limits[name] = level, t.tool_failure_warning
    if not failing:
        return None
    parts = [f"{name} = {level:.0%}" for name, level in failing.items()]
    return Hit(
        WARNING,
        failing,
        f"Most tool calls fail ({_over(t.smooth_window)}): {', '.join(parts)}.",
        limits,
    )


def check_turn_cap(h: History, t: Thresholds) -> Hit | None:
    level = _level(h, TURN_CAP, t.smooth_window)
    if level is None or level < t.turn_cap_warning:
        return None
    return Hit(
        WARNING,
        {TURN_CAP: level},
        f"{level:.0%} of episodes ({_over(t.smooth_window)}) ended at max_tool_calling_iterations "
        "with tool calls left unanswered.",
        {TURN_CAP: t.turn_cap_warning},
    )


def check_tool_use_abandoned(h: History, t: Thresholds) -> Hit | None:
    n, first, score = t.smooth_window, h.first(TOOL_CALLS), _score_name(h)
    if len(first) < n or h.count(TOOL_CALLS) < 2 * n or len(h.first(score)) < n:
        return None
    start, level = statistics.median(first[:n]), _level(h, TOOL_CALLS, n)
    reward_start, reward_level = statistics.median(h.first(score)[:n]), _level(h, score, n)
    if level is None or reward_level is None or start < t.tool_use_start_level:
        return None
    if level > t.tool_use_drop_fraction * start or reward_level < reward_start:
        return None
    return Hit(
        WARNING,
        {TOOL_CALLS: level, score: reward_level},
        f"Tool calls per episode fell from {_g(start)} to {_g(level)} (medians of the first and last {n} steps) while "
        f"{score} rose from {_g(reward_start)} to {_g(reward_level)}: the reward is earned without the tools.",
        {TOOL_CALLS: t.tool_use_drop_fraction * start},
    )


def check_clipped_completions(h: History, t: Thresholds) -> Hit | None:
    """Completions cut at the length limit, judged with their trend and the reward: a share that falls from its
    highest level is a model learning to stop (a starting model often rambles), no finding; a share held high is a
    warning; held at clipped_ratio_critical over clipped_sustained observations while the reward falls, critical."""
    n, m = t.smooth_window, max(t.smooth_window, t.clipped_sustained)
    level, held, levels = _level(h, CLIPPED, n), _level(h, CLIPPED, m), _levels(h.values(CLIPPED), n)
    if level is None or held is None or min(level, held) < t.clipped_ratio_warning:
        return None
    if level <= max(levels) - t.clipped_recovering:
        return None  # falling from its highest level: the model is learning to stop
    message = (
        f"{level:.0%} of completions ({_over(n)}; {held:.0%} over the last {m}) ended at the "
        "length limit without EOS, and the share is not falling"
    )
    suffers = _reward_suffers(h, t, m) if held >= t.clipped_ratio_critical else None
    if suffers is not None:
        return Hit(CRITICAL, {CLIPPED: level}, f"{message}, while {suffers}: the cut answers cost reward.",
                   {CLIPPED: t.clipped_ratio_critical})  # fmt: skip
    return Hit(WARNING, {CLIPPED: level}, message + ".", {CLIPPED: t.clipped_ratio_warning})


def _reward_suffers(h: History, t: Thresholds, observations: int) -> str | None:
    """How the trained-on score suffers, in words, or None: it fell (reward_fall), or it never moved in `observations`
    or more (every answer scored alike: nothing for the policy to climb). Where a noisy level sits in its range is not
    used: a flat, noisy reward's level touches the bottom of its range by chance."""
    fall = reward_fall(h, t)
    if fall is not None:
        return f"{fall.name} fell from {_g(fall.before)} to {_g(fall.now)}"
    score = _score_name(h)
    if h.count(score) >= observations and reward_position(h, t) is None:
        return f"{score} has not moved in {h.count(score)} observations"
    return None


def _levels(values: list[float], n: int) -> list[float]:
    """The median of each run of n consecutive values, oldest first (the values themselves for fewer)."""
    return [statistics.median(values[i - n : i]) for i in range(n, len(values) + 1)] or values


def check_zero_std(h: History, t: Thresholds) -> Hit | None:
    return _solved(h, t, _zero_std(h, t))


def _zero_std(h: History, t: Thresholds) -> Hit | None:
    """Groups without reward spread, judged by where the reward stands in the range it has covered in this run: near
    its top the groups are all solved (info: nothing left to learn); near its bottom, or with a reward that never
    moved, they are all failed (a warning: no learning signal; critical when held at zero_std_critical over
    zero_std_sustained observations); between the two, a warning."""
    n = t.smooth_window
    level = _level(h, ZERO_STD, n)
    if level is None or level < t.zero_std_warning:
        return None
    score = _score_name(h)
    said = f"in {level:.0%} of prompt groups ({_over(n)}) every completion got the same reward"
    if h.count(score) < max(n, t.zero_std_sustained):  # too few observations of the reward to know its range
        return Hit(
            WARNING, {ZERO_STD: level}, f"{said}: those groups have zero advantage and teach nothing.",
            {ZERO_STD: t.zero_std_warning},
        )  # fmt: skip
    position = reward_position(h, t)
    if position is not None and position >= t.reward_top:
        return Hit(
            INFO,
            {ZERO_STD: level},
            f"{said}, with {score} near the top of its range in this run ({position:.0%} of the way from its lowest "
            "to its highest observation): the groups are solved, and there is nothing left to learn from them.",
            {ZERO_STD: t.zero_std_warning},
        )
    where = (
        f"{score} has not moved in this run"
        if position is None
        else f"{score} is {position:.0%} of the way from its lowest to its highest observation in this run"
    )
    failed = position is None or position <= t.reward_bottom
    held = _level(h, ZERO_STD, max(n, t.zero_std_sustained))
    critical = failed and held is not None and held >= t.zero_std_critical
    meaning = (
        "the groups fail alike, so there is no learning signal"
        if failed
        else "those groups have zero advantage and teach nothing"
    )
    return Hit(
        CRITICAL if critical else WARNING,
        {ZERO_STD: level},
        f"{said} ({where}): {meaning}"
        + (f", held over the last {t.zero_std_sustained} observations." if critical else "."),
        {ZERO_STD: t.zero_std_critical if critical else t.zero_std_warning},
    )


def check_clip_region(h: History, t: Thresholds) -> Hit | None:
    level = _level(h, CLIP_REGION, t.smooth_window)
    if level is None or level < t.clip_region_warning:
        return None
    return Hit(
        WARNING,
        {CLIP_REGION: level},
        f"{CLIP_REGION} = {_g(level)} ({_over(t.smooth_window)}): that share of tokens hit the epsilon bounds.",
        {CLIP_REGION: t.clip_region_warning},
    )


def _kl_per_token(h: History, name: str) -> float | None:
    """The row's KL to the reference in nats/token: GRPO's kl as it is, PPO's objective/kl (per sequence) divided by
    the mean completion length of the same row."""
    value = h.row.get(name)
    if value is None or not math.isfinite(value):
        return None
    if name == GRPO_KL:
        return value
    length = h.row.get(RESPONSE_LENGTH)
    return value / length if length and length > 0 else None


def _kl_level(h: History, name: str, n: int) -> float | None:
    """The median of the last n observations of a KL metric in nats/token (PPO's divided by the median completion
    length over the same observations), or None while there are fewer than n."""
    values = h.values(name)[-n:]
    if len(values) < n:
        return None
    if name == GRPO_KL:
        return statistics.median(values)
    lengths = h.values(RESPONSE_LENGTH)[-n:]
    length = statistics.median(lengths) if lengths else 0.0
    return statistics.median(values) / length if length > 0 else None


def check_kl_extreme(h: History, t: Thresholds) -> Hit | None:
    for name in _kl_metrics(h):
        per_token = _kl_per_token(h, name)
        if per_token is None:
            continue
        if per_token >= t.kl_critical:
            return Hit(
                CRITICAL, {name: h.row[name]}, f"{name} = {_g(h.row[name])} ({_g(per_token)} nats/token): the policy "
                "is far from the reference.", {name: h.row[name] * t.kl_critical / per_token},
            )  # fmt: skip
        level = _kl_level(h, name, t.kl_window)
        if level is not None and level >= t.kl_level_warning:
            median = statistics.median(h.values(name)[-t.kl_window :])
            return Hit(
                WARNING, {name: median}, f"{name} median over the last {t.kl_window} observations {_g(median)} "
                f"({_g(level)} nats/token): the policy has drifted far from the reference.",
                {name: median * t.kl_level_warning / level},
            )  # fmt: skip
        if h.step is not None and h.step <= 1 and h.count(name) == 1 and per_token >= t.kl_start_warning:
            return Hit(
                WARNING, {name: h.row[name]}, f"{name} = {_g(h.row[name])} ({_g(per_token)} nats/token) at step "
                f"{h.step}, before any update: the reference is not the policy the run started from.",
                {name: h.row[name] * t.kl_start_warning / per_token},
            )  # fmt: skip
    return None


def check_logprob_gap(h: History, t: Thresholds) -> Hit | None:
    gap = h.row.get(LOGP_GAP)
    if gap is None or not math.isfinite(gap) or gap < t.logprob_gap_warning:
        return None
    severity, limit = (
        (CRITICAL, t.logprob_gap_critical) if gap >= t.logprob_gap_critical else (WARNING, t.logprob_gap_warning)
    )
    return Hit(
        severity, {LOGP_GAP: gap}, f"the training forward's log-probs differ from the sampler's by {_g(gap)} "
        "nats/token on the same weights.", {LOGP_GAP: limit},
    )  # fmt: skip


def check_off_policy(h: History, t: Thresholds) -> Hit | None:
    """async_generation: the policy that sampled the batches (the behaviour policy, up to max_staleness updates old)
    against the trainer's at the update: a single KL of a nat per token at once, else the levels (medians of
    smooth_window observations) of the KL and of the share of tokens the correction masks."""
    staleness = h.row.get(STALENESS)
    stale = f" (batches {_g(staleness)} updates old on average)" if staleness is not None else ""
    now = h.row.get(MISMATCH_KL)
    if now is not None and math.isfinite(now) and now >= t.off_policy_kl_critical:
        return Hit(
            CRITICAL, {MISMATCH_KL: now}, f"{MISMATCH_KL} = {_g(now)} nats/token at this step{stale}: the batch was "
            "sampled by a policy that no longer resembles the one training on it.",
            {MISMATCH_KL: t.off_policy_kl_critical},
        )  # fmt: skip
    n, found, limits, parts = t.smooth_window, {}, {}, []
    kl = _level(h, MISMATCH_KL, n)
    if kl is not None and kl >= t.off_policy_kl_warning:
        found[MISMATCH_KL], limits[MISMATCH_KL] = kl, t.off_policy_kl_warning
        parts.append(f"{MISMATCH_KL} = {_g(kl)} nats/token")
    masked = _level(h, MASKED_FRAC, n)
    if masked is not None and masked >= t.off_policy_masked_warning:
        found[MASKED_FRAC], limits[MASKED_FRAC] = masked, t.off_policy_masked_warning
        parts.append(f"{MASKED_FRAC} = {masked:.0%} of the tokens")
    if not found:
        return None
    return Hit(
        WARNING, found, f"{' and '.join(parts)} ({_over(n)}){stale}: the batches were sampled by a "
        "policy too far from the one training on them for the importance-sampling correction to mend.", limits,
    )  # fmt: skip


def check_reward_scale(h: History, t: Thresholds) -> Hit | None:
    for name in (PPO_SCORES_STD, GRPO_REWARD_STD):
        now = h.row.get(name)
        previous = h.values(name)[:-1][-t.reward_scale_window :]
        if now is None or not math.isfinite(now) or len(previous) < t.reward_scale_window:
            continue
        median = statistics.median(previous)
        if median > 0 and now >= t.reward_scale_factor * median:
            return Hit(
                CRITICAL, {name: now}, f"{name} = {_g(now)}, {now / median:.0f}x its median {_g(median)} over the "
                f"previous {len(previous)} observations: the rewards changed scale.",
                {name: t.reward_scale_factor * median},
            )  # fmt: skip
    return None


RULES: tuple[Rule, ...] = (
    Rule(
        "nonfinite_metric",
        (),
        (CRITICAL,),
        "any logged metric is NaN or infinite at this step",
        "A NaN or infinity reaches the weights at the next optimizer step. Look for the first row of metrics.jsonl "
        "where a value went non-finite; usual causes are a learning_rate that is too high, fp16 overflow (train in "
        "bf16 or fp32), a reward that returns NaN or inf, or a log of zero probability. Resume from the last good "
        "checkpoint with a lower learning_rate.",
        check_nonfinite,
    ),
    Rule(
        "ratio_far_from_one",
        (RATIO,),
        (WARNING, CRITICAL),
        f"`{RATIO}` at or outside $ratio_warning_low or $ratio_warning_high (warning), at or outside "
        "$ratio_critical_low or $ratio_critical_high (critical)",
        "The policy changed a lot between sampling the batch and updating on it. Lower learning_rate, use fewer "
        "num_ppo_epochs or more num_mini_batches. If it happens from the very first update, rollout and training "
        "compute log-probs differently (temperature, padding, position ids, dropout): the ratio on the first "
        "minibatch must be exactly 1.",
        check_ratio,
    ),
    Rule(
        "value_loss_spike",
        (VALUE_LOSS,),
        (WARNING, CRITICAL),
        f"`{VALUE_LOSS}` at least $value_loss_spike_factor times its median over the previous "
        "$value_loss_window observations (warning; needs $smooth_window of them); at least "
        "$value_loss_critical_factor times its first observation and >= $value_loss_critical_min, or NaN/inf (critical, at "
        "once)",
        "The value model is diverging or the scale of the returns jumped. Lower learning_rate or vf_coef, tighten "
        "cliprange_value, and check the rewards: a reward model or function that returns huge values, or a "
        "penalty_reward_value far outside the usual score range, produces such spikes.",
        check_value_loss,
    ),
    Rule(
        "value_updates_clipped",
        (VALUE_CLIPFRAC,),
        (WARNING,),
        f"median of the last $smooth_window observations of `{VALUE_CLIPFRAC}` >= $value_clipfrac_warning",
        "The value model's predictions move further in one update than cliprange_value allows, so the clipped "
        "value loss discards much of its gradient: the value model learns too fast to be stable (its learning "
        "rate, or a jump in the returns' scale) and its advantages turn to noise. Lower the learning rate, check "
        "the rewards' scale (whiten_rewards), and watch val/var_explained: a healthy value model explains more of "
        "the returns as training goes on.",
        check_value_clipping,
    ),
    Rule(
        "value_not_learning",
        (VPRED, VALUES_MEAN, RETURNS_VAR, APPROXKL),
        (WARNING,),
        f"median of the last $smooth_window observations of |`{VPRED}` - `{VALUES_MEAN}`| / sqrt(`{RETURNS_VAR}`) < "
        f"$value_still while the median of `{APPROXKL}` >= $value_policy_moved",
        "The value model's predictions during the update are the ones it made at the rollout: its weights do not "
        "change, so its values never learn the returns and GAE's advantages keep their full noise (a learning rate "
        "scheduled to 0, value-model parameters frozen or missing from the optimizer, a value head that gets no "
        "gradient). Check that the value model's parameters are trained and that its learning rate is above 0 "
        "(vf_coef scales its loss, not Adam's step).",
        check_value_learning,
    ),
    Rule(
        "updates_too_large",
        (CLIPFRAC, APPROXKL),
        (WARNING, CRITICAL),
        f"median of the last $smooth_window observations of `{CLIPFRAC}` >= $clipfrac_high and of "
        f"`{APPROXKL}` >= $approxkl_high, both at once (warning); a single `{APPROXKL}` >= $approxkl_critical "
        "(critical, at once)",
        "Each optimisation step moves the policy so far that the clipped objective discards much of the batch. "
        "Lower learning_rate, use fewer num_ppo_epochs or more num_mini_batches; a larger batch steadies the "
        "advantages.",
        check_update_size,
    ),
    Rule(
        "kl_negative",
        (PPO_KL, GRPO_KL),
        (WARNING,),
        f"mean of the last $kl_window observations of `{PPO_KL}` (PPO) or `{GRPO_KL}` (GRPO) below $kl_negative_below",
        "With the k1 estimator a KL to the reference cannot be negative on average, so the samples are not drawn "
        "from the distribution the log-probs are scored under: check that generation and scoring use the same "
        "temperature, that top_k/top_p sampling is off, and that the reference model starts equal to the policy.",
        check_kl_negative,
    ),
    Rule(
        "kl_runaway",
        (PPO_KL, GRPO_KL),
        (WARNING,),
        "median of the last $kl_window KL observations >= $kl_growth_factor times the median of the "
        f"$kl_window before, and >= $kl_floor nats/sequence for `{PPO_KL}` (PPO) or >= $grpo_kl_floor "
        f"nats/token for `{GRPO_KL}` (GRPO); or a steady climb: over the last $kl_trend_window observations the "
        "KL rose by >= $kl_trend_rise nats/token (the Theil-Sen slope, the median of the slopes between every pair "
        f"of observations, times the window; `{PPO_KL}` divided by the median of `{RESPONSE_LENGTH}`) with a "
        "Mann-Kendall trend statistic z >= $kl_trend_z",
        "The policy is running away from the reference, usually toward something the reward overpays: nothing "
        "holds it back (kl_coef or beta 0, or too small for the learning rate). Raise kl_coef (PPO) or beta (GRPO), "
        "lower learning_rate, and read the latest completion samples for degenerate text. A KL penalty lets the KL "
        "rise early and then level off; one that climbs on at this rate reaches whole nats per token.",
        check_kl_runaway,
    ),
    Rule(
        "kl_far_from_reference",
        (PPO_KL, GRPO_KL),
        (WARNING, CRITICAL),
        f"a single KL observation (`{GRPO_KL}` per token; `{PPO_KL}` per sequence divided by "
        f"`{RESPONSE_LENGTH}`) >= $kl_critical nats/token (critical, at once); the median of the last $kl_window "
        "observations >= $kl_level_warning nats/token (warning); a KL >= $kl_start_warning nats/token at step 1, "
        "before any update (warning)",
        "A KL of whole nats per token means the policy no longer resembles the reference: it was destroyed (a "
        "learning rate far too high) or runs free (kl_coef or beta 0). Half a nat per token held over many steps "
        "is a policy that has drifted far, usually into what the reward overpays: raise kl_coef or beta, lower "
        "learning_rate, and compare the score with a true success metric. A large KL at the very first step means the "
        "reference is not the policy the run started from: check that ref_model (or the adapter-disabled policy) "
        "loads the same checkpoint as the policy.",
        check_kl_extreme,
    ),
    Rule(
        "logprob_mismatch",
        (LOGP_GAP,),
        (WARNING, CRITICAL),
        f"`{LOGP_GAP}` >= $logprob_gap_warning (warning) or >= $logprob_gap_critical (critical) nats/token, at once",
        "The samples are not drawn from the distribution the loss scores them under, so every ratio and KL is "
        "off: sampling and training use different temperatures, padding or position ids, dropout is on, the "
        "sampler holds other weights, or precision differs (bf16 sampling against an fp32 loss reaches about "
        "0.01). Make the sampler's settings the trainer's; with a separate inference engine, correct with "
        "importance sampling.",
        check_logprob_gap,
    ),
    Rule(
        "off_policy_mismatch",
        (MISMATCH_KL, MASKED_FRAC, STALENESS),
        (WARNING, CRITICAL),
        f"median of the last $smooth_window observations of `{MISMATCH_KL}` >= $off_policy_kl_warning nats/token, or "
        f"of `{MASKED_FRAC}` >= $off_policy_masked_warning (warning); a single `{MISMATCH_KL}` >= "
        f"$off_policy_kl_critical nats/token (critical, at once); logged with async_generation only, and `{STALENESS}` "
        "gives the batches' age in the message",
        "With async_generation the batches are sampled by a copy of the policy up to max_staleness updates old, and "
        "the importance-sampling correction reweights them to the trainer's policy. Here the two policies are so "
        "far apart that the correction cannot mend it: most of the batch's weight goes to few completions or is "
        "masked away, and the updates follow what an old policy did rather than the current one (on the built-in "
        "task, GRPO at learning rate 5e-4 and max_staleness 4 loses all its success within ten updates; the "
        "synchronous run at that learning rate declines slowly or holds). Lower --max_staleness (1 already overlaps "
        "each update's optimisation with the next batch's generation) or the learning_rate; check "
        "off_policy/importance_weight_mean, which falls far below 1 when the correction discards most of the batch.",
        check_off_policy,
    ),
    Rule(
        "reward_scale_jump",
        (PPO_SCORES_STD, GRPO_REWARD_STD),
        (CRITICAL,),
        f"`{PPO_SCORES_STD}` (PPO) or `{GRPO_REWARD_STD}` (GRPO) >= $reward_scale_factor times its median over "
        "the previous $reward_scale_window observations",
        "The rewards changed scale from one step to the next: a reward model's head, a grader's units or a "
        "weight changed. PPO's value model and an unnormalised advantage (scale_rewards none) take the new scale "
        "as signal. Find what changed in the reward sources; normalise or clip rewards.",
        check_reward_scale,
    ),
    Rule(
        "kl_coef_rising",
        (KL_COEF,),
        (WARNING,),
        f"`{KL_COEF}` >= $kl_coef_rise_factor times its first value and rising in at least "
        "$kl_coef_rise_share of its last $kl_coef_window changes (adaptive KL controller)",
        "The adaptive controller keeps raising the penalty because the KL stays above kl_target. Lower "
        "learning_rate so the policy moves more slowly, or raise kl_target if the current KL is acceptable; an "
        "ever-growing coefficient tends to come before numerical trouble.",
        check_kl_coef,
    ),
    Rule(
        "entropy_collapse",
        ENTROPIES,
        (INFO, WARNING, CRITICAL),
        f"median of the last $smooth_window observations of `{M.OBJECTIVE_ENTROPY.name}`, "
        f"`{M.POLICY_ENTROPY_AVG.name}` or `{M.ENTROPY.name}` below $entropy_collapse_fraction times the median of "
        "its first $smooth_window (warning); a single observation below $entropy_critical_fraction times the run's "
        f"first (critical, at once); info instead while `{TRUE_SUCCESS[0]}` >= $solved_success",
        "The policy has become nearly deterministic, so sampling explores little and learning stalls. Lower "
        "learning_rate, raise kl_coef or beta to hold it near the reference, raise the sampling temperature, and "
        "check the samples for one answer repeated for every prompt.",
        check_entropy,
    ),
    Rule(
        "entropy_rising",
        tuple(name for name, _ in TOKEN_ENTROPIES),
        (WARNING, CRITICAL),
        f"median of the last $smooth_window observations of `{M.ENTROPY.name}` (GRPO) or `{M.POLICY_ENTROPY_AVG.name}` "
        "(PPO) at or above $entropy_rise_factor times the median of its first $smooth_window (warning); at or above "
        "$entropy_rise_with_fall times it while "
        f"the trained-on score (`{PPO_SCORES}` or `{GRPO_REWARD}`) falls (critical): its level (median of the last "
        "$smooth_window) $reward_fall_z noise units below its median over the earlier observations of the last "
        "$reward_history",
        "The policy is going random: it spreads its probability over more and more tokens, and the completions turn "
        "into noise. An entropy bonus set too high (entropy_coef, verl's entropy_coeff) pays for exactly that; so does "
        "an update that pushes probability off every sampled token (all advantages negative, a learning rate too "
        "high, a sign error in a custom loss), or numerical trouble in bf16/fp16 logits. Lower or remove the entropy "
        "bonus, lower learning_rate, check the advantages' sign and the samples, and resume from a checkpoint taken "
        "before the rise.",
        check_entropy_rising,
    ),
    Rule(
        "kl_not_measured",
        (GRPO_KL,),
        (INFO,),
        f"`{GRPO_KL}` exactly 0 in every observation so far (at least $smooth_window)",
        "The run trains without a KL penalty (beta = 0, TRL's default since 0.19), so its KL to the reference is not "
        "computed and logged as 0: no KL rule can tell whether the policy ran far from where it started. That is a "
        "choice, not a fault; watch the entropy, the completion lengths and the samples instead, or set beta > 0 to "
        "measure it.",
        check_kl_not_measured,
    ),
    Rule(
        "sampling_nearly_greedy",
        tuple(name for name, _ in TOKEN_ENTROPIES),
        (INFO, WARNING),
        f"the entropy of a whole completion, the median of the last $smooth_window observations of "
        f"`{M.POLICY_ENTROPY_AVG.name}` (PPO) or `{M.ENTROPY.name}` (GRPO) times that of `{RESPONSE_LENGTH}` or "
        f"`{M.COMPLETIONS_MEAN_LENGTH.name}`, below $completion_entropy_low nats (ln 2: fewer than two equally "
        f"likely completions per prompt); info instead while `{TRUE_SUCCESS[0]}` >= $solved_success",
        "Sampling is nearly greedy: most samples of a prompt are the same text, so PPO explores nothing new and "
        "GRPO's groups carry no spread to learn from. The usual cause is a low sampling temperature (the entropy is "
        "measured at it: at temperature 0.2 the built-in task's policy starts at 0.3 nats per completion, at 0.7 "
        "near 2); entropy_collapse reports the other cause, a policy that became deterministic while training. "
        "Raise temperature (0.7 to 1.0 is usual for RL), or start from a less peaked model.",
        check_completion_entropy,
    ),
    Rule(
        "reward_overoptimised",
        (PPO_SCORES, GRPO_REWARD, *TRUE_SUCCESS),
        (WARNING,),
        f"`{TRUE_SUCCESS[0]}` (mean of $overopt_window observations) below its best level over the last "
        "$reward_history observations by at least $overopt_success_drop and $overopt_success_z noise units, while "
        f"`{PPO_SCORES}` (PPO) or `{GRPO_REWARD}` (GRPO) rose from its level at that best by at least "
        "$overopt_score_z noise units (a noise unit: the metric's step-to-step noise, the root mean square of its "
        "successive differences over sqrt(2), times sqrt(2 / $overopt_window)); or `{TRUE_SUCCESS[1]}` (mean of the last $overopt_eval_window "
        "evaluations) at most $overopt_success_gain above the evaluation before training while the score rose by "
        ">= $overopt_score_rise; only for tasks with a checker",
        "The policy earns as much of the score it is trained on (or more) while getting worse at the task: it "
        "exploits what the reward model (or function) overpays, the over-optimisation of Gao et al. 2022. Read the "
        "latest samples for what the reward pays for; lower learning_rate, raise kl_coef or beta to hold the policy "
        "near the reference, and fix the reward (more preference pairs of the mistakes the policy now makes).",
        check_overoptimisation,
    ),
    Rule(
        "reward_collapse",
        (PPO_SCORES, GRPO_REWARD),
        (WARNING,),
        f"the median of the last $smooth_window observations of `{PPO_SCORES}` (PPO) or `{GRPO_REWARD}` (GRPO) "
        "is $reward_collapse_spreads or more times its typical spread (the median of its std so far), and "
        "$reward_fall_z or more noise units, below its median over the earlier observations of the last "
        "$reward_history (a noise unit: the root mean square of its successive differences over sqrt(2), times "
        "sqrt(2 / $smooth_window))",
        "The score the policy is trained on fell and stayed down: the updates are destroying what the policy had "
        "learned (a learning rate too high, a broken reward). Lower learning_rate, check the reward sources, and "
        "resume from a checkpoint taken before the fall.",
        check_reward_collapse,
    ),
    Rule(
        "completions_clipped",
        (CLIPPED,),
        (WARNING, CRITICAL),
        f"median of the last $smooth_window observations of `{CLIPPED}` and its median over the last "
        "$clipped_sustained both >= $clipped_ratio_warning, and the share not falling (the level not "
        "$clipped_recovering or more below its highest so far: a starting model that rambles and learns to stop is "
        "no finding) (warning); critical when the median over the last $clipped_sustained is >= "
        "$clipped_ratio_critical while the trained-on score suffers: it falls (its level $reward_fall_z noise units "
        "below its median over the earlier observations of the last $reward_history), or it never moved",
        "Many completions hit max_completion_length before the EOS token, so they are cut mid-answer and scored "
        "that way, and the share does not fall as training goes on. Raise max_completion_length, or teach the model "
        "to stop: a warm start on examples that end with EOS, or mask_truncated_completions=True so cut completions "
        "do not count in the loss. Critical when the cut answers cost reward: the score falls, or stays at its floor, "
        "while nearly every completion is cut.",
        check_clipped_completions,
    ),
    Rule(
        "reward_zero_std",
        (ZERO_STD,),
        (INFO, WARNING, CRITICAL),
        f"median of the last $smooth_window observations of `{ZERO_STD}` >= $zero_std_warning, read with where the "
        f"trained-on score's level stands in the range of its observations so far (once it has $zero_std_sustained): "
        "at or above $reward_top of the way up, the groups are solved (info: nothing left to learn); at or below "
        "$reward_bottom, or a score that never moved, they fail alike (warning: no learning signal; critical when the "
        "median over the last $zero_std_sustained is >= $zero_std_critical); between, a warning; info also while "
        f"`{TRUE_SUCCESS[0]}` >= $solved_success",
        "In many groups all completions got the same reward, so their group-relative advantages are zero and they "
        "teach nothing. Near the reward's top that is a task solved: nothing is left to learn from those prompts. "
        "Near its bottom there is no learning signal at all: the prompts are too hard for the model, the reward cannot tell completions "
        "apart, or sampling is so nearly deterministic (a low temperature, a collapsed entropy) that a group's "
        "completions are the same text. Match the prompts' difficulty to the model (drop prompts that are always "
        "or never solved), give partial credit in the reward, raise the temperature or num_generations.",
        check_zero_std,
    ),
    Rule(
        "tools_never_called",
        (TOOL_CALLS,),
        (WARNING,),
        f"`{TOOL_CALLS}` at most $tools_unused_level in each of its first $smooth_window and its last "
        f"$tools_unused_observations observations, and no more episodes than that ending on a call left unanswered "
        f"(`{TURN_CAP}`, `{ROLLED_BACK}`)",
        "The policy is offered tools and does not call them: it never learned the call format, the chat template "
        "does not show it the tools, or its calls do not parse (the tokenizer's response_template does not match "
        "what the model writes, so every call is read as plain text). Read a few completions with "
        "--log_completions; warm the model up on examples that call the tools (SFT), and check that "
        "tokenizer.parse_response finds the calls in its own output.",
        check_tools_never_called,
    ),
    Rule(
        "tool_failures",
        (TOOL_FAILURES,),
        (WARNING,),
        f"median of the last $smooth_window observations of `{TOOL_FAILURES}`, or of one tool's "
        f"`{M.TOOLS_TOOL_FAILURE_FREQUENCY.name}`, >= $tool_failure_warning",
        "Most tool calls come back as errors, so the episodes carry error messages instead of results and the "
        "reward measures how the policy copes with a broken tool. The completions table shows the errors: a tool "
        "that raises or times out (fix the tool, or its TOOL_TIMEOUT_S), calls of names the model invents, or "
        "arguments of the wrong type or name (the docstring and type hints are what the model sees).",
        check_tool_failures,
    ),
    Rule(
        "turn_cap_reached",
        (TURN_CAP,),
        (WARNING,),
        f"median of the last $smooth_window observations of `{TURN_CAP}` >= $turn_cap_warning",
        "Most episodes still had a tool call to answer when max_tool_calling_iterations ran out, so they end "
        "without an answer: the cap is too low for the task, or the policy calls tools in a loop (the same call "
        "again and again; read the completions). Raise max_tool_calling_iterations if the task needs more rounds; "
        "otherwise reward episodes that answer.",
        check_turn_cap,
    ),
    Rule(
        "tool_use_abandoned",
        (TOOL_CALLS,),
        (WARNING,),
        f"`{TOOL_CALLS}` level (median of the last $smooth_window) below $tool_use_drop_fraction times its start "
        "level (median of its first $smooth_window), from a start level of at least $tool_use_start_level, while "
        f"the reward's level (`{PPO_SCORES}` or `{GRPO_REWARD}`) is at or above its start level",
        "The policy stopped calling the tools it started with, and the reward did not fall: the reward pays answers "
        "that need no tool (a checker of the format rather than the result, a reward model that cannot tell), so "
        "the policy learns to skip the tools. If the task needs them, make the reward check the result (the task's "
        "checker), and compare rollout/task_success with the reward.",
        check_tool_use_abandoned,
    ),
    Rule(
        "clip_ratio_high",
        (CLIP_REGION,),
        (WARNING,),
        f"median of the last $smooth_window observations of `{CLIP_REGION}` >= $clip_region_warning",
        "A large share of tokens hit the epsilon clipping bounds: the policy changes too much between sampling "
        "and the update. Lower learning_rate or num_iterations; widen epsilon / epsilon_high only if the bounds "
        "were set tight on purpose.",
        check_clip_region,
    ),
)
