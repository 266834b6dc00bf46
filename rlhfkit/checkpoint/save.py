"""Writing checkpoints and the final model atomically, and keeping the newest few.

Everything is written into ``checkpoint-N.tmp`` and renamed once complete, so a crash during a save leaves the
previous checkpoints intact and never a directory that looks complete but is not (trainer_state.json is the
completeness mark). The final model goes into the run directory the same way, through ``<output_dir>.tmp``. A failed
write raises StorageError with the ``.tmp`` directory removed (storage.py).
"""

from __future__ import annotations

import json
import os
import shutil
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
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)

    accelerator.wait_for_everyone()
    together(accelerator, prepare if main else None, target, tmp, path)
    together(accelerator, write, target, tmp, path)
    together(accelerator, finish if main else None, target, tmp, path)
    if main:
        prune_checkpoints(output_dir, save_total_limit)
    accelerator.wait_for_everyone()


def prune_checkpoints(output_dir: str | os.PathLike, limit: int | None) -> None:
    """Delete all but the newest `limit` complete checkpoints of `output_dir` (none when limit is None or 0)."""
    if not limit:
        return
    found = checkpoints(output_dir)
    for _, path in found[: max(0, len(found) - limit)]:
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
