"""Reading a run for the report: config, metrics, samples and health findings.

An rlhfkit run directory (its format: rlhfkit/tracking/rundir.py) gives all four. Anything else that
``rlhfkit doctor`` reads (rlhfkit/health/sources.py: a TRL run's TensorBoard or W&B logs, its
trainer_state.json, ...) gives only metric rows; its findings are the doctor's, the health rules replayed over
those rows, so one report compares an rlhfkit run with a TRL run on the same charts and findings. Unreadable
lines are skipped and counted, never fatal: a crashed run leaves a half-written last line, and a running one
can be read mid-write. Only input with no metrics to find is an error: without metrics there is nothing to
report.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhfkit.errors import ReportError
from rlhfkit.health.monitor import replay
from rlhfkit.health.rules import SEVERITIES
from rlhfkit.health.sources import Source, read_source
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
    """Everything the report knows about one run.

    metrics: rows of metrics.jsonl (or of the logs the doctor reads) in order, numeric values only (bools and
        strings dropped), each with an integer "step".
    samples: rows of samples.jsonl in file order ([] for runs that are not run directories).
    findings: rows of health.jsonl, or None when the health checks did not run (no file, or an empty one
        with `health: off` in the config), which the report tells apart from "ran and found nothing". For
        runs that are not run directories: the doctor's findings on the metric rows.
    notes: problems met while reading (skipped lines, unreadable config), shown in the report.
    origin: for runs that are not run directories, where the numbers came from (the file, the reader, how the
        findings were made), shown in the report; [] for run directories.
    """

    name: str
    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, float]]
    samples: list[dict[str, Any]]
    findings: list[dict[str, Any]] | None
    notes: list[str] = field(default_factory=list)
    before_after: dict[str, Any] | None = None  # before_after.json: win rates and completions against the start
    origin: list[str] = field(default_factory=list)


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


def load_run(path: str | os.PathLike, revision: str | None = None) -> Run:
    """Read one run: an rlhfkit run directory (a directory with metrics.jsonl) with its config, samples and own
    health.jsonl; anything else `rlhfkit doctor` reads (health/sources.py read_source: TRL's trainer_state.json,
    TensorBoard or W&B logs, a Hub repo id at `revision`, ...) as its metric rows and the doctor's findings.

    ReportError, with read_source's one-line message, when there is no run to read there.
    """
    local = Path(path)
    if revision is not None and local.exists():
        raise ReportError(f"--revision {revision} is for a Hub repo id, and {str(path)!r} is a local path: drop it")
    if local.is_file() and local.name == METRICS_FILE:
        local = local.parent  # the run directory's own metrics.jsonl: the whole directory
    if local.is_dir() and (local / METRICS_FILE).is_file():
        return _load_run_directory(local)
    return _load_source(path, revision)


def _load_run_directory(path: Path) -> Run:
    """An rlhfkit run directory as the trainer wrote it."""
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


def _read_source(path: str | os.PathLike, revision: str | None) -> Source:
    """read_source's rows, its errors (no run there, unreadable logs) turned into a one-line ReportError."""
    try:
        return read_source(path, revision)
    except (OSError, ValueError) as e:
        raise ReportError(" ".join(str(e).split()) or f"cannot read a run from {str(path)!r}") from None


# Files whose name says nothing about the run: the report names the run after the directory holding them.
GENERIC_FILES = {"trainer_state.json"}


def source_name(path: str | os.PathLike, revision: str | None = None) -> str:
    """A readable name for a run that is not a run directory: the file's stem, the directory's name (a checkpoint
    with its output_dir: "out/checkpoint-250"), or the Hub repo id (with "@revision" when one was asked for)."""
    local = Path(path)
    if not local.exists():
        return f"{path}@{revision}" if revision else str(path)
    local = local.resolve()
    if local.is_file() and local.name not in GENERIC_FILES:
        return local.stem
    directory = local.parent if local.is_file() else local
    if directory.name.startswith("checkpoint-"):
        return f"{directory.parent.name}/{directory.name}"
    return directory.name


def _origin(source: Source, replayed: int) -> list[str]:
    """What the report says about where a non-run-directory run's numbers came from."""
    lines = [f"read {source.description}" + (f" (reader: {source.reader})" if source.reader else "")]
    lines += [str(note) for note in source.notes]
    if source.mapped:
        renamed = ", ".join(f"{name} ← {key}" for name, key in source.mapped.items())
        framework = f"{source.framework} " if source.framework else ""
        lines.append(f"{framework}metrics charted under the health rules' names: {renamed}")
    lines.append(
        f"health findings: rlhfkit's health rules replayed over its {replayed} rows, as `rlhfkit doctor` does "
        "(the run was not checked while it trained)"
    )
    return lines


def _load_source(path: str | os.PathLike, revision: str | None) -> Run:
    """A run that is not a run directory: read_source's rows as metrics, the doctor's findings on them; no
    config or samples (the logs the doctor reads do not hold them)."""
    source = _read_source(path, revision)
    kept = [{**row, "step": int(row["step"])} for row in source.rows if _has_step(row)]
    notes = []
    if source.skipped_lines:
        notes.append(f"skipped unreadable line(s) {', '.join(map(str, source.skipped_lines))}")
    if len(kept) < len(source.rows):
        notes.append(f"skipped {len(source.rows) - len(kept)} row(s) without an integer step")
    _, findings = replay(source.rows)
    return Run(
        name=source_name(path, revision),
        path=Path(path),
        config={},
        metrics=[_numeric_row(row) for row in kept],
        samples=[],
        findings=[_clean_finding(f.to_dict()) for f in findings],
        notes=notes,
        origin=_origin(source, len(source.rows)),
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
