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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from rlhfkit.health.monitor import Finding, replay
from rlhfkit.health.rules import CRITICAL, Thresholds

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
