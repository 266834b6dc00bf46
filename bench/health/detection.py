"""What the health rules catch, measured: the rules replayed over a labelled set of runs, and the table of
docs/health.md.

The labelled set (bench/health/: specs.py says what each run is, build.py trains it) holds healthy runs of the
built-in tasks and runs with one failure injected each, in three splits: the tuning set (the sort task, on which every
threshold was chosen), the held-out set (the reverse and addition tasks, never used to choose a threshold) and TRL's own
GRPOTrainer (read from its TensorBoard files, and live by HealthCallback). Each split gets its own table. A run's record
(bench/health/records/NAME.json.gz) keeps its labels, which come from outside the rules: ``mode`` ("healthy" or the
failure injected), ``onset`` (the step of the injected change, or for reward hacking the step at which true success
visibly falls), how it ended, and every logged row. Replaying the rows through a fresh monitor is exactly what
``rlhfkit doctor`` does with metrics.jsonl, and what the trainer's live watch does with the same rows as they are
logged.

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
    INFO,
    PPO_KL,
    History,
    Thresholds,
    completion_entropy,
    kl_climb,
    value_movement,
)

HEALTHY = "healthy"
TUNING, HELD_OUT, TRL, AGENTS = "tuning", "held-out", "trl", "agents"  # the splits of the labelled set
# The agent rules, and the failure of the agent task's labelled runs each was written for.
AGENT_RULES = {
    "tools_unused": "tools_never_called",
    "tool_failing": "tool_failures",
    "turn_cap": "turn_cap_reached",
    "tools_abandoned": "tool_use_abandoned",
}
# Reward hacking's onset, from true success alone (success_fall): levels are means of SUCCESS over SUCCESS_WINDOW steps.
SUCCESS, SUCCESS_WINDOW, SUCCESS_DROP, FINAL_DROP = "rollout/task_success", 10, 0.05, 0.1
EVAL_SUCCESS = "eval/task_success"  # the task's checker on the test split (greedy), logged every few steps
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
    rows: list[dict[str, Any]]  # the logged rows, as in metrics.jsonl (a TRL run's: as doctor reads its TensorBoard)
    task: str = "sort"  # the built-in task it trained on
    split: str = TUNING  # TUNING, HELD_OUT or TRL
    seed: int | None = None

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
        out.append(Record(**{field: data[field] for field in Record._fields if field in data}))
    return out


def in_split(records: Sequence[Record], split: str) -> list[Record]:
    """The records of one split (TUNING, HELD_OUT or TRL), in order."""
    return [r for r in records if r.split == split]


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
    # Info findings (a solved task's converged entropy) flag nothing and are no false alarm: warnings and criticals.
    findings = [f for f in findings if f.severity != INFO]
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


def _value_moved(h: History, t: Thresholds) -> float | None:
    found = value_movement(h, t)
    return found.moved if found is not None else None


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
        "value_not_learning", "value_frozen", "movement of the value model's predictions in its updates, "
        "|val/vpred - val/mean| / sqrt(returns/var), where the policy moved", "value_still", True, True, _value_moved,
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
# The tables of docs/health.md: the tuning set, the held-out set beside it, TRL's runs
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


class Measured(NamedTuple):
    """The verdicts of one split, sorted for its tables."""

    verdicts: list[Verdict]
    healthy: list[Verdict]
    sick: list[Verdict]  # sick runs that count: a hack that never hurt true success is left out
    unhurt: list[Verdict]
    by_mode: dict[str, list[Verdict]]  # the sick runs per failure mode, modes in alphabetical order
    descriptions: dict[str, str]  # failure mode -> what was injected

    @property
    def flagged(self) -> list[Verdict]:
        return [v for v in self.sick if v.flagged_at is not None]

    @property
    def alarms(self) -> list[Finding]:
        return [f for v in self.healthy for f in v.false_alarms]


def measure(records: Sequence[Record]) -> Measured:
    verdicts = [verdict(r) for r in records]
    healthy = [v for v in verdicts if v.record.healthy]
    sick = [v for v in verdicts if not v.record.healthy and not v.record.unhurt]
    unhurt = [v for v in verdicts if v.record.unhurt]
    descriptions = {v.record.mode: v.record.description for v in sick}
    by_mode = {mode: [v for v in sick if v.record.mode == mode] for mode in sorted(descriptions)}
    return Measured(verdicts, healthy, sick, unhurt, by_mode, descriptions)


def _summary(m: Measured) -> list[str]:
    recall = len(m.flagged) / len(m.sick) if m.sick else 0.0
    modes_flagged = sum(any(v.flagged_at is not None for v in vs) for vs in m.by_mode.values())
    return [
        f"- **Recall:** {len(m.flagged)} of {len(m.sick)} runs with a failure flagged ({recall:.0%}); failure modes "
        f"with at least one rule that fires: {modes_flagged} of {len(m.by_mode)}.",
        f"- **False alarms:** {len(m.alarms)} finding(s) over {len(m.healthy)} healthy runs "
        f"({sum(f.severity == CRITICAL for f in m.alarms)} critical); "
        f"{sum(len(v.false_alarms) for v in m.sick)} before the onset of a sick run.",
    ]


def _mode_table(m: Measured) -> list[str]:
    lines = [
        "| failure mode (what was injected) | runs | flagged | critical | first flag, steps after onset: median "
        "(range) | first to flag (runs) |",
        "|---|---|---|---|---|---|",
    ]
    for mode, vs in m.by_mode.items():
        lines.append(
            f"| **{mode}**: {m.descriptions[mode]} | {len(vs)} | {sum(v.flagged_at is not None for v in vs)} | "
            f"{sum(v.critical_at is not None for v in vs)} | {_delays(vs)} | {_rules(vs)} |"
        )
    return lines


def _rule_counts(m: Measured) -> tuple[Counter, Counter, Counter]:
    """Per rule: sick runs where it fired after the onset, sick runs it flagged first, healthy runs where it fired."""
    fired_sick = Counter(rule for v in m.sick for rule in {f.rule for f in v.findings if f not in v.false_alarms})
    firsts = Counter(v.flagged_by for v in m.sick if v.flagged_by)
    fired_healthy = Counter(rule for v in m.healthy for rule in {f.rule for f in v.findings})
    return fired_sick, firsts, fired_healthy


def _every_rule(m: Measured) -> list[str]:
    lines = ["| rule | runs with a failure where it fired (first) | healthy runs where it fired |", "|---|---|---|"]
    fired_sick, firsts, fired_healthy = _rule_counts(m)
    for rule in sorted(set(fired_sick) | set(fired_healthy) | {r for r in firsts if not r.startswith("the trainer")}):
        lines.append(f"| `{rule}` | {fired_sick[rule]} ({firsts[rule]}) | {fired_healthy[rule]} |")
    return lines


def _hacking(m: Measured) -> list[str]:
    hacking = [v for v in m.verdicts if not v.record.healthy and v.record.onset_kind != "injected"]
    if not hacking:
        return []
    lines = [
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
    return lines


def _every_run(m: Measured) -> list[str]:
    lines = ["| run | onset | ended | findings (step rule severity) |", "|---|---|---|---|"]
    for v in m.verdicts:
        ended = v.record.ended.get("ended", "?")
        if ended != "finished":
            ended = f"{ended} at {v.record.ended.get('step')}"
        shown = "; ".join(f"{f.step} `{f.rule}` {f.severity}" for f in v.findings[:6])
        more = f"; and {len(v.findings) - 6} more" if len(v.findings) > 6 else ""
        onset = "-" if v.record.onset is None else v.record.onset
        lines.append(f"| {v.record.name} | {onset} | {ended} | {shown or 'none'}{more} |")
    return lines


def render_markdown(records: Sequence[Record]) -> str:
    """The "Measured detection" sections of docs/health.md (text, ending with a newline): the tuning set's table, then
    the held-out set's beside it and TRL's runs, each computed from its own split's records only."""
    lines = _tuning_section(in_split(records, TUNING))
    heldout, trl, agents = in_split(records, HELD_OUT), in_split(records, TRL), in_split(records, AGENTS)
    if heldout:
        lines += ["", *_heldout_section(in_split(records, TUNING), heldout)]
    if trl:
        lines += ["", *_trl_section(trl)]
    if agents:
        lines += ["", *_agents_section(agents)]
    return "\n".join(lines) + "\n"


def _agents_section(records: Sequence[Record]) -> list[str]:
    """The agent task's runs: each agent rule against the failure it was written for, and every other rule's findings
    on healthy agent runs (none is a false alarm the rules may have)."""
    m = measure(records)
    lines = [
        "## Agent runs",
        "",
        f"{len(records)} runs of the built-in agent task (multiplication with a calculator tool, "
        "[agent-task.md](agent-task.md)) at its built-in settings, GRPO and PPO: "
        f"{len(m.healthy)} healthy and {len(m.sick)} with one agent failure each (bench/health/agents.py). The agent "
        "rules were written for these failures and their thresholds chosen before these runs were trained; the other "
        "rules are as tuned on the sort task. A healthy agent run solves the task within about ten steps, after which "
        "its policy is nearly deterministic: entropy_collapse, sampling_nearly_greedy and reward_zero_std say so as "
        "info (the task was solved), which is neither a flag nor a false alarm.",
        "",
        *_summary(m),
        "",
        *_mode_table(m),
        "",
        "| agent rule | failure it is for | its runs it flagged | first finding, steps after onset | healthy agent runs "
        "where it fired |",
        "|---|---|---|---|---|",
    ]
    for mode, rule in AGENT_RULES.items():
        runs = m.by_mode.get(mode, [])
        firsts = [_first_by(v, rule) for v in runs]
        steps = [f - (v.record.onset or 1) for f, v in zip(firsts, runs) if f is not None]
        fired_healthy = sum(any(f.rule == rule for f in v.findings) for v in m.healthy)
        shown = ", ".join(str(d) for d in steps) or "-"
        lines.append(
            f"| `{rule}` | {mode} | {len(steps)} of {len(runs)} | {shown} | {fired_healthy} of {len(m.healthy)} |"
        )
    return [*lines, "", "### Every agent run", "", *_every_run(m)]


def _tuning_section(records: Sequence[Record]) -> list[str]:
    m = measure(records)
    left_out = (
        f" {len(m.unhurt)} reward-hacking run(s) whose true success never fell (the flaw went unexploited) count in "
        "no rate; they are listed at the end."
        if m.unhurt
        else ""
    )
    lines = [
        "## Measured detection",
        "",
        f"The rules above, replayed over the tuning set: {len(records)} runs of the built-in sort task, on which "
        f"every threshold was chosen: {len(m.healthy)} healthy runs and {len(m.sick) + len(m.unhurt)} runs with one "
        "failure injected each (bench/health/specs.py says what each run is; `python bench/health/build.py` trains "
        "the runs it has no record of and regenerates these sections). The held-out runs of other tasks, which no "
        "threshold was chosen on, and TRL's own runs have their tables after this one. Each label comes from outside "
        "the rules: the failure injected and its onset, which is the step of the injected change, or for reward "
        "hacking the step at which true success starts its final fall (the mean "
        f"of `{SUCCESS}` over {SUCCESS_WINDOW} steps {SUCCESS_DROP:g} below its best so far and never back within "
        f"{SUCCESS_DROP / 2:g} of it, the last {2 * SUCCESS_WINDOW} steps at least {FINAL_DROP:g} below the best)."
        f"{left_out} Replaying a run's rows is what `rlhfkit doctor` does with its metrics.jsonl and what the trainer "
        "does with the same rows as it logs them, so the numbers hold for both. A sick run counts as flagged by its "
        "first warning or critical finding at or after the onset (for reward hacking, after the first step: a "
        "warning on the way to the fall is what the rules are for), or by the trainer stopping it with an "
        "explanation; delays are in steps (PPO updates, GRPO optimizer steps) after the onset.",
        "",
        *_summary(m),
        "",
        *_mode_table(m),
        "",
        "### Every rule",
        "",
        *_every_rule(m),
    ]
    if hacking := _hacking(m):
        lines += [
            "",
            "### Reward hacking against true success",
            "",
            "The first flag of any rule, and the first `reward_overoptimised` finding (the rule that compares the "
            "score with true success), against the step at which true success starts its final fall.",
            "",
            *hacking,
        ]
    if any(v.record.mode in {m.mode for m in MARGINS} for v in m.sick):
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
            "window): what separates a runaway is the rate, in nats per token, not the steadiness. A KL penalty too "
            "weak for the learning rate climbs the same way and is flagged too (the reward-hacking runs at kl_coef "
            "0.01).",
            "- `value_not_learning` sees a value model whose weights do not change: a learning rate scheduled to 0, "
            "frozen parameters, no gradient. One that still learns, only too slowly for the run, is not a failure it "
            "can tell from a healthy value model with little to explain: the rule it had until the held-out runs "
            "(explained variance below 0.05 with no upward trend over 60 updates) fired on 5 of the 10 "
            "held-out healthy PPO runs of reverse and addition (the held-out section says more). With one optimizer step per update (one PPO "
            "epoch, one mini-batch) neither model moves before its step, and the rule cannot tell.",
        ]
    lines += ["", "### Every run", "", *_every_run(m)]
    return lines


def _side_by_side(tuning: Measured, heldout: Measured) -> list[str]:
    """Per failure mode: the tuning set's recall and delay beside the held-out set's, and whether the mode's detection
    holds off its tuning task."""
    lines = [
        "| failure mode | tuning (sort): flagged / runs | tuning: first flag after onset | held-out: flagged / runs | "
        "held-out: first flag after onset | held-out: first to flag (runs) | holds on the held-out runs? |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in sorted(set(tuning.by_mode) | set(heldout.by_mode)):
        t, h = tuning.by_mode.get(mode, []), heldout.by_mode.get(mode, [])
        t_flagged = sum(v.flagged_at is not None for v in t)
        h_flagged = sum(v.flagged_at is not None for v in h)
        if not h:
            holds = "no held-out run"
        elif h_flagged == len(h):
            holds = "yes"
        elif h_flagged == 0:
            holds = "**no: holds only on its tuning task**"
        else:
            holds = f"**partly: {len(h) - h_flagged} of {len(h)} missed**"
        lines.append(
            f"| **{mode}** | {t_flagged} / {len(t)} | {_delays(t)} | {h_flagged} / {len(h)} | {_delays(h)} | "
            f"{_rules(h) or '-'} | {holds} |"
        )
    t_all, h_all = len(tuning.flagged), len(heldout.flagged)
    lines.append(
        f"| **all** | {t_all} / {len(tuning.sick)} | {_delays(tuning.sick)} | {h_all} / {len(heldout.sick)} | "
        f"{_delays(heldout.sick)} | | |"
    )
    return lines


def _rules_side_by_side(tuning: Measured, heldout: Measured) -> list[str]:
    t_sick, t_first, t_healthy = _rule_counts(tuning)
    h_sick, h_first, h_healthy = _rule_counts(heldout)
    lines = [
        "| rule | tuning: runs with a failure where it fired (first) | tuning: healthy runs where it fired | "
        "held-out: runs with a failure where it fired (first) | held-out: healthy runs where it fired |",
        "|---|---|---|---|---|",
    ]
    rules = set(t_sick) | set(t_healthy) | set(h_sick) | set(h_healthy) | set(t_first) | set(h_first)
    for rule in sorted(r for r in rules if not r.startswith("the trainer")):
        flag = " **(holds only on its tuning task)**" if h_healthy[rule] and not t_healthy[rule] else ""
        lines.append(
            f"| `{rule}`{flag} | {t_sick[rule]} ({t_first[rule]}) | {t_healthy[rule]} | {h_sick[rule]} "
            f"({h_first[rule]}) | {h_healthy[rule]} |"
        )
    return lines


def _heldout_alarms(heldout: Measured) -> list[str]:
    """The findings on held-out healthy runs: per run and rule, the first one's message (what the rule saw) and the
    steps of the others."""
    lines = []
    for v in heldout.healthy:
        for rule in dict.fromkeys(f.rule for f in v.findings):
            first, *more = [f for f in v.findings if f.rule == rule]
            again = f" (again at {', '.join(str(f.step) for f in more)})" if more else ""
            lines.append(
                f"- {v.record.name}, step {first.step}{again}: `{rule}` {first.severity}: {first.message} "
                f"{_success_change(v.record)}"
            )
    return lines


# Held-out healthy runs of these seeds were trained after the last change to a rule (value_not_learning, rewritten
# when the first held-out runs showed its false alarms): the rules were never read against them before.
LATE_SEEDS = (3, 4, 5)


def _late_runs(m: Measured) -> list[str]:
    late = [v for v in m.healthy if v.record.seed in LATE_SEEDS]
    if not late:
        return []
    found = sorted({f.rule for v in late for f in v.findings})
    which = f": {', '.join(f'`{r}`' for r in found)}" if found else ""
    return [
        f"- **Healthy runs trained after the last change to a rule** (seeds {LATE_SEEDS[0]} to {LATE_SEEDS[-1]}, "
        f"whose rows no rule was ever read against before): {sum(bool(v.findings) for v in late)} of {len(late)} "
        f"with a finding{which}."
    ]


def _alarmed_runs(m: Measured) -> str:
    """How many healthy runs have any finding, overall and per algorithm."""
    per = []
    for algorithm in sorted({v.record.algorithm for v in m.healthy}):
        runs = [v for v in m.healthy if v.record.algorithm == algorithm]
        per.append(f"{algorithm.upper()} {sum(bool(v.findings) for v in runs)} of {len(runs)}")
    return f"{sum(bool(v.findings) for v in m.healthy)} of {len(m.healthy)} ({', '.join(per)})"


def _success_levels(verdicts: Sequence[Verdict]) -> str:
    pairs = [_success_ends(v.record) for v in verdicts]
    pairs = [p for p in pairs if p is not None]
    if not pairs:
        return "not logged"
    first, last = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    return f"{first:.3f} at the start, {last:.3f} at the end"


def _success_ends(record: Record) -> tuple[float, float] | None:
    values = [row[SUCCESS] for row in record.rows if SUCCESS in row]
    if len(values) < 2 * SUCCESS_WINDOW:
        return None
    return statistics.fmean(values[:SUCCESS_WINDOW]), statistics.fmean(values[-SUCCESS_WINDOW:])


def _success_change(record: Record) -> str:
    """True success over the run: the mean of its first and of its last SUCCESS_WINDOW observations."""
    evaluated = [row[EVAL_SUCCESS] for row in record.rows if EVAL_SUCCESS in row]
    shown = f"`{EVAL_SUCCESS}` {evaluated[0]:.3f} -> {evaluated[-1]:.3f}" if len(evaluated) >= 2 else ""
    ends = _success_ends(record)
    if ends is None:
        return f"(the run's true success: {shown})" if shown else ""
    first, last = ends
    evaluation = f"; {shown}" if shown else ""
    return (
        f"(the run's true success, `{SUCCESS}`: {first:.3f} over its first {SUCCESS_WINDOW} steps, {last:.3f} over its "
        f"last{evaluation})"
    )


def _listed(names: Sequence[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return " and ".join(filter(None, (", ".join(names[:-1]), names[-1]))) if names else ""


def _heldout_section(tuning_records: Sequence[Record], records: Sequence[Record]) -> list[str]:
    tuning, m = measure(tuning_records), measure(records)
    tasks = sorted({r.task for r in records})
    left_out = (
        f" {len(m.unhurt)} reward-hacking run(s) whose true success never fell count in no rate (listed below)."
        if m.unhurt
        else ""
    )
    lines = [
        "## Held-out detection: tasks the thresholds never saw",
        "",
        f"The same rules, at the same thresholds (no threshold was chosen on these runs; one rule, "
        "`value_not_learning`, was rewritten after the first of them showed its false alarms, and the healthy runs of "
        f"seeds {LATE_SEEDS[0]} to {LATE_SEEDS[-1]} were trained after that), replayed over "
        f"{len(records)} runs of the built-in {_listed(tasks)} tasks: {len(m.healthy)} healthy runs (seeds, "
        "learning rates, batch sizes, loss types, LoRA, 2 processes) and "
        f"{len(m.sick) + len(m.unhurt)} runs with one of the tuning set's failures injected the same way. PPO on these "
        "tasks is scored by the task's learned reward model alone (the built-in setting: no reward function), GRPO "
        "by the task's rule-based rewards. Labels, flags and delays are counted as for the tuning set; most runs are "
        "the failure runs' short length (120 PPO updates, 100 GRPO steps), so a healthy run here had fewer steps to "
        f"raise a false alarm than a tuning one.{left_out}",
        "",
        *_summary(m),
        f"- **Healthy runs with a finding:** {_alarmed_runs(m)}.",
        *_late_runs(m),
        f"- **True success in the healthy runs** (`{SUCCESS}`, means of the first and of the last {SUCCESS_WINDOW} "
        f"steps, median over runs): held-out {_success_levels(m.healthy)}; tuning {_success_levels(tuning.healthy)}.",
        "",
        "### Tuning set and held-out set, side by side",
        "",
        "A mode whose held-out runs are not all flagged holds only on its tuning task, or only partly, and says so in "
        "the last column.",
        "",
        *_side_by_side(tuning, m),
        "",
        "### Every rule, on both sets",
        "",
        "A rule that fires on held-out healthy runs but on no tuning healthy run is marked: its threshold holds only "
        "on the task it was tuned on.",
        "",
        *_rules_side_by_side(tuning, m),
    ]
    if alarms := _heldout_alarms(m):
        lines += ["", "### False alarms on the held-out healthy runs", "", *alarms]
    lines += ["", "### Held-out failure modes", "", *_mode_table(m)]
    if hacking := _hacking(m):
        lines += ["", "### Held-out reward hacking against true success", "", *hacking]
    if any(v.record.mode in {x.mode for x in MARGINS} for v in m.sick):
        lines += [
            "",
            "### Margins of the rules for the known misses, on the held-out runs",
            "",
            *render_margins(records),
        ]
    lines += ["", "### What the held-out runs show", "", *HELD_OUT_NOTES]
    lines += ["", "### Every held-out run", "", *_every_run(m)]
    return lines


# What the committed held-out records show, read from the tables above (written once they were trained; no threshold
# was changed after, and value_not_learning's rewrite came before the runs of LATE_SEEDS and of reverse-chat). A test
# (tests/bench/health/test_detection.py) checks the numbers quoted here against the records.
HELD_OUT_NOTES = [
    "- **The held-out builds were fixed before these runs.** The first held-out runs used builds with sort's budgets, "
    "on which reverse started at 13% greedy success and addition at 1%, with reward models no better than plain "
    "sampling at picking a right answer; their healthy PPO runs raised the reward model's score without raising true "
    "success, and `reward_overoptimised` flagged 8 of 10, rightly, on runs labelled healthy. Each task now has its "
    "own budgets (docs/builtin_task.md: reverse 56%, addition 40%, reverse-chat 77% greedy at the start, reward "
    "models that beat sampling at best-of-8), and every held-out run was trained again on them.",
    "- **`value_not_learning` was rewritten after the first held-out runs.** Its old form, explained variance below "
    "0.05 with no upward trend over 60 updates, fires on 5 of the 10 healthy PPO runs of reverse and addition here "
    "(replayed with the old rule: heldout-healthy-add-ppo-2proc-s0, -add-ppo-default-s0 and -s1, -add-ppo-kl0.3-s2, "
    "-rev-ppo-batch32-s1), whose value models have little to explain: whether a sampled answer is right is barely "
    "predictable from its first tokens. The new form looks for the failure itself, a value model whose predictions "
    "do not move in its updates while the policy's do. It flags every frozen value model 2 updates after the freeze "
    "(46 to 48 before), on sort and here, and no healthy run. The healthy runs of seeds 3 to 5 (among them one PPO "
    "epoch per update, where nothing moves before the step and the rule must stay silent, and 4 epochs) and all "
    "of reverse-chat's runs were trained after the change. What it gave up: a value model that learns, only too "
    "slowly, is no longer flagged; no rule found one that the healthy runs here do not resemble.",
    "- **A chat-formatted task** (reverse-chat: TRL's conversational prompts and completions, the chat template, "
    "<|im_end|> as EOS) behaves as the text tasks do for the rules. Its healthy PPO runs against the reward model "
    "raise sampled success (13-14% to 19-20% over 120 updates) while greedy success falls from 77% to 69-72%: the "
    "runs train and sample at temperature 0.7 and greedy decoding is not what they optimise. No rule reads that as "
    "a failure, and none should by its label: nothing was injected.",
    "- **Reward hacking is labelled now**: the runs start where the healthy ones do (40-77% greedy success before "
    "training) and pays_for_repeats drives true success to 0-1% (the fall starts 10-14 steps in); each is flagged, "
    "by `reward_overoptimised` or `reward_zero_std`, before its fall is complete.",
    "- **A low sampling temperature** is flagged by `sampling_nearly_greedy` on all three held-out tasks now (the "
    "miss of the first held-out runs, reverse GRPO at temperature 0.2, came from a model unsure of most answers, "
    "which kept 1.7 nats per completion).",
    "- Everything else holds as on sort: a learning rate far too high (critical within 4 steps), reward scale jumps, "
    "non-finite rewards, truncation, zero spread and a missing EOS (at the first full window), a value model "
    "diverging (at once), a steady KL climb at kl_coef 0 (`kl_runaway` at 60, its first full window).",
    "- **The one finding before an onset** is `off_policy_mismatch` on addition's stale_offpolicy run at step 21 "
    "(0.23 nats/token): the staleness of 4 it warns of is part of the injected failure from step 1, and only the "
    "learning rate's raise at step 30 is labelled its onset. No healthy run has a finding.",
    "- **Not in the set**, to fit it in about an hour on two shared cores: reward hacking of the learned reward model "
    "under kl_coef 0.01 (it needs the built-in 320 updates) and a second run of a few modes (one run each for "
    "kl_runaway, value_diverges and stale_offpolicy).",
]


def _live(record: Record) -> list[tuple] | None:
    """The findings HealthCallback reported live inside TRL's trainer, as (step, rule, severity); None: not kept."""
    live = record.ended.get("live")
    return None if live is None else [tuple(f) for f in live]


def _trl_section(records: Sequence[Record]) -> list[str]:
    m = measure(records)
    lines = [
        "## TRL's GRPOTrainer",
        "",
        f"{len(records)} runs of TRL 1.16's own GRPOTrainer on the built-in sort task (its SFT model, prompts and "
        "rule-based rewards) for 60 steps of 8 prompts x 8 completions, learning rate 1e-4 decaying linearly, sampling "
        "at 0.7, TRL's defaults otherwise (loss dapo, beta 0; bench/health/run_trl.py), healthy and with failures given "
        "by TRL's own flags, a reward function or a change to the built trainer. Each run's rows are what `rlhfkit doctor` reads "
        "from the TensorBoard files TRL wrote (`train/<name>` keys), replayed as for the other tables; "
        "`HealthCallback`, attached to the trainer, ran the same rules live, and the last columns say whether it "
        "found the same.",
        "",
        *_summary(m),
        "",
        "| run | onset | doctor (TensorBoard): first flag at, by | critical at | findings (step rule severity) | "
        "HealthCallback live: the same findings? |",
        "|---|---|---|---|---|---|",
    ]
    for v in m.verdicts:
        found = [(f.step, f.rule, f.severity) for f in v.findings]
        live = _live(v.record)
        agrees = "not kept" if live is None else ("yes" if live == found else f"no: {len(live)} live")
        if v.record.healthy:
            flag = "-" if not v.findings else f"false alarm: {v.findings[0].step}, `{v.findings[0].rule}`"
        else:
            flag = f"{v.flagged_at}, `{v.flagged_by}`" if v.flagged_at is not None else "**not flagged**"
        shown = "; ".join(f"{s} `{r}` {sev}" for s, r, sev in found[:5]) + ("; ..." if len(found) > 5 else "")
        onset = "-" if v.record.onset is None else v.record.onset
        critical = "-" if v.critical_at is None else v.critical_at
        lines.append(f"| {v.record.name} | {onset} | {flag} | {critical} | {shown or 'none'} | {agrees} |")
    return lines
