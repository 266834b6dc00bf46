"""The logged rows of a run, wherever they were logged, for ``rlhfkit doctor``: rlhfkit's run directory
(metrics.jsonl), or a run of TRL's trainers (or any transformers Trainer) logged to TensorBoard, W&B (offline files)
or Trackio, read with each tracker's own reader.

transformers' callbacks send training metrics to the trackers as ``train/<name>`` and evaluation metrics as
``eval/<name>``, with ``train/global_step`` as the step; rlhfkit sends the same keys. The rules read the bare names,
which TRL's GRPO and rlhfkit share (``reward``, ``kl``, ``entropy``, ``completions/clipped_ratio``, ...), so a row is
the tracker's keys with ``train/`` taken off.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from rlhfkit.tracking.rundir import METRICS_FILE, read_jsonl

TRAIN_PREFIX, STEP_KEYS = "train/", ("train/global_step", "global_step", "_step", "step")


class Source(NamedTuple):
    """A run's rows (each with its "step"), in order, and where they came from."""

    rows: list[dict[str, Any]]
    description: str  # e.g. "metrics.jsonl", "TensorBoard events in runs/Nov25_23-06-20_host"
    skipped_lines: list[int] = []  # metrics.jsonl lines that were not a JSON object


def rule_name(key: str) -> str | None:
    """The name the rules read for a tracker key: ``train/reward`` -> ``reward``; ``eval/...`` unchanged; None for
    the step itself and the tracker's own bookkeeping (keys starting with "_")."""
    if key in STEP_KEYS or key.startswith("_"):
        return None
    return key[len(TRAIN_PREFIX) :] if key.startswith(TRAIN_PREFIX) else key


# How W&B's JSON writes the values that JSON has no number for.
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def rows_by_step(items: Iterable[tuple[int, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Rows merged per step, ordered by step, with tracker keys turned into rule names; numbers only."""
    merged: dict[int, dict[str, Any]] = {}
    for step, values in items:
        row = merged.setdefault(int(step), {})
        for key, value in values.items():
            name = rule_name(key)
            if name is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
                row[name] = value
    return [{"step": step, **row} for step, row in sorted(merged.items()) if row]


def read_run_directory(path: Path) -> Source:
    rows, skipped = read_jsonl(path / METRICS_FILE)
    return Source(rows, METRICS_FILE, skipped)


def _event_directories(path: Path) -> list[Path]:
    return sorted({event.parent for event in path.rglob("events.out.tfevents*")}, key=lambda d: d.stat().st_mtime)


def read_tensorboard(directory: Path) -> Source:
    """Scalars of the TensorBoard event files in `directory` (tensorboard's EventAccumulator)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    items = [(event.step, {tag: event.value}) for tag in events.Tags()["scalars"] for event in events.Scalars(tag)]
    return Source(rows_by_step(items), f"TensorBoard events in {directory}")


def read_wandb(path: Path) -> Source:
    """The history of a W&B run's transaction log (an offline-run-* directory or its .wandb file), read with W&B's
    own reader (``wandb leet inspect --json``)."""
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "WANDB_SILENT": "true"},
    )
    if result.returncode != 0:
        raise ValueError(f"W&B could not read {path}: {result.stderr.strip() or result.stdout.strip()}")
    items = []
    for line in result.stdout.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if record.get("type") == "history":
            values = {key: NONFINITE.get(value, value) for key, value in record["history"]["item"].items()}
            step = next((values[key] for key in STEP_KEYS if key in values), None)
            if step is not None:
                items.append((step, values))
    return Source(rows_by_step(items), f"W&B run {path}")


def read_trackio(project: str, run: str | None) -> Source:
    """A Trackio run's logs from its local store ($TRACKIO_DIR); `run` may be omitted when the project has one."""
    from trackio.sqlite_storage import SQLiteStorage

    runs = SQLiteStorage.get_runs(project)
    if run is None:
        if len(runs) != 1:
            shown = ", ".join(map(str, runs)) or "none"
            raise ValueError(f"Trackio project {project!r} has {len(runs)} runs ({shown}): pass --run NAME.")
        run = runs[0]
    logs = SQLiteStorage.get_logs(project, run)
    if not logs:
        raise ValueError(
            f"Trackio project {project!r} has no logs for run {run!r} (runs: {', '.join(map(str, runs))})."
        )
    return Source(rows_by_step((log["step"], log) for log in logs), f"Trackio run {run!r} of project {project!r}")


def read_source(path: str | os.PathLike) -> Source:
    """The rows of whatever run `path` holds: an rlhfkit run directory (metrics.jsonl); a W&B offline run
    (offline-run-*, a wandb/ directory or a .wandb file); or TensorBoard event files (a TRL output_dir, its runs/,
    or one run's directory: the newest run when there are several). FileNotFoundError names what was looked for."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r} does not exist")
    if path.is_file() and path.suffix == ".wandb":
        return read_wandb(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{str(path)!r} is neither a run directory nor a W&B .wandb file")
    if (path / METRICS_FILE).is_file():
        return read_run_directory(path)
    wandb_runs = sorted(path.glob("*.wandb")) or sorted(path.glob("offline-run-*/*.wandb"))
    wandb_runs = wandb_runs or sorted(path.glob("wandb/offline-run-*/*.wandb"))
    if wandb_runs:
        return read_wandb(max(wandb_runs, key=lambda p: p.stat().st_mtime))
    event_directories = _event_directories(path)
    if event_directories:
        return read_tensorboard(event_directories[-1])
    raise FileNotFoundError(
        f"no {METRICS_FILE} in {str(path)!r} (looked for {str(path / METRICS_FILE)!r}), nor a W&B run (*.wandb) or "
        "TensorBoard event files (events.out.tfevents*) below it"
    )
