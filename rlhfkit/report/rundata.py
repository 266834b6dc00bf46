"""Reading a run directory for the report: config, metrics, samples and health findings.

The report reads nothing but the run directory (its format: rlhfkit/tracking/rundir.py). Unreadable lines
are skipped and counted, never fatal: a crashed run leaves a half-written last line, and a running one
can be read mid-write. Only a missing directory or a missing metrics.jsonl is an error: without metrics
there is nothing to report.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhfkit.errors import ReportError
from rlhfkit.health.rules import SEVERITIES
from rlhfkit.tracking.rundir import (
    BEFORE_AFTER_FILE,
    CONFIG_FILE,
    HEALTH_FILE,
    METRICS_FILE,
    SAMPLES_FILE,
    read_config,
    read_jsonl,
)


@dataclass
class Run:
    """Everything the report knows about one run directory.

    metrics: rows of metrics.jsonl in file order, numeric values only (bools and strings dropped).
    samples: rows of samples.jsonl in file order.
    findings: rows of health.jsonl, or None when the health checks did not run (no file, or an empty one
        with `health: off` in the config), which the report tells apart from "ran and found nothing".
    notes: problems met while reading (skipped lines, unreadable config), shown in the report.
    """

    name: str
    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, float]]
    samples: list[dict[str, Any]]
    findings: list[dict[str, Any]] | None
    notes: list[str] = field(default_factory=list)
    before_after: dict[str, Any] | None = None  # before_after.json: win rates and completions against the start


def _is_number(value: Any) -> bool:
    # bool is an int subclass; a logged True is a flag, not a value to plot.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _has_step(row: dict[str, Any]) -> bool:
    return _is_number(row.get("step")) and float(row["step"]).is_integer()


def _rows_with_step(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Rows of a run-directory file that carry an integer "step", and the number of lines skipped."""
    rows, unreadable = read_jsonl(path)
    kept = [{**row, "step": int(row["step"])} for row in rows if _has_step(row)]
    return kept, len(unreadable) + len(rows) - len(kept)


def _numeric_row(row: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if _is_number(v)}


def _clean_finding(row: dict[str, Any]) -> dict[str, Any]:
    """A finding with every field present, so the report never trips on a partial record."""
    severity = str(row.get("severity", "info")).lower()
    metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
    return {
        "step": row["step"],
        "rule": str(row.get("rule", "?")),
        "severity": severity if severity in SEVERITIES else "info",
        "metrics": metrics,
        "message": str(row.get("message", "")),
        "advice": str(row.get("advice", "")),
        "thresholds": {k: float(v) for k, v in (row.get("thresholds") or {}).items() if _is_number(v)},
    }


def load_run(path: str | os.PathLike) -> Run:
    """Read one run directory; ReportError when it does not exist or has no metrics.jsonl."""
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"run directory {str(path)!r} does not exist")
    if not (path / METRICS_FILE).is_file():
        raise ReportError(f"run directory {str(path)!r} has no {METRICS_FILE}; is it an rlhfkit output_dir?")

    notes: list[str] = []
    config = read_config(path)
    if not (path / CONFIG_FILE).is_file():
        notes.append(f"{CONFIG_FILE} is missing")
    elif not config:
        notes.append(f"{CONFIG_FILE} does not hold a readable JSON object")

    rows, skipped = _rows_with_step(path / METRICS_FILE)
    metrics = [_numeric_row(r) for r in rows]
    if skipped:
        notes.append(f"{METRICS_FILE}: skipped {skipped} unreadable line(s) (a crash mid-write truncates the last)")

    samples: list[dict[str, Any]] = []
    if (path / SAMPLES_FILE).is_file():
        samples, skipped = _rows_with_step(path / SAMPLES_FILE)
        if skipped:
            notes.append(f"{SAMPLES_FILE}: skipped {skipped} unreadable line(s)")

    findings = None
    if (path / HEALTH_FILE).is_file():
        raw, skipped = _rows_with_step(path / HEALTH_FILE)
        findings = [_clean_finding(r) for r in raw]
        if skipped:
            notes.append(f"{HEALTH_FILE}: skipped {skipped} unreadable line(s)")
        if not findings and config.get("health") == "off":
            findings = None  # every run directory has the file; empty with checks off means "not checked"

    before_after = None
    if (path / BEFORE_AFTER_FILE).is_file():
        try:
            before_after = json.loads((path / BEFORE_AFTER_FILE).read_text(encoding="utf-8"))
        except ValueError:
            notes.append(f"{BEFORE_AFTER_FILE} is not readable JSON")
        if not isinstance(before_after, dict):
            before_after = None

    name = config.get("run_name") if isinstance(config.get("run_name"), str) else ""
    return Run(
        name=name or path.resolve().name,
        path=path,
        config=config,
        metrics=metrics,
        samples=samples,
        findings=findings,
        notes=notes,
        before_after=before_after,
    )


def unique_names(runs: list[Run]) -> None:
    """Make run names distinct (legends and tables key on them): fall back to the directory, then a counter."""
    for run in runs:
        if sum(r.name == run.name for r in runs) > 1:
            run.name = f"{run.name} ({run.path.resolve().parent.name}/{run.path.resolve().name})"
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
        if seen[run.name] > 1:
            run.name = f"{run.name} #{seen[run.name]}"
