"""What the health rules catch, measured: the rules replayed over a labelled set of runs, and the table of
docs/health.md.

The labelled set (bench/health/: specs.py says what each run is, build.py trains it) holds healthy runs of the
built-in task and runs with one failure injected each. A run's record (bench/health/records/NAME.json.gz) keeps its
labels, which come from outside the rules: ``mode`` ("healthy" or the failure injected), ``onset`` (the step of the
injected change, or for reward hacking the step at which true success visibly falls), how it ended, and every logged
row. Replaying the rows through a fresh monitor is exactly what ``rlhfkit doctor`` does with metrics.jsonl, and what
the trainer's live watch does with the same rows as they are logged.

A sick run is *flagged* by the first warning or critical finding at or after its onset, or by the trainer itself
stopping it with an explanation (a reward it refuses, too many non-finite steps). Findings before the onset of a sick
run, and every finding of a healthy run, are false alarms.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from rlhfkit.health.monitor import Finding, replay
from rlhfkit.health.rules import (
    CRITICAL,
    GRPO_KL,
    PPO_KL,
    History,
    Thresholds,
    completion_entropy,
    kl_climb,
    value_trend,
)

HEALTHY = "healthy"
# Reward hacking's onset, from true success alone (success_fall): levels are means of SUCCESS over SUCCESS_WINDOW steps.
SUCCESS, SUCCESS_WINDOW, SUCCESS_DROP, FINAL_DROP = "rollout/task_success", 10, 0.05, 0.1
# How a run ended when the trainer itself stopped it with an explanation (a clean stop or a refused input).
TRAINER_STOPS = {
    "NonFiniteStop": "the trainer's step guard (non-finite steps, exit 4)",
    "RewardFunctionError": "the trainer's reward check (exit 2)",
    "HealthStop": "--health stop (exit 3)",
}


class Record(NamedTuple):
    """One labelled run."""

    name: str
    algorithm: str  # "ppo" or "grpo"
    mode: str  # HEALTHY or the failure injected
    description: str  # what was injected (specs.MODES), or the healthy run's settings
    onset: int | None  # the step the failure starts (None: healthy, or a hack that never hurt true success)
    onset_kind: str  # "injected" or "true success falls"
    ended: dict[str, Any]  # {"ended": "finished" | an exception's name, "step": ..., "message": ...}
    rows: list[dict[str, Any]]  # the logged rows, as in metrics.jsonl

    @property
    def healthy(self) -> bool:
        return self.mode == HEALTHY

    @property
    def unhurt(self) -> bool:
        """A reward-hacking run whose true success never fell: the flaw was not exploited, so the run is neither
        sick nor healthy and counts in no rate."""
        return not self.healthy and self.onset is None and self.onset_kind != "injected"


def load_records(directory: str | os.PathLike) -> list[Record]:
    """The records of a directory of NAME.json.gz files, by name; none when the directory does not exist."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    out = []
    for path in sorted(directory.glob("*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
        out.append(Record(*(data[field] for field in Record._fields)))
    return out


def success_fall(rows: Sequence[dict[str, Any]]) -> int | None:
    """The step at which true success starts its final fall, or None if it does not fall for good: the label of a
    reward-hacking run, taken from the task's checker and never from the rules.

    The level at each observation is the mean of the last SUCCESS_WINDOW observations (of all of them, from half a
    window on: a hack can wipe success out within the first window). Success has fallen for good when its last
    2 * SUCCESS_WINDOW observations average at least FINAL_DROP below its best level; the fall starts at the first
    level SUCCESS_DROP below the best so far after which no level comes back within SUCCESS_DROP / 2 of that best. A
    dip that recovers is sampling noise, not the hack."""
    observed = [(row["step"], row[SUCCESS]) for row in rows if SUCCESS in row]
    if len(observed) < 2 * SUCCESS_WINDOW:
        return None
    values = [value for _, value in observed]
    first = SUCCESS_WINDOW // 2  # the first level: a mean of half a window
    levels = [statistics.fmean(values[max(0, i - SUCCESS_WINDOW) : i]) for i in range(first, len(values) + 1)]
    if statistics.fmean(values[-2 * SUCCESS_WINDOW :]) > max(levels) - FINAL_DROP:
        return None
    best = -math.inf
    for i, level in enumerate(levels):
        best = max(best, level)
        if level <= best - SUCCESS_DROP and all(later < best - SUCCESS_DROP / 2 for later in levels[i + 1 :]):
            return observed[first - 1 + i][0]
    return None


class Verdict(NamedTuple):
    """What the rules (and the trainer) said of one run."""

    record: Record
    findings: list[Finding]  # every finding of the replay, in order
    false_alarms: list[Finding]  # healthy run: all; sick run: those before the onset
    flagged_at: int | None  # the step of the first warning/critical finding at or after the onset, or the stop
    flagged_by: str | None  # its rule, or how the trainer stopped the run
    critical_at: int | None  # the step of the first critical finding at or after the onset, or a trainer stop

    @property
    def delay(self) -> int | None:
        """Updates (steps) from the onset to the first flag; negative: flagged before the onset was visible."""
        if self.flagged_at is None or self.record.onset is None:
            return None
        return self.flagged_at - self.record.onset


def verdict(record: Record, thresholds: Thresholds | None = None) -> Verdict:
    _, findings = replay(record.rows, thresholds)
    if record.healthy:
        return Verdict(record, findings, findings, None, None, None)
    onset = record.onset if record.onset is not None else 1
    # Reward hacking: a finding on the way up is not early, it is what the rule is for, unless it came before any
    # step of training went by (step 0 is the evaluation before training).
    after = [f for f in findings if f.step >= onset or (record.onset_kind != "injected" and f.step >= 1)]
    early = [f for f in findings if f not in after]
    flagged = after[0] if after else None
    critical = next((f for f in after if f.severity == CRITICAL), None)
    flagged_at, flagged_by = (flagged.step, flagged.rule) if flagged else (None, None)
    critical_at = critical.step if critical else None
    stop = record.ended.get("ended")
    if stop in TRAINER_STOPS and (flagged_at is None or record.ended["step"] < flagged_at):
        flagged_at, flagged_by = record.ended["step"], TRAINER_STOPS[stop]
    if stop in TRAINER_STOPS and (critical_at is None or record.ended["step"] < critical_at):
        critical_at = record.ended["step"]
    return Verdict(record, findings, early, flagged_at, flagged_by, critical_at)


# ---------------------------------------------------------------------------------------------------------------------
# Margins: how far the rules added for the known misses are from the healthy runs
# ---------------------------------------------------------------------------------------------------------------------


def _entropy_level(h: History, t: Thresholds) -> float | None:
    found = completion_entropy(h, t)
    return found.level if found else None


def _kl_rise(h: History, t: Thresholds) -> float | None:
    for name in (PPO_KL, GRPO_KL):
        climb = kl_climb(h, name, t) if name in h.row else None
        if climb is not None and climb.z >= t.kl_trend_z:
            return climb.rise
    return None


def _value_z(h: History, t: Thresholds) -> float | None:
    trend = value_trend(h, t)
    if trend is None or trend.level >= t.value_explained_low or trend.returns_var <= 0:
        return None
    return trend.z


class Margin(NamedTuple):
    """One statistic a rule holds against one threshold, where the rule's other conditions hold."""

    rule: str
    mode: str  # the failure mode it was added for
    statistic: str  # in words
    threshold: str  # the Thresholds field
    below: bool  # the rule fires when the statistic is below the threshold (else at or above it)
    scale: bool  # a positive quantity: the margin is a ratio (else a difference, as for a z)
    measure: Callable[[History, Thresholds], float | None]


MARGINS = (
    Margin(
        "sampling_nearly_greedy", "entropy_collapse", "entropy of a whole completion (nats)", "completion_entropy_low",
        True, True, _entropy_level,
    ),
    Margin(
        "kl_runaway", "kl_runaway", "KL climb over the trend window (nats/token), where its Mann-Kendall z >= "
        "kl_trend_z", "kl_trend_rise", False, True, _kl_rise,
    ),
    Margin(
        "value_not_learning", "value_frozen", "Mann-Kendall z of val/var_explained over the trend window, where its "
        "level < value_explained_low", "value_trend_z", True, False, _value_z,
    ),
)  # fmt: skip


def _measured(record: Record, margins: Sequence[Margin], t: Thresholds) -> dict[str, list[tuple[int, float]]]:
    """Each margin's statistic at every row of the run where it is defined: rule -> [(step, value)]."""
    history, out = History(t.history_length(), t.start_length()), {m.rule: [] for m in margins}
    for index, row in enumerate(record.rows):
        step = row.get("step", index)
        history.add(step, {k: v for k, v in row.items() if k != "step"})
        for m in margins:
            value = m.measure(history, t)
            if value is not None:
                out[m.rule].append((step, value))
    return out


def render_margins(records: Sequence[Record], margins: Sequence[Margin] = MARGINS) -> list[str]:
    """The margins table: for each statistic, its threshold, the nearest healthy run, and the failure's runs at the
    rule's first finding."""
    t = Thresholds()
    measured = {r.name: _measured(r, margins, t) for r in records if r.healthy or r.mode in {m.mode for m in margins}}
    lines = [
        "| rule (failure mode) | statistic | fires | threshold | nearest healthy run | the failure's runs at the "
        "rule's first finding | ... and their most extreme after the onset |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in margins:
        threshold = getattr(t, m.threshold)
        healthy = [(value, step, r.name) for r in records if r.healthy for step, value in measured[r.name][m.rule]]
        nearest = (min if m.below else max)(healthy, default=None)
        if nearest is None:
            shown = "never defined"
        else:
            value, step, name = nearest
            room = f"{value / threshold:.2f}x" if m.scale else f"{value - threshold:+.2f}"
            shown = f"{value:.3g} ({room} the threshold; {name}, step {step})"
        at_flag, extreme = [], []
        for r in records:
            if r.mode != m.mode or r.healthy:
                continue
            first = next((f.step for f in verdict(r).findings if f.rule == m.rule), None)
            at_flag += [value for step, value in measured[r.name][m.rule] if step == first]
            after = [value for step, value in measured[r.name][m.rule] if step >= (r.onset or 1)]
            extreme += [(min if m.below else max)(after)] if after else []
        sick = f"{min(at_flag):.3g} to {max(at_flag):.3g} ({len(at_flag)} runs)" if at_flag else "not flagged"
        worst = f"{min(extreme):.3g} to {max(extreme):.3g}" if extreme else "-"
        lines.append(
            f"| `{m.rule}` ({m.mode}) | {m.statistic} | {'below' if m.below else 'at or above'} | `{m.threshold}` = "
            f"{threshold:g} | {shown} | {sick} | {worst} |"
        )
    return lines


# ---------------------------------------------------------------------------------------------------------------------
# The table of docs/health.md
# ---------------------------------------------------------------------------------------------------------------------


def _delays(verdicts: Sequence[Verdict]) -> str:
    delays = [v.delay for v in verdicts if v.delay is not None]
    if not delays:
        return "-"
    median = statistics.median(delays)
    shown = f"{median:g}" if len(delays) == 1 else f"{median:g} ({min(delays)} to {max(delays)})"
    return shown


def _rules(verdicts: Sequence[Verdict]) -> str:
    firsts = Counter(v.flagged_by for v in verdicts if v.flagged_by)
    return ", ".join(
        f"`{rule}` ({n})" if not rule.startswith("the trainer") else f"{rule} ({n})"
        for rule, n in firsts.most_common()
    )


def _first_by(verdict: Verdict, rule: str) -> int | None:
    """The step of `rule`'s first finding at or after the onset (a hack's rule fires on the way up: any step >= 1)."""
    return next(
        (f.step for f in verdict.findings if f.step >= 1 and f not in verdict.false_alarms and f.rule == rule), None
    )


def render_markdown(records: Sequence[Record]) -> str:
    """The "Measured detection" section of docs/health.md (text, ending with a newline)."""
    verdicts = [verdict(r) for r in records]
    healthy = [v for v in verdicts if v.record.healthy]
    sick = [v for v in verdicts if not v.record.healthy and not v.record.unhurt]
    unhurt = [v for v in verdicts if v.record.unhurt]
    modes = {v.record.mode: v.record.description for v in sick}
    by_mode = {mode: [v for v in sick if v.record.mode == mode] for mode in sorted(modes)}
    flagged = [v for v in sick if v.flagged_at is not None]
    recall = len(flagged) / len(sick) if sick else 0.0
    alarms = [f for v in healthy for f in v.false_alarms]
    left_out = (
        f" {len(unhurt)} reward-hacking run(s) whose true success never fell (the flaw went unexploited) count in "
        "no rate; they are listed at the end."
        if unhurt
        else ""
    )
    lines = [
        "## Measured detection",
        "",
        f"The rules above, replayed over a labelled set of {len(records)} runs of the built-in task: {len(healthy)} "
        f"healthy runs and {len(sick) + len(unhurt)} runs with one failure injected each (bench/health/specs.py says "
        "what each run is; `python bench/health/build.py` trains the runs it has no record of and regenerates this "
        "section). Each label comes from outside the rules: the failure injected and its onset, which is the step of "
        "the injected change, or for reward hacking the step at which true success starts its final fall (the mean "
        f"of `{SUCCESS}` over {SUCCESS_WINDOW} steps {SUCCESS_DROP:g} below its best so far and never back within "
        f"{SUCCESS_DROP / 2:g} of it, the last {2 * SUCCESS_WINDOW} steps at least {FINAL_DROP:g} below the best)."
        f"{left_out} Replaying a run's rows is what `rlhfkit doctor` does with its metrics.jsonl and what the trainer "
        "does with the same rows as it logs them, so the numbers hold for both. A sick run counts as flagged by its "
        "first warning or critical finding at or after the onset (for reward hacking, after the first step: a "
        "warning on the way to the fall is what the rules are for), or by the trainer stopping it with an "
        "explanation; delays are in steps (PPO updates, GRPO optimizer steps) after the onset.",
        "",
        f"- **Recall:** {len(flagged)} of {len(sick)} runs with a failure flagged ({recall:.0%}); failure modes "
        f"with at least one rule that fires: {sum(any(v.flagged_at is not None for v in vs) for vs in by_mode.values())} "
        f"of {len(by_mode)}.",
        f"- **False alarms:** {len(alarms)} finding(s) over {len(healthy)} healthy runs "
        f"({sum(f.severity == CRITICAL for f in alarms)} critical); "
        f"{sum(len(v.false_alarms) for v in sick)} before the onset of a sick run.",
        "",
        "| failure mode (what was injected) | runs | flagged | critical | first flag, steps after onset: median "
        "(range) | first to flag (runs) |",
        "|---|---|---|---|---|---|",
    ]
    for mode, vs in by_mode.items():
        lines.append(
            f"| **{mode}**: {modes[mode]} | {len(vs)} | {sum(v.flagged_at is not None for v in vs)} | "
            f"{sum(v.critical_at is not None for v in vs)} | {_delays(vs)} | {_rules(vs)} |"
        )
    lines += [
        "",
        "### Every rule",
        "",
        "| rule | runs with a failure where it fired (first) | healthy runs where it fired |",
        "|---|---|---|",
    ]
    fired_sick = Counter(rule for v in sick for rule in {f.rule for f in v.findings if f not in v.false_alarms})
    firsts = Counter(v.flagged_by for v in sick if v.flagged_by)
    fired_healthy = Counter(rule for v in healthy for rule in {f.rule for f in v.findings})
    for rule in sorted(set(fired_sick) | set(fired_healthy) | {r for r in firsts if not r.startswith("the trainer")}):
        lines.append(f"| `{rule}` | {fired_sick[rule]} ({firsts[rule]}) | {fired_healthy[rule]} |")
    hacking = [v for v in verdicts if not v.record.healthy and v.record.onset_kind != "injected"]
    if hacking:
        lines += [
            "",
            "### Reward hacking against true success",
            "",
            "The first flag of any rule, and the first `reward_overoptimised` finding (the rule that compares the "
            "score with true success), against the step at which true success starts its final fall.",
            "",
            "| run | true success falls at | first flag | by | before the fall? | `reward_overoptimised` at |",
            "|---|---|---|---|---|---|",
        ]
        for v in hacking:
            fall = v.record.onset if v.record.onset is not None else "never"
            before = (
                "-"
                if v.flagged_at is None or v.record.onset is None
                else ("yes" if v.delay <= 0 else f"no, {v.delay} later")
            )
            by = f"`{v.flagged_by}`" if v.flagged_by and not v.flagged_by.startswith("the trainer") else v.flagged_by
            overopt = _first_by(v, "reward_overoptimised")
            lines.append(
                f"| {v.record.name} | {fall} | {v.flagged_at if v.flagged_at is not None else '-'} | {by or '-'} | "
                f"{before} | {overopt if overopt is not None else '-'} |"
            )
    if any(v.record.mode in {m.mode for m in MARGINS} for v in sick):
        lines += [
            "",
            "### Margins of the rules for the known misses",
            "",
            "Three failures went unflagged, or were flagged late, until rules were added for them (issue 41): sampling "
            "at a low temperature (`entropy_collapse` measures the entropy against its own start, which is already "
            "low), a steady KL climb with kl_coef 0 (the window-to-window test flagged it 74 to 95 updates late) and "
            "a value model that stops learning. Each new statistic against its threshold, with the healthy run "
            "nearest to it over all their steps, and the failure's runs at the rule's first finding:",
            "",
            *render_margins(records),
            "",
            "What they do not do:",
            "",
            "- `sampling_nearly_greedy` holds an absolute level, ln 2 nats per completion, not the entropy relative to "
            "the sampling temperature's own: the logged rows carry no temperature, and the entropy at temperature 1 "
            "would have to be logged beside the sampled one. Long completions rarely fall below ln 2 even when each "
            "token is nearly greedy, so it catches sampling that repeats short answers (GRPO groups of one text), "
            "not a per-token collapse; `entropy_collapse` covers that against its start.",
            "- `kl_runaway`'s climb test needs a full window (60 observations), so it flags at the 60th update at the "
            "earliest. Healthy PPO runs' KL climbs too, as steadily (Mann-Kendall z up to about 6 over the same "
            "window): what separates a runaway is the rate, in nats per token, not the steadiness. A KL penalty too weak for the learning "
            "rate climbs the same way and is flagged too (the reward-hacking runs at kl_coef 0.01).",
            "- `value_not_learning` sees only a value model that explains less than `value_explained_low` of the "
            "returns' variance: one that stops after learning more keeps its explained variance and is not flagged "
            "(the labelled runs freeze it at update 20, when it explains about 1%). It needs its window to fill with "
            "the stalled updates, some 45 to 50 after the freeze.",
        ]
    lines += ["", "### Every run", "", "| run | onset | ended | findings (step rule severity) |", "|---|---|---|---|"]
    for v in verdicts:
        ended = v.record.ended.get("ended", "?")
        if ended != "finished":
            ended = f"{ended} at {v.record.ended.get('step')}"
        shown = "; ".join(f"{f.step} `{f.rule}` {f.severity}" for f in v.findings[:6])
        more = f"; and {len(v.findings) - 6} more" if len(v.findings) > 6 else ""
        onset = "-" if v.record.onset is None else v.record.onset
        lines.append(f"| {v.record.name} | {onset} | {ended} | {shown or 'none'}{more} |")
    return "\n".join(lines) + "\n"
