"""From metric rows to curves: which metrics matter most, the x-axis, EMA smoothing, first-vs-last.

Ordering follows the reference docs' own advice ("Crucial values", then "useful to monitor for
stability"), so the first charts a user sees are the ones the TRL docs tell them to look at. On the
built-in task `eval/task_success` (greedy success on held-out prompts) comes before everything: it is
the one curve that cannot be fooled by an over-optimised reward model.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np

from rlhfkit.metrics import registry as M
from rlhfkit.report.rundata import Run


def pattern(metric: M.Metric) -> str:
    """The metric's name, or for a per-reward-function template the glob of its expansions (rewards/*/mean)."""
    return metric.name.replace("{reward_func_name}", "*")


HEADLINE = M.EVAL_TASK_SUCCESS.name

# The seeds' "Crucial values" lists, in their order (PPO: 002/004; GRPO: 004 "Crucial GRPO values").
CRUCIAL = {
    "ppo": [M.OBJECTIVE_RLHF_REWARD, M.OBJECTIVE_SCORES, M.OBJECTIVE_KL, M.OBJECTIVE_ENTROPY],
    "grpo": [M.REWARD, M.KL, M.ENTROPY, M.COMPLETIONS_CLIPPED_RATIO],
}
# Next to the crucial values: true success on the rollout, the KL penalty, per-function GRPO rewards.
CRUCIAL_EXTRA = [M.ROLLOUT_TASK_SUCCESS, M.OBJECTIVE_NON_SCORE_REWARD, M.REWARDS_FUNC_MEAN]
# The seeds' "useful to monitor for stability" lists; the registry adds what it marks as stability.
STABILITY = [
    M.LOSS_VALUE_AVG,
    M.VAL_RATIO,
    M.POLICY_CLIPFRAC_AVG,
    M.POLICY_APPROXKL_AVG,
    M.OBJECTIVE_KL_COEF,
    M.CLIP_RATIO_REGION_MEAN,
    M.CLIP_RATIO_LOW_MEAN,
    M.CLIP_RATIO_HIGH_MEAN,
    M.REWARD_STD,
]
# Higher is better for these; the summary colours their change green or red. Others (KL, entropy) get
# no colour: whether they should rise or fall depends on the run.
HIGHER_IS_BETTER = [M.EVAL_TASK_SUCCESS, M.ROLLOUT_TASK_SUCCESS, M.OBJECTIVE_RLHF_REWARD, M.OBJECTIVE_SCORES]
HIGHER_IS_BETTER += [M.REWARD, M.EVAL_SCORES, M.REWARDS_FUNC_MEAN]
# Axes, and the one-off summary row that ends a train() call: not curves.
NOT_CHARTED = {"step", M.EPISODE.name} | {
    m.name for m in (M.TRAIN_RUNTIME, M.TRAIN_SAMPLES_PER_SECOND, M.TRAIN_STEPS_PER_SECOND, M.TOTAL_FLOS, M.TRAIN_LOSS)
}


def metric_names(run: Run) -> list[str]:
    """Metric names of a run in order of first appearance."""
    names: dict[str, None] = {}
    for row in run.metrics:
        names.update(dict.fromkeys(row))
    return [n for n in names if n not in NOT_CHARTED]


def detect_trainer(names: list[str] | set[str]) -> str:
    """'ppo', 'grpo' or 'unknown': the trainer whose own metrics (the registry's) a run logged; the config may
    not say."""
    names = list(names)
    for trainer in M.TRAINERS:
        if _matching([pattern(m) for m in M.REGISTRY.values() if m.trainers == {trainer}], names):
            return trainer
    return "unknown"


def _matching(patterns: list[str], names: list[str]) -> list[str]:
    """Names matching the patterns, in pattern order (a pattern may be a glob such as rewards/*/mean)."""
    out: dict[str, None] = {}
    for pattern in patterns:
        out.update(dict.fromkeys(n for n in names if fnmatch.fnmatchcase(n, pattern)))
    return list(out)


def crucial_metrics(trainers: set[str], names: list[str]) -> list[str]:
    """The headline and crucial metrics present, headline first."""
    metrics = [m for trainer in M.TRAINERS if trainer in trainers for m in CRUCIAL[trainer]] + CRUCIAL_EXTRA
    metrics += [m for m in M.REGISTRY.values() if m.importance == "crucial"]
    return _matching([HEADLINE, *map(pattern, metrics)], names)


def summary_metrics(trainers: set[str], names: list[str]) -> list[str]:
    """The few metrics of the one-glance summary: the headline, the seeds' crucial list and rollout success."""
    metrics = [m for trainer in M.TRAINERS if trainer in trainers for m in CRUCIAL[trainer]] + [M.ROLLOUT_TASK_SUCCESS]
    return _matching([HEADLINE, *map(pattern, metrics)], names)


def chart_sections(
    names: list[str], trainers: set[str], patterns: list[str] | None = None
) -> list[tuple[str, list[str]]]:
    """Metrics to chart, grouped as (section title, names); crucial first, then stability, then the rest.

    patterns: the user's --metrics selection (names or globs); when given, only those, in that order.
    """
    if patterns:
        return [("Selected metrics", _matching(patterns, names))]
    crucial = crucial_metrics(trainers, names)
    stability_metrics = STABILITY + [m for m in M.REGISTRY.values() if m.importance == "stability"]
    stability = [n for n in _matching([pattern(m) for m in stability_metrics], names) if n not in crucial]
    rest = sorted(n for n in names if n not in crucial and n not in stability)
    sections = [("Crucial values", crucial), ("Watch for stability", stability), ("Everything else", rest)]
    return [(title, members) for title, members in sections if members]


def higher_is_better(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern(m)) for m in HIGHER_IS_BETTER)


def meaning(name: str) -> str:
    """The registry's one-line meaning of a metric, or '' for metrics it does not declare (yet)."""
    metric = M.REGISTRY.get(name)
    return metric.meaning if metric is not None else ""


# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One metric of one run: x (episode or step), y, and the steps they were logged at (all 1-D)."""

    steps: np.ndarray
    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


def x_key(runs: list[Run]) -> str:
    """'episode' when every run logs it (comparable across batch sizes), else 'step'."""
    if runs and all(any(M.EPISODE.name in row for row in run.metrics) for run in runs):
        return M.EPISODE.name
    return "step"


def steps_to_x(run: Run, steps: np.ndarray, key: str) -> np.ndarray:
    """Map steps to the x-axis. Eval rows and health findings carry only a step; their episode is
    interpolated from the update rows (episode grows linearly with step; step 0 is episode 0)."""
    steps = np.asarray(steps, dtype=np.float64)
    if key == "step":
        return steps
    episode = M.EPISODE.name
    pairs = {int(r["step"]): r[episode] for r in run.metrics if episode in r and np.isfinite(r[episode])}
    pairs.setdefault(0, 0.0)
    known = np.array(sorted(pairs), dtype=np.float64)
    return np.interp(steps, known, np.array([pairs[int(s)] for s in known]))


def series(run: Run, name: str, key: str) -> Series:
    """The run's values of `name` by step; a step logged twice (a resumed run) keeps its last value."""
    by_step: dict[int, float] = {}
    for row in run.metrics:
        if name in row:
            by_step[int(row["step"])] = row[name]
    steps = np.array(sorted(by_step), dtype=np.float64)
    y = np.array([by_step[int(s)] for s in steps], dtype=np.float64)
    return Series(steps=steps, x=steps_to_x(run, steps, key), y=y)


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: debiased exponential moving average with `weight` in [0, 1).

    Non-finite points do not enter the average and stay NaN (gaps), so one NaN does not erase the rest.
    weight 0 returns the values unchanged.
    """
    values = np.asarray(values, dtype=np.float64)
    if weight <= 0:
        return values.copy()
    out = np.full_like(values, np.nan)
    last, count = 0.0, 0
    for i, value in enumerate(values):
        if not np.isfinite(value):
            continue
        last = last * weight + (1 - weight) * value
        count += 1
        out[i] = last / (1 - weight**count)
    return out


@dataclass(frozen=True)
class FirstLast:
    """Start and end of a curve; `window` values are averaged at each end to see through update noise."""

    first: float
    last: float
    window: int
    nonfinite: int

    @property
    def delta(self) -> float:
        return self.last - self.first


def first_last(s: Series) -> FirstLast | None:
    """First vs last of a curve, or None without finite values.

    Sparse curves (evaluations, < 20 points) use the exact first and last values; dense per-update
    curves average a window of ~5% (at most 10 values) at each end, since a single PPO update is noisy.
    A curve whose final value is NaN or infinite ends on that value.
    """
    finite = s.y[np.isfinite(s.y)]
    if finite.size == 0:
        return None
    window = 1 if finite.size < 20 else min(10, max(1, finite.size // 20))
    last = float(finite[-window:].mean())
    if not np.isfinite(s.y[-1]):
        last = float(s.y[-1])  # a run that ended in NaN must not look healthy
    return FirstLast(
        first=float(finite[:window].mean()),
        last=last,
        window=window,
        nonfinite=int(s.y.size - finite.size),
    )
