"""Writing checkpoints and the final model atomically, and keeping the newest few.

Everything is written into ``checkpoint-N.tmp`` and renamed once complete, so a crash during a save leaves the
previous checkpoints intact and never a directory that looks complete but is not (trainer_state.json is the
completeness mark). The final model goes into the run directory the same way, through ``<output_dir>.tmp``. A failed
write raises StorageError with the ``.tmp`` directory removed (storage.py).

A checkpoint is deleted (save_total_limit, or a checkpoint of the same step replaced) the other way round: renamed to
``.checkpoint-N.deleting`` (layout.deleting_path), a name nothing lists or resumes, then deleted. A crash mid-deletion
leaves only that directory; the next save removes it, on the main process, before it checks the free space.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlhfkit.checkpoint.integrity import MANIFEST_VERSION, follow_umask, write_manifest
from rlhfkit.checkpoint.layout import (
    ENGINE_DIR,
    EXTRA_FILE,
    FORMAT_VERSION,
    OPTIMIZER_FILE,
    STATE_FILE,
    checkpoints,
    deleting_path,
    interrupted_deletions,
    rng_file,
)
from rlhfkit.checkpoint.rng import rng_state
from rlhfkit.checkpoint.storage import check_space, checkpoint_estimate, model_estimate, together


def save_checkpoint(
    accelerator,
    path: str | os.PathLike,
    write_models: Callable[[str], None],
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    extra: dict[str, Any] | None = None,
    save_total_limit: int | None = None,
    save_engine: Callable[[str], None] | None = None,
) -> None:
    """Write a checkpoint to `path` atomically (a collective: every process must call it), then keep only the
    newest `save_total_limit` checkpoints beside it (all when None or 0).

    write_models(dir): saves the models (main process). state: JSON-able counters. extra: tensors / plain data.
    save_engine(dir): under DeepSpeed or FSDP, writes the engine's sharded state into dir (every process), in place
    of optimizer.pt (optimizer None).

    A failed write on any process (no space left, an I/O error) raises StorageError on every process, with the
    ``.tmp`` directory removed and the previous checkpoints untouched; so does too little free space for a
    checkpoint the size of the previous one, before anything is written.
    """
    path = str(path).rstrip("/")
    tmp = path + ".tmp"
    output_dir = os.path.dirname(path) or "."
    main = accelerator.is_main_process
    target = f"the checkpoint {path}"

    def prepare() -> None:
        remove_interrupted_deletions(output_dir)  # their space is free space for this checkpoint
        check_space(output_dir, checkpoint_estimate(output_dir, optimizer), target, path)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)

    def write() -> None:
        torch.save(rng_state(), os.path.join(tmp, rng_file(accelerator.process_index)))
        if save_engine is not None:
            save_engine(os.path.join(tmp, ENGINE_DIR))
        if main:
            write_models(tmp)
            if optimizer is not None:
                torch.save(optimizer.state_dict(), os.path.join(tmp, OPTIMIZER_FILE))
            torch.save(extra or {}, os.path.join(tmp, EXTRA_FILE))
            record = {"format_version": FORMAT_VERSION, "num_processes": accelerator.num_processes, **state}
            record["manifest_version"] = MANIFEST_VERSION  # a manifest follows: without it, the checkpoint fails
            Path(tmp, STATE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    def finish() -> None:  # every process's files are written: the manifest, then the rename
        follow_umask(tmp)
        write_manifest(tmp)
        replaced = deleting_path(path) if os.path.isdir(path) else None  # the same step saved again (a resumed run)
        if replaced is not None:
            os.rename(path, replaced)
        os.replace(tmp, path)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)

    accelerator.wait_for_everyone()
    together(accelerator, prepare if main else None, target, tmp, path)
    together(accelerator, write, target, tmp, path)
    together(accelerator, finish if main else None, target, tmp, path)
    if main:
        prune_checkpoints(output_dir, save_total_limit)
    accelerator.wait_for_everyone()


def prune_checkpoints(output_dir: str | os.PathLike, limit: int | None) -> None:
    """Delete all but the newest `limit` complete checkpoints of `output_dir` (none when limit is None or 0), and
    what interrupted deletions left (main process only).

    Each checkpoint is first renamed to ``.checkpoint-N.deleting`` (one atomic rename in the same directory), then
    deleted: a process killed mid-deletion never leaves a half-deleted ``checkpoint-N`` that checkpoints() lists or
    'latest' falls back to. A checkpoint that cannot be renamed is kept whole, and one line on stderr says so.
    """
    remove_interrupted_deletions(output_dir)
    if not limit:
        return
    found = checkpoints(output_dir)
    for _, path in found[: max(0, len(found) - limit)]:
        aside = deleting_path(path)
        try:
            os.rename(path, aside)
        except OSError as e:
            print(
                f"[rlhfkit] save_total_limit: could not remove {path}, kept whole ({e}).", file=sys.stderr, flush=True
            )
            continue
        shutil.rmtree(aside, ignore_errors=True)


def remove_interrupted_deletions(output_dir: str | os.PathLike) -> None:
    """Delete the ``.checkpoint-N.deleting`` directories a killed process left in `output_dir` (main process only:
    the run holding output_dir's lock is the only one deleting there, so none of them is still being deleted)."""
    for path in interrupted_deletions(output_dir):
        shutil.rmtree(path, ignore_errors=True)


def save_into(accelerator, path: str, write: Callable[[str], None]) -> None:
    """Write files into the directory `path` (the run directory, which already holds logs): `write(tmp_dir)` on the
    main process, then each written file or folder is moved into `path`, replacing one of the same name. A crash
    mid-write leaves only `path`.tmp behind, never a half-written model in `path`. A failed write (no space left,
    an I/O error) raises StorageError, as save_checkpoint does, with `path`.tmp removed."""
    tmp = path.rstrip("/") + ".tmp"
    target = f"the final model into {path}"

    def save() -> None:
        check_space(os.path.dirname(os.path.abspath(path)), model_estimate(path), target, path)
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp)
        follow_umask(tmp)
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(tmp):
            target_path = os.path.join(path, name)
            if os.path.isdir(target_path):
                shutil.rmtree(target_path)
            os.replace(os.path.join(tmp, name), target_path)
        os.rmdir(tmp)

    accelerator.wait_for_everyone()
    together(accelerator, save if accelerator.is_main_process else None, target, tmp, path)
    accelerator.wait_for_everyone()
