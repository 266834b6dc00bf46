"""HealthMonitor: runs the rules on each logged row and reports each episode of trouble once.

    monitor = HealthMonitor(parse_thresholds(cfg.health_thresholds))
    for step ...:
        findings = monitor.observe(step, scalars)      # only NEW findings
        scalars.update(monitor.summary_metrics())      # how many rules fire, per severity
        ...

A rule that keeps firing step after step is one problem, not a hundred: it is reported when it starts,
again if it escalates (warning -> critical), and again only after it has been quiet for
``quiet_observations`` evaluations. A rule is evaluated only on rows that carry one of its metrics;
on other rows (eval-only rows, say) it keeps its previous state.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlhfkit.health.rules import CRITICAL, RULES, SEVERITIES, WARNING, History, Rule, Thresholds
from rlhfkit.metrics import registry as M
from rlhfkit.tracking.rundir import METRICS_FILE, read_jsonl


@dataclass(frozen=True)
class Finding:
    """One reported problem: where, which rule, how bad, the numbers, what happened and what to try."""

    step: int
    rule: str
    severity: str
    metrics: dict[str, float]
    message: str
    advice: str
    thresholds: dict[str, float] = field(default_factory=dict)  # the threshold each metric was held against

    def to_dict(self) -> dict[str, Any]:
        """The health.jsonl record: {"step", "rule", "severity", "metrics", "message", "advice", "thresholds"}."""
        return asdict(self)


def _rank(severity: str | None) -> int:
    return -1 if severity is None else SEVERITIES.index(severity)


@dataclass
class _RuleState:
    firing: str | None = None  # severity at the rule's latest evaluation, None when silent
    reported: str | None = None  # highest severity reported in the open episode; None: no open episode
    quiet: int = 0  # evaluations without firing since the episode's last hit


class HealthMonitor:
    """Feed it every logged row; it returns the findings worth telling the user about now."""

    def __init__(self, thresholds: Thresholds | None = None, rules: Iterable[Rule] = RULES):
        self.thresholds = thresholds or Thresholds()
        self.rules = tuple(rules)
        names = [rule.name for rule in self.rules]
        if len(names) != len(set(names)):
            raise ValueError(f"health rule names must be unique, got {names}")
        self.history = History(self.thresholds.history_length(), self.thresholds.start_length())
        self._states = {rule.name: _RuleState() for rule in self.rules}

    @property
    def windowed(self) -> Thresholds:
        """The thresholds with their windows in observations of this run's logging interval (Thresholds.for_interval):
        a run logged every 10 steps holds a tenth as many rows in a window of the same steps."""
        return self.thresholds.for_interval(self.history.interval)

    def observe(self, step: int, scalars: Mapping[str, Any]) -> list[Finding]:
        """Add one logged row (non-numeric values are ignored) and return the new findings, if any."""
        self.history.add(step, scalars)
        thresholds, new = self.windowed, []
        for rule in self.rules:
            if not rule.applies_to(self.history.row):
                continue
            hit = rule.check(self.history, thresholds)
            state = self._states[rule.name]
            if hit is None:
                state.firing = None
                state.quiet += 1
                if state.quiet >= thresholds.quiet_observations:
                    state.reported = None  # the episode is over; the next hit is news again
                continue
            state.firing, state.quiet = hit.severity, 0
            if _rank(hit.severity) > _rank(state.reported):  # a new episode, or an escalation
                state.reported = hit.severity
                new.append(
                    Finding(
                        step,
                        rule.name,
                        hit.severity,
                        dict(hit.metrics),
                        hit.message,
                        rule.advice,
                        dict(hit.thresholds),
                    )
                )
        return new

    def firing(self) -> dict[str, str]:
        """Rules firing as of the last observed row: rule name -> severity."""
        return {name: state.firing for name, state in self._states.items() if state.firing is not None}

    def summary_metrics(self) -> dict[str, int]:
        """The two scalars the trainer logs each step: how many rules fire at each severity right now."""
        severities = list(self.firing().values())
        return {M.HEALTH_WARNINGS.name: severities.count(WARNING), M.HEALTH_CRITICAL.name: severities.count(CRITICAL)}


def replay(
    rows: list[dict[str, Any]], thresholds: Thresholds | None = None, until_step: int | None = None
) -> tuple[HealthMonitor, list[Finding]]:
    """A fresh monitor fed `rows` in order (rows after `until_step` left out), and what it reported."""
    monitor, findings = HealthMonitor(thresholds), []
    for index, row in enumerate(rows):
        step = row.get("step", index)
        if until_step is not None and step > until_step:
            continue
        findings += monitor.observe(step, {k: v for k, v in row.items() if k != "step"})
    return monitor, findings


def resume_monitor(
    run_dir: str | os.PathLike, thresholds: Thresholds | None = None, until_step: int | None = None
) -> HealthMonitor:
    """The monitor as it stood at `until_step` of an earlier run in run_dir, for --resume_from_checkpoint.

    Without it a resumed run would forget its windows and take the resume point as the "start of the
    run" (the entropy rule's reference), and report again an episode that was already in health.jsonl.
    A missing metrics.jsonl gives a fresh monitor.
    """
    path = Path(run_dir) / METRICS_FILE
    rows = read_jsonl(path)[0] if path.is_file() else []
    return replay(rows, thresholds, until_step)[0]
