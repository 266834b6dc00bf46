"""The run directory: the run's own record, readable without any tracker. This module is its format.

output_dir/
  run_config.json the resolved config of the latest start or resume
  run_config_history.jsonl  one line per part of the run (its start, then each resume): {"part", "time",
                  "start_step", "resumed_from", "changed" (field -> {"from", "to"}: the settings that differ from the
                  checkpoint's), "allowed_by_flag" (those only --allow_config_change let through), "config"}
  .rlhfkit.lock   while a run writes the directory: who holds its lock (RunLock), {"pid", "host", "command",
                  "started"}; removed when the run ends (a run that died leaves it, and it no longer means anything)
  .rlhfkit.mutex  the lock itself (RunLock), empty; it may stay after the run
  metrics.jsonl   one line per RunLogger.log() call: {"step": int, metric: value, ...}
  samples.jsonl   one line per completion-table row: {"step": int, "key": str, column: value, ...}
  health.jsonl    one line per health finding (written by rlhfkit.health)
  merged/         with --use_peft --merge_adapter: the policy with its adapter merged, a plain transformers model

Lines are appended and the file closed at once, so a crash loses at most the line being written.
Non-finite floats are written as NaN / Infinity, as Python's json module does (and reads back).
Readers (resume, doctor, report) go through :func:`read_jsonl`, which skips a line torn by a crash.

Stdlib and filelock only: checking an output_dir while parsing the config must not import the training stack.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

CONFIG_FILE = "run_config.json"  # not config.json: the final model saved in the same directory writes that
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
HEALTH_FILE = "health.jsonl"
BEFORE_AFTER_FILE = "before_after.json"  # rlhfkit quickstart: the trained policy against its starting model
MERGED_DIR = "merged"
HISTORY_FILE = "run_config_history.jsonl"
LOCK_FILE = ".rlhfkit.lock"  # who holds the run directory's lock
MUTEX_FILE = ".rlhfkit.mutex"  # the lock itself


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

    def prepare(
        self,
        config: Mapping[str, Any],
        resume: bool = False,
        resume_step: int | None = None,
        after_checkpoint: Sequence[str] = (),
    ) -> None:
        """Create the directory and write run_config.json; a fresh run also empties the JSONL files.

        resume_step: a run resumed from the checkpoint of that step keeps the lines up to it and drops the later
        ones (logged after the checkpoint, before the run stopped), so the record holds each step exactly once.
        after_checkpoint: keys of lines that are always logged after their step's checkpoint (the summary row that
        ends a train() call, after its final checkpoint): at resume_step such lines are dropped too, as the resumed
        call logs its own.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        text = json.dumps(to_jsonable(config), indent=2)
        (self.path / CONFIG_FILE).write_text(text + "\n", encoding="utf-8")
        for name in (METRICS_FILE, SAMPLES_FILE, HEALTH_FILE, HISTORY_FILE):
            if name == HISTORY_FILE and resume:
                continue  # every part of the run stays recorded, those after the checkpoint too
            if not resume:
                # A reused output_dir must not mix an old run's lines into the new run's record.
                (self.path / name).write_text("", encoding="utf-8")
            elif resume_step is not None and (self.path / name).is_file():
                self._keep_until(name, resume_step, after_checkpoint)

    def _keep_until(self, name: str, step: int, after_checkpoint: Sequence[str]) -> None:
        rows, _ = read_jsonl(self.path / name)  # drops a line torn by the crash
        kept = [
            json.dumps(row) + "\n"
            for row in rows
            if row.get("step", 0) < step
            or (row.get("step", 0) == step and not any(k in row for k in after_checkpoint))
        ]
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

    def record_part(
        self,
        config: Mapping[str, Any],
        start_step: int,
        resumed_from: str | None = None,
        changed: Mapping[str, tuple[Any, Any]] | None = None,
        allowed_by_flag: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Append this part of the run (a start, or a resume from the checkpoint of `start_step`) to the history:
        its config, and the fields `changed` from the checkpoint's (name -> (checkpoint's value, new value)).
        Returns the record written."""
        parts, _ = read_jsonl(self.path / HISTORY_FILE) if (self.path / HISTORY_FILE).is_file() else ([], [])
        record = {
            "part": len(parts) + 1,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "start_step": start_step,
            "resumed_from": resumed_from,
            "changed": {name: {"from": old, "to": new} for name, (old, new) in (changed or {}).items()},
            "allowed_by_flag": sorted(allowed_by_flag),
            "config": dict(config),
        }
        self._append(HISTORY_FILE, [record])
        return record

    def append_findings(self, findings: Sequence[Mapping[str, Any]]) -> None:
        """Health findings as records ({"step", "rule", ...}: rlhfkit.health.Finding.to_dict())."""
        self._append(HEALTH_FILE, findings)


def read_history(output_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The parts of a run recorded in run_config_history.jsonl, oldest first ([] when there is none)."""
    path = Path(output_dir) / HISTORY_FILE
    return read_jsonl(path)[0] if path.is_file() else []


# ---------------------------------------------------------------------------------------------------------------------
# One writer per run directory
# ---------------------------------------------------------------------------------------------------------------------


class RunLock:
    """An exclusive lock on a run directory: its holder is the only process writing it.

    The operating system's lock on output_dir/.rlhfkit.mutex, through filelock (flock on Unix, LockFileEx on
    Windows), and beside it output_dir/.rlhfkit.lock, the holder's pid, host, command line and start time for the
    message another run gets. The operating system drops the lock when its process ends, however it ends (SIGKILL, out
    of memory, a lost node), so a dead run never blocks the next one: that run takes the lock and rewrites the holder
    file the dead run left. The holder is a file of its own because the lock file is filelock's: depending on its
    version and platform filelock keeps or deletes it on release, and on Windows its locked first byte cannot be read
    by another process. Both files are removed when the run releases the lock.

    Within one process a new lock on a directory supersedes the process's earlier one (a notebook's trainer rebuilt
    after an error, whose run never ended); a RunLock no longer referenced is released as it is garbage collected.
    The lock is advisory and, on Unix, local to a machine's kernel: runs on other machines sharing the directory over
    NFS are seen only where the file system forwards flocks (NFSv4 does; some do not).
    """

    _held: weakref.WeakValueDictionary[str, RunLock] = weakref.WeakValueDictionary()  # this process's, by path

    def __init__(self, directory: Path, lock: FileLock):
        self.directory, self._lock, self._pid = directory, lock, os.getpid()

    @classmethod
    def acquire(cls, output_dir: str | os.PathLike, command: str | None = None) -> tuple[RunLock | None, dict]:
        """Lock `output_dir` (created if missing) for this process: (the lock, {}), or (None, its holder's
        {"pid", "host", "command", "started"}) when another process holds it (locked_message says so)."""
        directory = Path(output_dir)
        directory.mkdir(parents=True, exist_ok=True)
        key = _key(directory)
        previous = cls._held.pop(key, None)
        if previous is not None:
            previous.release()
        lock = _mutex(directory)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return None, _holder(directory)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": command if command is not None else shlex.join([sys.executable, *sys.argv]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        try:
            (directory / LOCK_FILE).write_text(json.dumps(info) + "\n", encoding="utf-8")
        except BaseException:
            lock.release()
            raise
        run_lock = cls(directory, lock)
        cls._held[key] = run_lock
        return run_lock, {}

    @property
    def held(self) -> bool:
        return self._lock is not None

    def release(self) -> None:
        """Remove the holder file and release the lock (again, or in a forked child: nothing)."""
        lock, self._lock = self._lock, None
        if lock is None or os.getpid() != self._pid:
            return
        key = _key(self.directory)
        if RunLock._held.get(key) is self:
            del RunLock._held[key]
        # Still holding the lock, remove both files, so a run leaves its directory as it found it: the holder file is
        # this run's; a process that opened the mutex before it went finds the inode gone once it locks it, and
        # filelock (>= 4) then retries on the file at the path.
        for name in (LOCK_FILE, MUTEX_FILE):
            try:
                (self.directory / name).unlink()
            except OSError:
                pass
        lock.release()

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown: the process's end releases the lock anyway
            pass


def locked_by(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The holder of output_dir's lock ({"pid", "host", "command", "started"}, possibly {} when unreadable) when
    another process holds it, else None. Creates nothing: a directory without the lock file is not locked."""
    directory = Path(output_dir)
    if not (directory / MUTEX_FILE).is_file() or _key(directory) in RunLock._held:
        return None
    probe = _mutex(directory)
    try:
        probe.acquire(timeout=0)
    except Timeout:
        return _holder(directory)
    probe.release()
    return None


def _mutex(directory: Path) -> FileLock:
    # Not thread-local: a run may end (and release its lock) on another thread than the one that started it.
    return FileLock(directory / MUTEX_FILE, thread_local=False)


def _key(directory: Path) -> str:
    return os.path.realpath(directory / LOCK_FILE)


def _holder(directory: Path) -> dict[str, Any]:
    try:
        info = json.loads((directory / LOCK_FILE).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def locked_message(output_dir: str | os.PathLike, holder: Mapping[str, Any]) -> str:
    """What a run refused by the lock of output_dir, held by `holder`, is told (rlhfkit.errors.RunLockedError)."""
    directory = Path(output_dir)
    pid = holder.get("pid", "unknown")
    host = holder.get("host")
    where = "" if host in (None, socket.gethostname()) else f" on host {host} (not this machine)"
    started = f", started {holder['started']}" if holder.get("started") else ""
    command = f", command: {holder['command']}" if holder.get("command") else ""
    return (
        f"--output_dir {directory} is being written by another run: process {pid}{where}{started}{command}. Two runs "
        "in one directory would mix their metrics and race on its checkpoints. Wait for that run to end, or stop it "
        f"(kill -INT {pid}: it saves a checkpoint, then continue it with --resume_from_checkpoint latest), or choose "
        f"another --output_dir. The lock ({directory / MUTEX_FILE}) is released when that process exits, however it "
        "ends."
    )
