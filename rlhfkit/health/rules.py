"""Health rules: the reference docs' "crucial values" and "watch for stability" advice as checks.

A rule reads a few metrics from the stream that the trainer logs (one row of scalars per step), and
says whether something looks wrong *now*: a severity, the numbers that triggered it, and a message.
Rules are data (a list of :class:`Rule` with a plain check function); every threshold lives in
:class:`Thresholds`, so calibrating a rule never means editing a check.

Windows count *observations of the metric*, not steps: rows at eval steps carry only ``eval/*`` keys
and GRPO rows may lack rollout metrics, so "the last 5 values of ``val/ratio``" skips those rows.
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
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from rlhfkit.metrics import registry as M

INFO, WARNING, CRITICAL = "info", "warning", "critical"
SEVERITIES: tuple[str, ...] = (INFO, WARNING, CRITICAL)  # in increasing order of urgency
# --health: no checks; report findings; also end training on a critical one (HealthWatch, rlhfkit/health/watch.py).
HEALTH_MODES: tuple[str, ...] = ("off", "warn", "stop")

# The metrics the rules read.
RATIO, VALUE_LOSS = M.VAL_RATIO.name, M.LOSS_VALUE_AVG.name
CLIPFRAC, APPROXKL = M.POLICY_CLIPFRAC_AVG.name, M.POLICY_APPROXKL_AVG.name
PPO_KL, GRPO_KL, KL_COEF = M.OBJECTIVE_KL.name, M.KL.name, M.OBJECTIVE_KL_COEF.name
ENTROPIES = (M.OBJECTIVE_ENTROPY.name, M.POLICY_ENTROPY_AVG.name, M.ENTROPY.name)
PPO_REWARD, GRPO_REWARD = M.OBJECTIVE_RLHF_REWARD.name, M.REWARD.name
REWARD_KL_PAIRS = ((PPO_REWARD, PPO_KL), (GRPO_REWARD, GRPO_KL))
CLIPPED, ZERO_STD = M.COMPLETIONS_CLIPPED_RATIO.name, M.FRAC_REWARD_ZERO_STD.name
CLIP_REGION = M.CLIP_RATIO_REGION_MEAN.name
# Over-optimisation: the score the policy is trained on (PPO: the reward model's / functions' score; GRPO: the total
# reward) against the task's true success (its checker), on sampled (rollout/) or greedy eval (eval/) completions.
PPO_SCORES, TRUE_SUCCESS = M.OBJECTIVE_SCORES.name, (M.ROLLOUT_TASK_SUCCESS.name, M.EVAL_TASK_SUCCESS.name)


def _knob(default: float | int, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Thresholds:
    """Every number the rules compare against, with its default. Units are the metric's own.

    Defaults were calibrated on a healthy 160-update PPO run of the built-in task (no warning, no
    critical finding); see tests/health/test_rules.py for the margins.
    """

    # Windows, in observations of the metric concerned.
    smooth_window: int = _knob(5, "Observations whose median is a metric's current level (and its start level).")
    quiet_observations: int = _knob(
        10, "A rule that stopped firing must stay quiet this many evaluations before it is reported again."
    )
    # PPO probability ratio.
    ratio_warning_low: float = _knob(0.5, f"`{RATIO}` below this is a warning.")
    ratio_warning_high: float = _knob(2.0, f"`{RATIO}` above this is a warning.")
    ratio_critical_low: float = _knob(0.1, f"`{RATIO}` below this is critical.")
    ratio_critical_high: float = _knob(10.0, f"`{RATIO}` above this is critical.")
    # Value loss.
    value_loss_window: int = _knob(
        20, f"Previous observations of `{VALUE_LOSS}` whose median a spike is measured against."
    )
    value_loss_spike_factor: float = _knob(5.0, "A value loss this many times its recent median is a spike.")
    # Policy update size.
    clipfrac_high: float = _knob(0.3, f"`{CLIPFRAC}` level that counts as high.")
    approxkl_high: float = _knob(0.1, f"`{APPROXKL}` level (nats/token) that counts as high.")
    # KL to the reference.
    kl_window: int = _knob(20, "Observations per window of the KL checks.")
    kl_negative_below: float = _knob(-0.05, "A KL window mean below this counts as negative.")
    kl_growth_factor: float = _knob(2.5, "KL window median this many times the previous window's is runaway growth.")
    kl_floor: float = _knob(5.0, f"PPO `{PPO_KL}` (nats/sequence) below this never counts as runaway.")
    grpo_kl_floor: float = _knob(0.05, f"GRPO `{GRPO_KL}` (nats/token) below this never counts as runaway.")
    kl_coef_rise_factor: float = _knob(2.0, f"`{KL_COEF}` this many times its first value has risen a lot.")
    kl_coef_window: int = _knob(10, f"Recent changes of `{KL_COEF}` inspected for a steady rise.")
    kl_coef_rise_share: float = _knob(0.8, "Share of those changes that must be increases.")
    # Entropy.
    entropy_collapse_fraction: float = _knob(0.1, "Entropy below this fraction of its start level has collapsed.")
    # Reward against KL.
    reward_window: int = _knob(50, "Observations compared half against half for the reward-versus-KL trend.")
    reward_kl_growth_factor: float = _knob(1.5, "KL growth (second half median / first half) that counts as growing.")
    # Reward against true success (over-optimisation).
    overopt_window: int = _knob(
        20, "Observations of the score and of rollout task success averaged for their start and current levels."
    )
    overopt_eval_window: int = _knob(3, "Latest evaluations of eval/task_success averaged for its current level.")
    overopt_score_rise: float = _knob(
        0.3, "Rise of the score over its start level (reward units) from which over-optimisation is checked."
    )
    overopt_success_gain: float = _knob(
        0.02, "True success at most this much above its start level (a fraction) counts as flat or falling."
    )
    # GRPO.
    clipped_ratio_warning: float = _knob(0.5, f"`{CLIPPED}` level that is a warning.")
    clipped_ratio_critical: float = _knob(0.9, f"`{CLIPPED}` level that is critical.")
    zero_std_warning: float = _knob(0.9, f"`{ZERO_STD}` level that is a warning.")
    clip_region_warning: float = _knob(0.2, f"`{CLIP_REGION}` level that is a warning.")

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

    def history_length(self) -> int:
        """How many recent observations of each metric the rules can look at."""
        windows = (self.smooth_window, self.value_loss_window + 1, 2 * self.kl_window, self.kl_coef_window + 1)
        return max(*windows, self.reward_window, self.overopt_window)

    def start_length(self) -> int:
        """How many first observations of each metric the rules can look at (their start levels)."""
        return max(self.smooth_window, self.overopt_window)


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
    """What the rules may look at: the latest row, and per metric its recent and its first finite values."""

    def __init__(self, maxlen: int, first_n: int):
        self.step: int | None = None
        self.row: dict[str, float] = {}
        self._maxlen, self._first_n = maxlen, first_n
        self._recent: dict[str, deque[float]] = {}
        self._first: dict[str, list[float]] = {}
        self._count: dict[str, int] = {}

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
    """A rule firing at one step: how bad, the numbers behind it, and what happened in words."""

    severity: str
    metrics: dict[str, float]
    message: str


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


def _g(x: float) -> str:
    return f"{x:.3g}"


# ----------------------------------------------------------------------------------------------
# Checks. Each returns a Hit or None and reads only what its Rule declares.
# ----------------------------------------------------------------------------------------------


def check_ratio(h: History, t: Thresholds) -> Hit | None:
    x = h.row.get(RATIO)
    if x is None or not math.isfinite(x):
        return None  # NaN is nonfinite_metric's business
    if not t.ratio_critical_low <= x <= t.ratio_critical_high:
        severity, low, high = CRITICAL, t.ratio_critical_low, t.ratio_critical_high
    elif not t.ratio_warning_low <= x <= t.ratio_warning_high:
        severity, low, high = WARNING, t.ratio_warning_low, t.ratio_warning_high
    else:
        return None
    return Hit(severity, {RATIO: x}, f"{RATIO} = {_g(x)}, outside [{low:g}, {high:g}].")


def check_value_loss(h: History, t: Thresholds) -> Hit | None:
    x = h.row.get(VALUE_LOSS)
    if x is None:
        return None
    if not math.isfinite(x):
        return Hit(CRITICAL, {VALUE_LOSS: x}, f"{VALUE_LOSS} is {x}.")
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
        )
    return None


def check_nonfinite(h: History, t: Thresholds) -> Hit | None:
    bad = {name: value for name, value in h.row.items() if not math.isfinite(value)}
    if not bad:
        return None
    shown = ", ".join(f"{name} = {value}" for name, value in list(bad.items())[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return Hit(CRITICAL, bad, f"{len(bad)} non-finite metric(s): {shown}{more}.")


def check_update_size(h: History, t: Thresholds) -> Hit | None:
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
        )
    return None


def _kl_metrics(h: History) -> list[str]:
    return [name for name in (PPO_KL, GRPO_KL) if name in h.row]


def check_kl_negative(h: History, t: Thresholds) -> Hit | None:
    for name in _kl_metrics(h):
        window = h.values(name)[-t.kl_window :]
        if len(window) == t.kl_window and statistics.fmean(window) < t.kl_negative_below:
            mean = statistics.fmean(window)
            return Hit(WARNING, {name: mean}, f"{name} averaged {_g(mean)} over the last {t.kl_window} observations.")
    return None


def check_kl_runaway(h: History, t: Thresholds) -> Hit | None:
    for name in _kl_metrics(h):
        floor = t.kl_floor if name == PPO_KL else t.grpo_kl_floor
        w = t.kl_window
        values = h.values(name)[-2 * w :]
        if len(values) < 2 * w:
            continue
        before, now = statistics.median(values[:w]), statistics.median(values[w:])
        if now >= floor and now >= t.kl_growth_factor * max(before, 0.0):
            return Hit(
                WARNING,
                {name: now},
                f"{name} median rose from {_g(before)} to {_g(now)} between the previous and the last {w} observations.",
            )
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
        )
    return None


def check_entropy(h: History, t: Thresholds) -> Hit | None:
    n = t.smooth_window
    collapsed, parts = {}, []
    for name in ENTROPIES:
        values, first = h.values(name), h.first(name)[:n]
        # The start level and the current level must not share observations.
        if name not in h.row or len(first) < n or len(values) < n or h.count(name) < 2 * n:
            continue
        start, now = statistics.median(first), statistics.median(values[-n:])
        if start > 0 and now < t.entropy_collapse_fraction * start:
            collapsed[name] = now
            parts.append(f"{name} = {_g(now)} ({now / start:.0%} of its start level {_g(start)})")
    if not collapsed:
        return None
    return Hit(WARNING, collapsed, "; ".join(parts) + ".")


def check_reward_vs_kl(h: History, t: Thresholds) -> Hit | None:
    w, half = t.reward_window, t.reward_window // 2
    for reward_name, kl_name in REWARD_KL_PAIRS:
        if reward_name not in h.row or kl_name not in h.row:
            continue
        rewards, kls = h.values(reward_name)[-w:], h.values(kl_name)[-w:]
        if len(rewards) < w or len(kls) < w:
            continue
        gain = statistics.fmean(rewards[half:]) - statistics.fmean(rewards[:half])
        kl_before, kl_now = statistics.median(kls[:half]), statistics.median(kls[half:])
        if gain <= 0 and kl_before > 0 and kl_now >= t.reward_kl_growth_factor * kl_before:
            return Hit(
                WARNING,
                {reward_name: rewards[-1], kl_name: kl_now},
                f"over the last {w} observations {reward_name} changed by {gain:+.3g} (mean of the second half minus "
                f"the first) while the {kl_name} median grew {kl_now / kl_before:.1f}x ({_g(kl_before)} -> {_g(kl_now)}).",
            )
    return None


def check_overoptimisation(h: History, t: Thresholds) -> Hit | None:
    """The trained-on score has risen well above its start while the task's true success has not: the policy
    exploits the reward. Levels are means: the first and the last overopt_window observations of the score and of
    rollout success; for eval success the first evaluation (before training) and the last overopt_eval_window."""
    n = t.overopt_window
    score_name = PPO_SCORES if h.count(PPO_SCORES) else GRPO_REWARD
    if h.count(score_name) < 2 * n:
        return None  # the start and current levels must not share observations
    score_start, score_now = statistics.fmean(h.first(score_name)[:n]), statistics.fmean(h.values(score_name)[-n:])
    if score_now - score_start < t.overopt_score_rise:
        return None
    rollout, evaluation = TRUE_SUCCESS
    for name, start_n, now_n in ((rollout, n, n), (evaluation, 1, t.overopt_eval_window)):
        if name not in h.row or h.count(name) < start_n + now_n:
            continue
        start, now = statistics.fmean(h.first(name)[:start_n]), statistics.fmean(h.values(name)[-now_n:])
        if now - start <= t.overopt_success_gain:
            return Hit(
                WARNING,
                {score_name: score_now, name: now},
                f"{score_name} rose from {_g(score_start)} to {_g(score_now)} (means of its first and last {n} "
                f"observations) while {name} went from {_g(start)} to {_g(now)}.",
            )
    return None


def _level(h: History, name: str, n: int) -> float | None:
    """Median of the last n observations of `name`, or None while there are fewer than n."""
    values = h.values(name)[-n:]
    return statistics.median(values) if len(values) == n else None


def check_clipped_completions(h: History, t: Thresholds) -> Hit | None:
    level = _level(h, CLIPPED, t.smooth_window)
    if level is None or level < t.clipped_ratio_warning:
        return None
    severity = CRITICAL if level >= t.clipped_ratio_critical else WARNING
    return Hit(
        severity,
        {CLIPPED: level},
        f"{level:.0%} of completions (median of the last {t.smooth_window} steps) ended at max_completion_length "
        "without EOS.",
    )


def check_zero_std(h: History, t: Thresholds) -> Hit | None:
    level = _level(h, ZERO_STD, t.smooth_window)
    if level is None or level < t.zero_std_warning:
        return None
    return Hit(
        WARNING,
        {ZERO_STD: level},
        f"in {level:.0%} of prompt groups (median of the last {t.smooth_window} steps) every completion got the "
        "same reward.",
    )


def check_clip_region(h: History, t: Thresholds) -> Hit | None:
    level = _level(h, CLIP_REGION, t.smooth_window)
    if level is None or level < t.clip_region_warning:
        return None
    return Hit(
        WARNING,
        {CLIP_REGION: level},
        f"{CLIP_REGION} = {_g(level)} (median of the last {t.smooth_window} steps): that share of tokens hit the "
        "epsilon bounds.",
    )


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
        f"`{RATIO}` outside [$ratio_warning_low, $ratio_warning_high] (warning) or outside "
        "[$ratio_critical_low, $ratio_critical_high] (critical)",
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
        "$value_loss_window observations (warning; needs $smooth_window of them), or NaN/inf (critical)",
        "The value model is diverging or the scale of the returns jumped. Lower learning_rate or vf_coef, tighten "
        "cliprange_value, and check the rewards: a reward model or function that returns huge values, or a "
        "penalty_reward_value far outside the usual score range, produces such spikes.",
        check_value_loss,
    ),
    Rule(
        "updates_too_large",
        (CLIPFRAC, APPROXKL),
        (WARNING,),
        f"median of the last $smooth_window observations of `{CLIPFRAC}` >= $clipfrac_high and of "
        f"`{APPROXKL}` >= $approxkl_high, both at once",
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
        f"nats/token for `{GRPO_KL}` (GRPO)",
        "The policy is running away from the reference, usually toward something the reward overpays. Raise "
        "kl_coef (PPO) or beta (GRPO), lower learning_rate, and read the latest completion samples for "
        "degenerate text.",
        check_kl_runaway,
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
        (WARNING,),
        f"median of the last $smooth_window observations of `{M.OBJECTIVE_ENTROPY.name}`, "
        f"`{M.POLICY_ENTROPY_AVG.name}` or `{M.ENTROPY.name}` below $entropy_collapse_fraction times the median of "
        "its first $smooth_window",
        "The policy has become nearly deterministic, so sampling explores little and learning stalls. Lower "
        "learning_rate, raise kl_coef or beta to hold it near the reference, raise the sampling temperature, and "
        "check the samples for one answer repeated for every prompt.",
        check_entropy,
    ),
    Rule(
        "reward_flat_kl_rising",
        tuple(name for pair in REWARD_KL_PAIRS for name in pair),
        (WARNING,),
        f"over the last $reward_window observations, the mean of `{PPO_REWARD}` (PPO) or `{GRPO_REWARD}` (GRPO) "
        f"in the second half is not above the first half's, while the KL median (`{PPO_KL}` / `{GRPO_KL}`) grew by "
        "a factor >= $reward_kl_growth_factor",
        "The policy spends its KL budget without earning reward: it drifts away from the reference for no gain, or "
        "exploits something the score does not pay for. Raise kl_coef or beta, lower learning_rate, and check the "
        "reward on recent samples; with a learned reward model, compare against the task's true success metric.",
        check_reward_vs_kl,
    ),
    Rule(
        "reward_overoptimised",
        (PPO_SCORES, GRPO_REWARD, *TRUE_SUCCESS),
        (WARNING,),
        f"`{PPO_SCORES}` (PPO) or `{GRPO_REWARD}` (GRPO) has risen by >= $overopt_score_rise (mean of its last "
        "$overopt_window observations against its first $overopt_window) while the task's true success is at most "
        f"$overopt_success_gain above its start: `{TRUE_SUCCESS[0]}` (last $overopt_window observations against the "
        f"first $overopt_window) or `{TRUE_SUCCESS[1]}` (mean of the last $overopt_eval_window evaluations against "
        "the one before training); only for tasks with a checker",
        "The policy earns more of the score it is trained on without getting better at the task: it exploits what "
        "the reward model (or function) overpays, the over-optimisation of Gao et al. 2022. Lower learning_rate, "
        "raise kl_coef or beta to hold the policy near the reference, and improve the reward model where the "
        "latest samples show it being fooled (more pairs of the mistakes the policy now makes).",
        check_overoptimisation,
    ),
    Rule(
        "completions_clipped",
        (CLIPPED,),
        (WARNING, CRITICAL),
        f"median of the last $smooth_window observations of `{CLIPPED}` >= $clipped_ratio_warning "
        "(warning) or >= $clipped_ratio_critical (critical)",
        "Many completions hit max_completion_length before the EOS token, so they are cut mid-answer and scored "
        "that way. Raise max_completion_length, or teach the model to stop: a warm start on examples that end "
        "with EOS, or mask_truncated_completions=True so cut completions do not count in the loss.",
        check_clipped_completions,
    ),
    Rule(
        "reward_zero_std",
        (ZERO_STD,),
        (WARNING,),
        f"median of the last $smooth_window observations of `{ZERO_STD}` >= $zero_std_warning",
        "In nearly every group all completions got the same reward, so the group-relative advantages are zero and "
        "there is nothing to learn from. Match the prompts' difficulty to the model (drop prompts that are always "
        "or never solved), give partial credit in the reward, or raise num_generations or the temperature for "
        "more varied completions.",
        check_zero_std,
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
