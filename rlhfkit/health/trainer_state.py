"""A transformers run's ``trainer_state.json`` (what every Trainer, TRL's included, saves in each ``checkpoint-N/``
and with ``trainer.save_state()``) read as the rows the health rules replay; stdlib only.

Accepted: the file itself; a checkpoint directory holding it; an output_dir of ``checkpoint-N/`` directories (the
newest by N that has one); or the ``log_history`` list saved alone as JSON.

Each log_history entry is one ``Trainer.log`` call, with its "step" (the global step). Training rows carry the bare
names the rules read (``reward``, ``kl``, ``entropy``, ``completions/clipped_ratio``, ...); evaluation rows carry
``eval_<name>``, which transformers sends to the trackers as ``eval/<name>`` and so do we here (``test_`` likewise).
The last entry of a finished run is its summary (``train_runtime``, ``train_loss``, ...): its own keys are left out;
when the run's length is not a multiple of ``logging_steps`` TRL's ``log()`` has merged the last window's metrics into
it, and those are kept as that step's training row. ``null`` values (a column TRL logs but never fills), strings and
booleans are left out; ``epoch`` and ``step`` are bookkeeping. Rows of one step (a training row and an evaluation row) are merged. A run resumed from an earlier
checkpoint may append rows whose step goes back: the later rows replace the earlier ones from that step on.
Python's json writes NaN and Infinity as bare literals, which json.loads reads back as floats: they are kept, for
the ``nonfinite_metric`` rule.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from rlhfkit.health.rows import TRAINER_STATE_READER, Source

STATE_FILE = "trainer_state.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")
# Only the final summary row of Trainer.train() has these (transformers' speed_metrics("train", ...)); SUMMARY_ONLY
# are that row's own keys, whatever else TRL merged into it.
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second")
SUMMARY_ONLY = frozenset({*SUMMARY_KEYS, "total_flos", "train_loss"})
BOOKKEEPING = frozenset({"step", "epoch"})
TRACKER_PREFIXES = {"eval_": "eval/", "test_": "test/"}  # as transformers' rewrite_logs names them for trackers
MAX_RESUME_NOTES = 3  # a log whose step never advances would otherwise note every row


def find_state_file(directory: Path) -> tuple[Path, str | None] | None:
    """The trainer_state.json that `directory` stands for, and a note saying which checkpoint it was taken from: its
    own (a checkpoint, or an output_dir after save_state), else the newest ``checkpoint-N/`` holding one (by N).
    None when there is none."""
    if (directory / STATE_FILE).is_file():
        return directory / STATE_FILE, None
    checkpoints = sorted(
        (int(match.group(1)), path)
        for path in directory.glob("checkpoint-*")
        if (match := CHECKPOINT.fullmatch(path.name)) and path.is_dir()
    )
    with_state = [(number, path) for number, path in checkpoints if (path / STATE_FILE).is_file()]
    if not with_state:
        return None
    number, newest = with_state[-1]
    note = f"newest of {len(checkpoints)} checkpoint(s): {newest.name}"
    without = [path.name for n, path in checkpoints if n > number]
    if without:
        note += f" ({', '.join(without)} newer but without a {STATE_FILE})"
    return newest / STATE_FILE, note


def load_log_history(path: Path) -> tuple[list[Any], bool]:
    """The log_history in `path` (a trainer_state.json, or the list alone), and whether it was the list alone.
    ValueError says what the file holds instead and what to pass."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{str(path)!r} is not a text file: pass a trainer_state.json") from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{str(path)!r} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}; cut short by a crash or "
            f"an interrupted copy?): pass a complete {STATE_FILE}, e.g. an earlier checkpoint's"
        ) from None
    if isinstance(state, list):
        return state, True
    if not isinstance(state, dict):
        raise ValueError(
            f"{str(path)!r} holds a JSON {type(state).__name__}, not a {STATE_FILE} object or a log_history list"
        )
    if "log_history" not in state:
        raise ValueError(
            f"{str(path)!r} is a JSON object without 'log_history' (keys: {', '.join(state) or 'none'}): pass the "
            f"{STATE_FILE} that transformers saves in each checkpoint-*/ (or its log_history list)"
        )
    if not isinstance(state["log_history"], list):
        raise ValueError(f"'log_history' in {str(path)!r} is a {type(state['log_history']).__name__}, not a list")
    return state["log_history"], False


def tracker_name(key: str) -> str:
    """The name a tracker (and the rules) gets for a log_history key: ``eval_reward`` -> ``eval/reward``."""
    for prefix, replacement in TRACKER_PREFIXES.items():
        if key.startswith(prefix):
            return replacement + key[len(prefix) :]
    return key


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def log_history_rows(entries: list[Any], where: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a log_history, in step order, and notes on what was left out or replaced (module docstring).
    ValueError when no entry is a log row (an object with a "step")."""
    merged: dict[int, dict[str, Any]] = {}
    top: int | None = None  # the highest step so far
    dropped: Counter[str] = Counter()  # keys whose null or non-numeric values were left out: how many rows
    notes, resumes, no_step = [], [], 0
    for entry in entries:
        if not isinstance(entry, dict) or not _is_number(entry.get("step")):
            no_step += 1
            continue
        step = int(entry["step"])
        if any(key in entry for key in SUMMARY_KEYS):
            shown = ", ".join(f"{k} {v:g}" for k, v in entry.items() if k in SUMMARY_ONLY and _is_number(v))
            window = {k: v for k, v in entry.items() if k not in SUMMARY_ONLY}
            if not window.keys() - BOOKKEEPING:
                notes.append(f"the final summary row at step {step} is not a training row, left out ({shown})")
                continue
            notes.append(
                f"the final summary row at step {step} holds the last logging window's metrics (TRL merges them into "
                f"it): kept as that step's training row, its own keys left out ({shown})"
            )
            entry = window
        values = {}
        for key, value in entry.items():
            if key in BOOKKEEPING:
                continue
            if _is_number(value):
                values[tracker_name(key)] = value
            else:
                dropped[key] += 1
        if not values:
            continue
        if top is not None and (step < top or (step == top and merged[top].keys() & values.keys())):
            replaced = [s for s in merged if s >= step]
            resumes.append(
                f"log_history goes back from step {top} to step {step} (a run resumed from an earlier checkpoint): "
                f"the later rows replace the {len(replaced)} logged before from step {step} on"
            )
            for s in replaced:
                del merged[s]
            top = None if not merged else max(merged)
        merged.setdefault(step, {}).update(values)
        top = step if top is None else max(top, step)
    if not merged and no_step == len(entries):
        raise ValueError(
            f"{where} is a list of {len(entries)} entries but not a log_history: no entry is an object with a "
            f"'step' (pass a {STATE_FILE} or its log_history list)"
        )
    notes += resumes[:MAX_RESUME_NOTES]
    if len(resumes) > MAX_RESUME_NOTES:
        notes.append(f"and {len(resumes) - MAX_RESUME_NOTES} more such step(s) back")
    if no_step:
        notes.append(f"{no_step} log_history entr{'y' if no_step == 1 else 'ies'} without a numeric 'step' left out")
    if dropped:
        shown = ", ".join(f"{key} ({n} row{'s' if n > 1 else ''})" for key, n in dropped.items())
        notes.append(f"null or non-numeric values left out: {shown}")
    return [{"step": step, **row} for step, row in sorted(merged.items())], notes


def read_state_file(path: Path, description: str, notes: list[str] | None = None) -> Source:
    """The rows of the trainer_state.json (or bare log_history list) at `path`, described as `description`, with
    `notes` before the reader's own. ValueError when it holds no rows."""
    entries, bare = load_log_history(path)
    where = f"{str(path)!r}"
    if not entries:
        raise ValueError(
            f"the log_history of {where} is empty: the run logged nothing before this state was saved (logging_steps "
            "larger than the steps run?): pass a later checkpoint"
        )
    rows, reader_notes = log_history_rows(entries, where)
    if not rows:
        raise ValueError(f"the log_history of {where} holds no numeric metric in any of its {len(entries)} entries")
    kind = ["a log_history list saved alone"] if bare else []
    return Source(rows, description, reader=TRAINER_STATE_READER, notes=[*kind, *(notes or []), *reader_notes])


def read_trainer_state(path: Path) -> Source:
    """The rows of a trainer_state.json, a checkpoint holding one, an output_dir of checkpoints (the newest), or a
    log_history list saved alone. FileNotFoundError when a directory holds none; ValueError for an unreadable file."""
    path = Path(path)
    if path.is_file():
        return read_state_file(path, str(path))
    found = find_state_file(path)
    if found is None:
        raise FileNotFoundError(
            f"no {STATE_FILE} in {str(path)!r} nor in a checkpoint-*/ directory of it: pass a transformers "
            "checkpoint or output_dir"
        )
    state_file, note = found
    description = f"{state_file}" + (f" ({note})" if note else "")
    return read_state_file(state_file, description)
