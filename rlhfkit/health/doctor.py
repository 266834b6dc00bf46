"""``rlhfkit doctor RUN``: re-run the health rules over a finished or crashed run's logged metrics.

RUN is an rlhfkit run directory (metrics.jsonl), or a run of TRL's trainers (any transformers Trainer) logged to
TensorBoard or W&B (offline files); ``--trackio PROJECT`` reads a Trackio run (sources.py). Each finding is printed
with the evidence: the metric's values around it and the threshold it crossed.

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
from pathlib import Path
from typing import NamedTuple

from rlhfkit.health.monitor import Finding, replay
from rlhfkit.health.output import SEVERITY_STYLES, evidence_text
from rlhfkit.health.rules import CRITICAL, WARNING, Thresholds, parse_thresholds
from rlhfkit.health.sources import Source, read_source, read_trackio


class Diagnosis(NamedTuple):
    findings: list[Finding]  # in the order the monitor reported them during the replay
    rows: int  # metric rows read
    skipped_lines: list[int]  # 1-based line numbers that were not a JSON object (a crash tears the last one)
    last_step: int | None
    firing_at_end: dict[str, str]  # rules still firing at the last row: name -> severity
    source: Source  # the rows read and where from


def doctor(
    run: str | os.PathLike | None, thresholds: Thresholds | None = None, *, source: Source | None = None
) -> Diagnosis:
    """Replay the logged rows of `run` (sources.read_source), or `source`'s, through a fresh HealthMonitor, exactly
    as the trainer would have.

    Raises FileNotFoundError naming what was looked for when `run` holds no rows.
    """
    if source is None:
        path = Path(run)
        if not path.exists():
            raise FileNotFoundError(f"run directory {str(path)!r} does not exist")
        source = read_source(path)
    monitor, findings = replay(source.rows, thresholds)
    return Diagnosis(findings, len(source.rows), source.skipped_lines, monitor.history.step, monitor.firing(), source)


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
    severities = [f.severity for f in d.findings]
    say(Text(f"{severities.count(CRITICAL)} critical, {severities.count(WARNING)} warning finding(s).", style="bold"))


def cmd_doctor(argv: Sequence[str]) -> int:
    """``rlhfkit doctor RUN_DIR | --trackio PROJECT [--run NAME] [--health_thresholds name=value,...] [--json]``;
    returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="rlhfkit doctor",
        description="Check a finished or crashed run with the health rules (see docs/health.md): an rlhfkit run "
        "directory, or a TRL (transformers Trainer) run logged to TensorBoard, W&B or Trackio. Exit status: 0 no "
        "critical finding, 1 at least one critical finding, 2 bad input.",
    )
    parser.add_argument(
        "run_dir",
        nargs="?",
        help="An rlhfkit run directory (metrics.jsonl); a TRL output_dir or runs/ directory with TensorBoard event "
        "files; a W&B offline-run-* directory, its .wandb file or a wandb/ directory holding one.",
    )
    parser.add_argument("--trackio", metavar="PROJECT", help="Read a run of this Trackio project instead.")
    parser.add_argument("--run", metavar="NAME", help="With --trackio: the run (needed when the project has several).")
    parser.add_argument(
        "--health_thresholds",
        default="",
        help="Override thresholds: 'name=value,name=value' or a JSON object (names in docs/health.md).",
    )
    parser.add_argument("--json", action="store_true", help="Print one JSON finding per line instead of a table.")
    ns = parser.parse_args(list(argv))
    if (ns.run_dir is None) == (ns.trackio is None):
        parser.error("give a run_dir, or --trackio PROJECT (one of them)")
    try:
        thresholds = parse_thresholds(ns.health_thresholds)
        source = read_trackio(ns.trackio, ns.run) if ns.trackio else None
        diagnosis = doctor(ns.run_dir, thresholds, source=source)
    except (FileNotFoundError, ValueError) as e:
        print(f"rlhfkit doctor: error: {e}", file=sys.stderr)
        return 2
    if ns.json:
        for f in diagnosis.findings:
            print(json.dumps(f.to_dict()))
    else:
        _print_report(ns.run_dir or f"--trackio {ns.trackio}", diagnosis)
    return 1 if any(f.severity == CRITICAL for f in diagnosis.findings) else 0
