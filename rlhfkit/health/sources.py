"""The logged rows of a run, wherever they were logged, for ``rlhfkit doctor``: rlhfkit's run directory
(metrics.jsonl), or a run of TRL's trainers (or any transformers Trainer) logged to TensorBoard, W&B (offline files,
or its history exported as CSV: wandb_csv.py) or Trackio, read with each tracker's own reader; the
``trainer_state.json`` that transformers saves in each checkpoint (trainer_state.py), locally or in a Hub repo
(hub.py); verl's logs (verl.py).

transformers' callbacks send training metrics to the trackers as ``train/<name>`` and evaluation metrics as
``eval/<name>``, with ``train/global_step`` as the step; rlhfkit sends the same keys. The rules read the bare names,
which TRL's GRPO and rlhfkit share (``reward``, ``kl``, ``entropy``, ``completions/clipped_ratio``, ...), so a row is
the tracker's keys with ``train/`` taken off. Other frameworks' names (verl's ``critic/score/mean``, ...) are mapped
to the rules' names (frameworks.py), and the Source says which were.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from rlhfkit.health.frameworks import map_names
from rlhfkit.health.rows import (  # noqa: F401  (Source and the key helpers, re-exported for the readers' users)
    METRICS_READER,
    NONFINITE,
    STEP_KEYS,
    TENSORBOARD_READER,
    TRACKIO_READER,
    TRAIN_PREFIX,
    TRAINER_STATE_READER,
    VERL_JSONL_READER,
    VERL_LOG_READER,
    WANDB_CSV_READER,
    WANDB_READER,
    Source,
    rows_by_step,
    rule_name,
)
from rlhfkit.health.rules import RULES
from rlhfkit.tracking.rundir import METRICS_FILE, read_jsonl


def read_run_directory(path: Path) -> Source:
    rows, skipped = read_jsonl(path / METRICS_FILE)
    return Source(rows, METRICS_FILE, skipped, METRICS_READER)


def _event_directories(path: Path) -> list[Path]:
    return sorted({event.parent for event in path.rglob("events.out.tfevents*")}, key=lambda d: d.stat().st_mtime)


def read_tensorboard(directory: Path) -> Source:
    """Scalars of the TensorBoard event files in `directory` (tensorboard's EventAccumulator)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    items = [(event.step, {tag: event.value}) for tag in events.Tags()["scalars"] for event in events.Scalars(tag)]
    return Source(rows_by_step(items), f"TensorBoard events in {directory}", reader=TENSORBOARD_READER)


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
    return Source(rows_by_step(items), f"W&B run {path}", reader=WANDB_READER)


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
    rows = rows_by_step((log["step"], log) for log in logs)
    return with_rule_names(Source(rows, f"Trackio run {run!r} of project {project!r}", reader=TRACKIO_READER))


# ------------------------------------------------------------------------------------------------ the rules' names


def rule_metrics() -> set[str]:
    """Every metric some health rule reads (RULES' `metrics`)."""
    return {name for rule in RULES for name in rule.metrics}


def _shown(names: Iterable[str], limit: int = 12) -> str:
    names = list(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def require_rl_metrics(source: Source) -> None:
    """ValueError when `source` has rows but none holds a metric that any rule reads: an SFT or DPO run (loss,
    learning_rate, grad_norm; DPO's rewards/chosen, ...), which the rules have nothing to say about."""
    wanted = rule_metrics()
    if not source.rows or any(key in wanted for row in source.rows for key in row):
        return
    found = sorted({key for row in source.rows for key in row} - {"step"})
    raise ValueError(
        f"{source.description} holds no RL metrics (keys found: {_shown(found) or 'none'}), none of what the health "
        "rules read (reward, kl, entropy, completions/clipped_ratio, val/ratio, objective/scores, ...): is it an SFT "
        "or DPO run, or from a framework whose names rlhfkit does not know? Pass the logs of a PPO or GRPO run."
    )


def with_rule_names(source: Source) -> Source:
    """`source` with other frameworks' metric names mapped to the rules' (recorded in `mapped` and `framework`);
    ValueError when its rows hold no metric that any rule reads (require_rl_metrics)."""
    rows, mapped, framework = map_names(source.rows)
    source = source._replace(rows=rows, mapped={**source.mapped, **mapped}, framework=framework or source.framework)
    require_rl_metrics(source)
    return source


# ------------------------------------------------------------------------------------------------ which reader


def read_source(path: str | os.PathLike, revision: str | None = None) -> Source:
    """The rows of whatever run `path` holds, with other frameworks' names mapped to the rules' (with_rule_names).

    A directory: an rlhfkit run directory (metrics.jsonl); a W&B offline run (offline-run-*, a wandb/ directory);
    TensorBoard event files (a TRL output_dir, its runs/, or one run's directory: the newest run when there are
    several); a transformers checkpoint (trainer_state.json) or an output_dir of checkpoint-*/ (the newest).
    A file: a .wandb file; W&B history exported as .csv; verl's console log or JSONL; a trainer_state.json or a
    log_history list saved alone. Not a path but ORG/NAME: that Hub repo's trainer_state.json at `revision`.

    FileNotFoundError names what was looked for; ValueError says what is wrong with what was found.
    """
    local = Path(path)
    if not local.exists():
        return _read_hub(str(path), revision)
    if revision is not None:
        raise ValueError(f"--revision {revision} is for a Hub repo id, and {str(path)!r} is a local path: drop it")
    source = _read_file(local) if local.is_file() else _read_directory(local)
    return source if source.reader == METRICS_READER else with_rule_names(source)


def _read_hub(name: str, revision: str | None) -> Source:
    """A Hub repo's trainer_state.json (hub.py) when `name` looks like ORG/NAME; else FileNotFoundError."""
    from rlhfkit.health.hub import looks_like_repo_id, read_hub

    if not looks_like_repo_id(name):
        raise FileNotFoundError(f"{name!r} does not exist")
    return with_rule_names(read_hub(name, revision))


def _starts_like_json(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(256).lstrip()[:1] in (b"{", b"[")


def _read_verl(path: Path) -> Source | None:
    """The rows of `path` when it is verl's console log or file-logger JSONL (sniffed from its content: verl.py),
    else None."""
    from rlhfkit.health.verl import looks_like_verl_jsonl, looks_like_verl_log, read_verl_jsonl, read_verl_log

    if looks_like_verl_jsonl(path):
        source, reader = read_verl_jsonl(path), VERL_JSONL_READER
    elif looks_like_verl_log(path):
        source, reader = read_verl_log(path), VERL_LOG_READER
    else:
        return None
    return source if source.reader else source._replace(reader=reader)


def _read_file(path: Path) -> Source:
    from rlhfkit.health.trainer_state import read_trainer_state
    from rlhfkit.health.wandb_csv import read_wandb_csv

    if path.suffix == ".wandb":
        return read_wandb(path)
    if path.suffix == ".csv":
        return read_wandb_csv(path)
    if path.name == METRICS_FILE:
        return read_run_directory(path.parent)
    verl = _read_verl(path)
    if verl is not None:
        return verl
    if path.suffix == ".json" or _starts_like_json(path):
        return read_trainer_state(path)
    raise FileNotFoundError(
        f"{str(path)!r} is not a log that rlhfkit doctor reads: pass a run directory, a W&B .wandb file or history "
        ".csv, a trainer_state.json (or its log_history list as .json), or verl's console log or JSONL"
    )


def _read_directory(path: Path) -> Source:
    from rlhfkit.health.trainer_state import find_state_file, read_trainer_state

    if (path / METRICS_FILE).is_file():
        return read_run_directory(path)
    wandb_runs = sorted(path.glob("*.wandb")) or sorted(path.glob("offline-run-*/*.wandb"))
    wandb_runs = wandb_runs or sorted(path.glob("wandb/offline-run-*/*.wandb"))
    if wandb_runs:
        return read_wandb(max(wandb_runs, key=lambda p: p.stat().st_mtime))
    event_directories = _event_directories(path)
    if event_directories:
        return read_tensorboard(event_directories[-1])
    if find_state_file(path) is not None:
        return read_trainer_state(path)
    empty = " (it is empty)" if not any(path.iterdir()) else ""
    raise FileNotFoundError(
        f"no {METRICS_FILE} in {str(path)!r}{empty} (looked for {str(path / METRICS_FILE)!r}), nor a W&B run "
        "(*.wandb) or TensorBoard event files (events.out.tfevents*) below it, nor a trainer_state.json in it or in "
        "a checkpoint-*/ of it: pass a run's output_dir, a checkpoint, or a log file"
    )
