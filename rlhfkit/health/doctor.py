"""``rlhfkit doctor RUN_DIR``: re-run the health rules over a finished or crashed run's metrics.jsonl.

Exit status: 0 when no critical finding (warnings allowed), 1 when at least one finding is critical,
2 when the run directory or its metrics.jsonl is missing or the flags are wrong.
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
from rlhfkit.health.output import SEVERITY_STYLES
from rlhfkit.health.rules import CRITICAL, WARNING, Thresholds, parse_thresholds
from rlhfkit.tracking.rundir import METRICS_FILE, read_jsonl


class Diagnosis(NamedTuple):
    findings: list[Finding]  # in the order the monitor reported them during the replay
    rows: int  # metric rows read
    skipped_lines: list[int]  # 1-based line numbers that were not a JSON object (a crash tears the last one)
    last_step: int | None
    firing_at_end: dict[str, str]  # rules still firing at the last row: name -> severity


def doctor(run_dir: str | os.PathLike, thresholds: Thresholds | None = None) -> Diagnosis:
    """Replay run_dir/metrics.jsonl through a fresh HealthMonitor, exactly as the trainer would have.

    Raises FileNotFoundError naming the path when the directory or metrics.jsonl is missing.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {str(run_dir)!r} does not exist")
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in {str(run_dir)!r} (looked for {str(path)!r})")
    rows, skipped = read_jsonl(path)
    monitor, findings = replay(rows, thresholds)
    return Diagnosis(findings, len(rows), skipped, monitor.history.step, monitor.firing())


def _print_report(run_dir: str, d: Diagnosis) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    say = functools.partial(console.print, soft_wrap=True)  # plain lines stay whole in logs and pipes
    read = f"{d.rows} rows" + (f" up to step {d.last_step}" if d.last_step is not None else "")
    if d.skipped_lines:
        read += f"; skipped unreadable line(s) {', '.join(map(str, d.skipped_lines))} (a crash cuts the last one)"
    say(Text(f"rlhfkit doctor {run_dir}: {read}"))
    if not d.findings:
        say(Text("No findings: every health rule stayed quiet.", style="bold green"))
        return
    table = Table(title="Health findings", show_lines=True)
    for column in ("step", "severity", "rule", "what happened"):
        table.add_column(column)
    for f in d.findings:
        style = SEVERITY_STYLES.get(f.severity, "")
        table.add_row(str(f.step), Text(f.severity, style=style), f.rule, Text(f.message))
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
    """``rlhfkit doctor RUN_DIR [--health_thresholds name=value,...] [--json]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="rlhfkit doctor",
        description="Check a finished or crashed run's metrics.jsonl with the health rules (see docs/health.md). "
        "Exit status: 0 no critical finding, 1 at least one critical finding, 2 bad input.",
    )
    parser.add_argument("run_dir", help="The run directory (output_dir) holding metrics.jsonl.")
    parser.add_argument(
        "--health_thresholds",
        default="",
        help="Override thresholds: 'name=value,name=value' or a JSON object (names in docs/health.md).",
    )
    parser.add_argument("--json", action="store_true", help="Print one JSON finding per line instead of a table.")
    ns = parser.parse_args(list(argv))
    try:
        diagnosis = doctor(ns.run_dir, parse_thresholds(ns.health_thresholds))
    except (FileNotFoundError, ValueError) as e:
        print(f"rlhfkit doctor: error: {e}", file=sys.stderr)
        return 2
    if ns.json:
        for f in diagnosis.findings:
            print(json.dumps(f.to_dict()))
    else:
        _print_report(ns.run_dir, diagnosis)
    return 1 if any(f.severity == CRITICAL for f in diagnosis.findings) else 0
