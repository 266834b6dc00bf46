"""``rlhfkit doctor RUN``: re-run the health rules over a finished or crashed run's logged metrics.

RUN is an rlhfkit run directory (metrics.jsonl), or a run of TRL's trainers (any transformers Trainer) logged to
TensorBoard or W&B (offline files or a history CSV), its trainer_state.json (a checkpoint, an output_dir of them, or
a Hub repo id ORG/NAME), or verl's logs; ``--trackio PROJECT`` reads a Trackio run (sources.py). A summary of what
was read comes first (which reader, the rows and steps, the metric names mapped from other frameworks', the rules
that had no metric to read), then each finding with the evidence: the metric's values around it and the threshold
it crossed.

Exit status: 0 when no critical finding (warnings allowed), 1 when at least one finding is critical,
2 when the run cannot be read or the flags are wrong.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

from rlhfkit.health.monitor import Finding, replay
from rlhfkit.health.output import SEVERITY_STYLES, evidence_text
from rlhfkit.health.rules import CRITICAL, RULES, SEVERITIES, Thresholds, parse_thresholds
from rlhfkit.health.sources import Source, read_source, read_trackio


class Diagnosis(NamedTuple):
    findings: list[Finding]  # in the order the monitor reported them during the replay
    rows: int  # metric rows read
    skipped_lines: list[int]  # 1-based line numbers that were not a JSON object (a crash tears the last one)
    last_step: int | None
    firing_at_end: dict[str, str]  # rules still firing at the last row: name -> severity
    source: Source  # the rows read and where from
    rules_without_metrics: list[str] = []  # rules that read metrics, none of which any row holds: they never ran


def doctor(
    run: str | os.PathLike | None,
    thresholds: Thresholds | None = None,
    *,
    source: Source | None = None,
    revision: str | None = None,
) -> Diagnosis:
    """Replay the logged rows of `run` (sources.read_source: a path, or a Hub repo id at `revision`), or `source`'s,
    through a fresh HealthMonitor, exactly as the trainer would have.

    Raises FileNotFoundError naming what was looked for when `run` holds no run, ValueError saying what is wrong
    with what it holds.
    """
    if source is None:
        source = read_source(run, revision=revision)
    monitor, findings = replay(source.rows, thresholds)
    idle = rules_without_metrics(source.rows)
    step = monitor.history.step
    return Diagnosis(findings, len(source.rows), source.skipped_lines, step, monitor.firing(), source, idle)


def rules_without_metrics(rows: list[dict]) -> list[str]:
    """The rules that read metrics (a non-empty `metrics`), none of which appears in any of `rows`: they never ran."""
    present = set().union(*rows) if rows else set()
    return [rule.name for rule in RULES if rule.metrics and present.isdisjoint(rule.metrics)]


def summary(name: str, d: Diagnosis) -> dict:
    """What was read and what came of it, as facts: the first line of ``--json`` and the head of the report."""
    steps = sorted({row["step"] for row in d.source.rows if "step" in row})
    severities = [f.severity for f in d.findings]
    return {
        "run": name,
        "source": d.source.description,
        "reader": d.source.reader,
        "rows": d.rows,
        "steps": {"first": steps[0], "last": steps[-1], "count": len(steps)} if steps else None,
        "skipped_lines": d.skipped_lines,
        "framework": d.source.framework,
        "mapped": {rule: key for rule, key in d.source.mapped.items() if rule != key},
        "notes": list(d.source.notes),
        "rules_without_metrics": d.rules_without_metrics,
        "findings": {severity: severities.count(severity) for severity in reversed(SEVERITIES)},
    }


def summary_lines(facts: dict) -> list[str]:
    """The summary in words, a line each: reader and steps, mapped names, notes, rules that could not run."""
    steps = facts["steps"]
    span = f"steps {steps['first']}..{steps['last']} ({steps['count']} steps)" if steps else "no steps"
    lines = [f"Read with the {facts['reader'] or 'given'} reader: {facts['rows']} rows, {span}."]
    if facts["mapped"]:
        framework = f" ({facts['framework']})" if facts["framework"] else ""
        pairs = ", ".join(f"{rule} <- {key}" for rule, key in facts["mapped"].items())
        lines.append(f"Metrics mapped from the run's names{framework}: {pairs}.")
    lines += [f"Note: {note}." for note in facts["notes"]]
    idle = facts["rules_without_metrics"]
    if idle:
        lines.append(
            f"Not run, no metric they read in this run ({len(idle)} of {len(RULES)} rules): {', '.join(idle)}."
        )
    return lines


def _print_report(name: str, d: Diagnosis) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    say = functools.partial(console.print, soft_wrap=True)  # plain lines stay whole in logs and pipes
    read = f"{d.rows} rows" + (f" up to step {d.last_step}" if d.last_step is not None else "")
    if d.skipped_lines:
        read += f"; skipped unreadable line(s) {', '.join(map(str, d.skipped_lines))} (a crash cuts the last one)"
    say(Text(f"rlhfkit doctor {name}: {read} ({d.source.description})"))
    facts = summary(name, d)
    for line in summary_lines(facts):
        say(Text(line, style="dim"))
    if not d.findings:
        say(Text("No findings: every health rule stayed quiet.", style="bold green"))
        return
    table = Table(title="Health findings", show_lines=True)
    for column in ("step", "severity", "rule", "what happened", "evidence"):
        table.add_column(column)
    for f in d.findings:
        style = SEVERITY_STYLES.get(f.severity, "")
        evidence = evidence_text(d.source.rows, f)
        table.add_row(str(f.step), Text(f.severity, style=style), f.rule, Text(f.message), Text(evidence))
    console.print(table)
    say(Text("What to try:", style="bold"))
    for rule, advice in dict((f.rule, f.advice) for f in d.findings).items():
        say(Text.assemble(("  " + rule + ": ", "bold"), advice))
    if d.firing_at_end:
        still = ", ".join(f"{name} ({severity})" for name, severity in d.firing_at_end.items())
        say(Text(f"Still firing at the last row: {still}"))
    counts = ", ".join(f"{n} {severity}" for severity, n in facts["findings"].items())
    say(Text(f"{counts} finding(s).", style="bold"))


def cmd_doctor(argv: Sequence[str]) -> int:
    """``rlhfkit doctor RUN | --trackio PROJECT [--run NAME] [--revision R] [--health_thresholds name=value,...]
    [--json]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="rlhfkit doctor",
        description="Check a finished or crashed run with the health rules (see docs/health.md): an rlhfkit run "
        "directory; a TRL (transformers Trainer) run logged to TensorBoard, W&B or Trackio, or its trainer_state.json "
        "(local or a Hub repo id); verl's logs. Exit status: 0 no critical finding, 1 at least one critical finding, "
        "2 bad input.",
    )
    parser.add_argument(
        "run_dir",
        nargs="?",
        help="An rlhfkit run directory (metrics.jsonl); a TRL output_dir or runs/ directory with TensorBoard event "
        "files; a W&B offline-run-* directory, its .wandb file or a wandb/ directory holding one, or a W&B history "
        "exported as .csv; a transformers trainer_state.json, a checkpoint-N/ holding one or an output_dir of them "
        "(the newest is read), or a log_history list saved as .json; a Hub repo id ORG/NAME holding those; verl's "
        "console log or JSONL.",
    )
    parser.add_argument("--revision", help="With a Hub repo id: the branch, tag or commit to read (default: main).")
    parser.add_argument("--trackio", metavar="PROJECT", help="Read a run of this Trackio project instead.")
    parser.add_argument("--run", metavar="NAME", help="With --trackio: the run (needed when the project has several).")
    parser.add_argument(
        "--health_thresholds",
        default="",
        help="Override thresholds: 'name=value,name=value' or a JSON object (names in docs/health.md).",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='Print a {"summary": {...}} line (what was read), then one JSON finding per line, instead of a table.',
    )
    ns = parser.parse_args(list(argv))
    if (ns.run_dir is None) == (ns.trackio is None):
        parser.error("give a run_dir, or --trackio PROJECT (one of them)")
    if ns.revision is not None and ns.run_dir is None:
        parser.error("--revision goes with a Hub repo id as run_dir, not with --trackio")
    try:
        thresholds = parse_thresholds(ns.health_thresholds)
        source = read_trackio(ns.trackio, ns.run) if ns.trackio else None
        diagnosis = doctor(ns.run_dir, thresholds, source=source, revision=ns.revision)
    except (OSError, ValueError) as e:  # no run there, an unreadable log, a Hub repo not reachable: one line
        print(f"rlhfkit doctor: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    name = ns.run_dir or f"--trackio {ns.trackio}"
    if ns.json:
        print(json.dumps({"summary": summary(name, diagnosis)}))
        for f in diagnosis.findings:
            print(json.dumps(f.to_dict()))
    else:
        _print_report(name, diagnosis)
    return 1 if any(f.severity == CRITICAL for f in diagnosis.findings) else 0
