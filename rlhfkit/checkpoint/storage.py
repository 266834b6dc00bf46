"""Storage errors of a checkpoint or final-model write: free space checked before writing, a failed write turned
into one StorageError on every process.

A failed write (no space left, no permission, an I/O error; torch's and safetensors' own errors of a failed write
included) raises StorageError naming the path and the cause, after removing the half-written ``.tmp`` directory, so
the previous checkpoint stays intact and the run resumes from it. Before writing, the free space is compared with the
size of the previous checkpoint (or the optimizer's parameters times three) and a save that cannot fit fails at once
with the same message.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from rlhfkit.checkpoint.layout import (
    ENGINE_DIR,
    EXTRA_FILE,
    MANIFEST_FILE,
    OPTIMIZER_FILE,
    RNG_FILE_PREFIX,
    STATE_FILE,
    checkpoints,
    files_under,
)
from rlhfkit.errors import StorageError

_WRITE_FAILURE_MARKS = (
    "inline_container",
    "PytorchStreamWriter",
    "unexpected pos",
    "file write failed",
    "iostream error",  # torch.save's end of file on a full disk: "basic_ios::clear: iostream error"
    "os error",
)
_NO_SPACE_MARKS = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")
_FULL_BELOW = 64 * 2**20  # after a write failed, this little free space means the disk filled up


def together(accelerator, step: Callable[[], None] | None, target: str, tmp: str, path: str) -> None:
    """Run `step` (on the processes given one), then let every process learn whether a write failed anywhere: if
    one did, the main process removes `tmp` and every process raises the same StorageError. Errors that are not a
    failed write (a bug) propagate as they are."""
    failure = None
    if step is not None:
        try:
            step()
        except StorageError as e:  # too little space, found before writing
            failure = str(e)
        except Exception as e:
            if not _is_write_failure(e, os.path.dirname(os.path.abspath(path))):
                raise
            failure = _storage_message(target, path, e)
    failures = [failure]
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        failures = gather_object([failure])
    failures = [f for f in failures if f]
    if failures:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise StorageError(failures[0])


def _is_write_failure(e: BaseException, directory: str) -> bool:
    """Whether `e` is a write that failed: an OSError, safetensors' SafetensorError, or torch's RuntimeError from
    its zip writer (on a full disk ``[enforce fail at inline_container.cc:672] . unexpected pos ...`` or
    ``basic_ios::clear: iostream error``), or any RuntimeError once the disk is full."""
    if isinstance(e, OSError) or type(e).__name__ == "SafetensorError":
        return True
    if not isinstance(e, RuntimeError):
        return False
    if any(mark in str(e) for mark in _WRITE_FAILURE_MARKS):
        return True
    free = _free_bytes(directory)
    return free is not None and free < _FULL_BELOW


def _free_bytes(directory: str) -> int | None:
    """Bytes an unprivileged process may still write on the filesystem of `directory`; None when unknown."""
    try:
        stat = os.statvfs(_existing(directory))
    except (OSError, AttributeError):
        return None
    if stat.f_blocks == 0:  # some network and FUSE filesystems report no sizes at all
        return None
    return stat.f_bavail * stat.f_frsize


def _existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _filesystem(directory: str) -> str:
    """ "/dev/sda1 mounted at /data, 1.2 GB free": where `directory` is stored, as far as it is cheap to tell."""
    mount = os.path.realpath(_existing(directory))
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    device = None
    try:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 1 and fields[1] == mount:
                device = fields[0]  # the last mount on a point is the one in use
    except OSError:
        pass
    free = _free_bytes(directory)
    where = f"{device} mounted at {mount}" if device else f"the filesystem mounted at {mount}"
    return where + (f", {_size(free)} free" if free is not None else "")


def _size(n: int) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def checkpoint_estimate(output_dir: str, optimizer: torch.optim.Optimizer | None) -> int:
    """The bytes a new checkpoint will take: the previous checkpoint's, else three times the optimizer's parameters
    (weights and two moments; a lower bound when other models are saved too), else 0 (not checked)."""
    found = checkpoints(output_dir)
    if found:
        return _tree_size(found[-1][1])
    if optimizer is None:
        return 0
    return 3 * sum(p.numel() * p.element_size() for group in optimizer.param_groups for p in group["params"])


def _disk_size(file: Path) -> int:
    stat = file.stat()
    return max(stat.st_size, getattr(stat, "st_blocks", 0) * 512)


_STATE_ONLY = (OPTIMIZER_FILE, EXTRA_FILE, STATE_FILE, MANIFEST_FILE, ENGINE_DIR)


def model_estimate(path: str) -> int:
    """The bytes the final models will take: those of the newest checkpoint in `path`, without its training state."""
    found = checkpoints(path)
    if not found:
        return 0
    directory = found[-1][1]
    return sum(
        _tree_size(child) if child.is_dir() else _disk_size(child)
        for child in directory.iterdir()
        if child.name not in _STATE_ONLY and not child.name.startswith(RNG_FILE_PREFIX)
    )


def _tree_size(directory: Path) -> int:
    """Bytes the files under `directory` take on disk (whole blocks, where the filesystem says)."""
    try:
        return sum(_disk_size(file) for file in files_under(directory))
    except OSError:
        return 0


def check_space(directory: str, needed: int, target: str, path: str) -> None:
    free = _free_bytes(directory)
    if needed and free is not None and free < needed:
        raise StorageError(_storage_message(target, path, None, needed=needed))


def _storage_message(target: str, path: str, error: BaseException | None, needed: int | None = None) -> str:
    """Why `target` could not be written, and how to go on. error None: too little space, found before writing."""
    directory = os.path.dirname(os.path.abspath(path))
    if error is None:
        no_space = True
    else:
        no_space = getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or any(
            mark in str(error) for mark in _NO_SPACE_MARKS
        )
        if not no_space and not isinstance(error, OSError):  # torch's zip writer does not say why it failed
            free = _free_bytes(directory)
            no_space = free is not None and free < _FULL_BELOW
    file = getattr(error, "filename", None) or path
    if no_space:
        need = f"; it needs about {_size(needed)}" if needed else ""
        raised = f"; the write raised {type(error).__name__}: {error}" if error is not None else ""
        cause = f"no space left on device ({file} is on {_filesystem(directory)}{need}{raised})"
    else:
        cause = f"{type(error).__name__}: {error}"
        if getattr(error, "filename", None):
            cause = f"{file}: {cause}"
    if error is None:
        head = f"Not writing {target}: {cause}."
    else:
        head = f"Could not write {target}: {cause}."
    output_dir = directory if target.startswith("the checkpoint") else os.path.abspath(path)
    previous = [p for _, p in checkpoints(output_dir) if os.path.abspath(p) != os.path.abspath(path)]
    fix = "free some space" if no_space else "fix the cause"
    if previous:
        kept = f"The previous checkpoint {previous[-1]} is intact; {fix}, then continue"
        if target.startswith("the final model"):
            kept = f"The final checkpoint {previous[-1]} holds the trained state; {fix}, then write the model"
        return f"{head} {kept} with the same command plus --output_dir {output_dir} --resume_from_checkpoint latest."
    return f"{head} No checkpoint of this run is complete yet; {fix}, then start the run again."
