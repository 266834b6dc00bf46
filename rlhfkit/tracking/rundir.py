"""The run directory: the run's own record, readable without any tracker. This module is its format.

output_dir/
  run_config.json the resolved config
  metrics.jsonl   one line per RunLogger.log() call: {"step": int, metric: value, ...}
  samples.jsonl   one line per completion-table row: {"step": int, "key": str, column: value, ...}
  health.jsonl    one line per health finding (written by rlhfkit.health)
  merged/         with --use_peft --merge_adapter: the policy with its adapter merged, a plain transformers model

Lines are appended and the file closed at once, so a crash loses at most the line being written.
Non-finite floats are written as NaN / Infinity, as Python's json module does (and reads back).
Readers (resume, doctor, report) go through :func:`read_jsonl`, which skips a line torn by a crash.

Stdlib only: checking an output_dir while parsing the config must not import the training stack.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CONFIG_FILE = "run_config.json"  # not config.json: the final model saved in the same directory writes that
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
HEALTH_FILE = "health.jsonl"
BEFORE_AFTER_FILE = "before_after.json"  # rlhfkit quickstart: the trained policy against its starting model
MERGED_DIR = "merged"


def read_jsonl(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[int]]:
    """The JSON objects of a JSONL file in order, and the 1-based numbers of the lines that are not one.

    Blank lines are ignored. A run that crashed leaves a half-written last line and a running one can be read
    mid-write, so an unreadable line is reported, never fatal.
    """
    rows, bad = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if isinstance(row, dict):
                rows.append(row)
            else:
                bad.append(number)
    return rows, bad


def read_config(output_dir: str | os.PathLike) -> dict[str, Any]:
    """The run's resolved config (run_config.json); {} when it is missing, unreadable or not a JSON object."""
    try:
        config = json.loads((Path(output_dir) / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def holds_run(output_dir: str | os.PathLike) -> bool:
    """Whether output_dir holds a run: one that logged metrics, or a run_config.json without metrics.jsonl.

    A run_config.json beside an empty metrics.jsonl is a run that never logged a step (a trainer built, never
    trained) and may be reused.
    """
    config, metrics = Path(output_dir) / CONFIG_FILE, Path(output_dir) / METRICS_FILE
    if metrics.is_file():
        return metrics.stat().st_size > 0
    return config.is_file() and config.stat().st_size > 0


def to_jsonable(value: Any) -> Any:
    """Plain Python version of `value`: tensors and NumPy scalars/arrays become numbers and lists."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    tolist = getattr(value, "tolist", None)  # torch.Tensor, numpy.ndarray and numpy scalars
    if callable(tolist):
        return to_jsonable(tolist())
    return str(value)


class RunDirectory:
    """Writer for the files of one run directory (use it on the main process only)."""

    def __init__(self, output_dir: str | os.PathLike):
        self.path = Path(output_dir)

    def prepare(self, config: Mapping[str, Any], resume: bool = False, resume_step: int | None = None) -> None:
        """Create the directory and write run_config.json; a fresh run also empties the JSONL files.

        resume_step: a run resumed from the checkpoint of that step keeps the lines up to it and drops the later
        ones (logged after the checkpoint, before the run stopped), so the record holds each step exactly once.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        text = json.dumps(to_jsonable(config), indent=2)
        (self.path / CONFIG_FILE).write_text(text + "\n", encoding="utf-8")
        for name in (METRICS_FILE, SAMPLES_FILE, HEALTH_FILE):
            if not resume:
                # A reused output_dir must not mix an old run's lines into the new run's record.
                (self.path / name).write_text("", encoding="utf-8")
            elif resume_step is not None and (self.path / name).is_file():
                self._keep_until(name, resume_step)

    def _keep_until(self, name: str, step: int) -> None:
        rows, _ = read_jsonl(self.path / name)  # drops a line torn by the crash
        kept = [json.dumps(row) + "\n" for row in rows if row.get("step", 0) <= step]
        tmp = self.path / (name + ".tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, self.path / name)

    def _append(self, name: str, records: Sequence[Mapping[str, Any]]) -> None:
        with open(self.path / name, "a", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(to_jsonable(record)) + "\n")

    def append_metrics(self, step: int, values: Mapping[str, Any]) -> None:
        self._append(METRICS_FILE, [{"step": step, **values}])

    def append_samples(self, step: int, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self._append(SAMPLES_FILE, [{"step": step, "key": key, **dict(zip(columns, row))} for row in rows])

    def append_findings(self, findings: Sequence[Mapping[str, Any]]) -> None:
        """Health findings as records ({"step", "rule", ...}: rlhfkit.health.Finding.to_dict())."""
        self._append(HEALTH_FILE, findings)
