"""Checkpoint rotation (save_total_limit): a checkpoint is renamed to `.checkpoint-N.deleting` before it is deleted,
so a deletion cut short (an error, a SIGKILL) never leaves a half-deleted `checkpoint-N` that a listing shows or a
resume takes; the next save or prune removes what it left."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from rlhfkit.checkpoint import (
    MANIFEST_FILE,
    STATE_FILE,
    checkpoint_table,
    checkpoints,
    prune_checkpoints,
    resolve_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from rlhfkit.checkpoint.layout import DELETING_DIR, interrupted_deletions
from rlhfkit.errors import CheckpointError, StorageError

ROOT = Path(__file__).resolve().parents[2]
REAL_RMTREE = shutil.rmtree


def many_file_checkpoint(accelerator, out, step, files=40, limit=None):
    """A checkpoint written by save_checkpoint whose 'models' are `files` small shards (all in its manifest)."""

    def write_models(tmp):
        os.makedirs(os.path.join(tmp, "shards"))
        for i in range(files):
            Path(tmp, "shards", f"part-{i:04d}.bin").write_bytes(bytes([i % 256]) * 512)

    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    save_checkpoint(accelerator, out / f"checkpoint-{step}", write_models, optimizer, {"progress": {"step": step}},
                    {}, limit)  # fmt: skip


def file_count(path):
    return sum(len(names) for _, _, names in os.walk(path))


def manifest_first_then_half(path, ignore_errors=False, **kwargs):
    """shutil.rmtree cut short: the manifest goes first (the worst order: without it, a checkpoint written before
    manifests would be taken unverified), then half the other files, then the process 'dies'. Other paths (the
    save's .tmp) are removed for real."""
    if not DELETING_DIR.match(Path(path).name):
        return REAL_RMTREE(path, ignore_errors=ignore_errors, **kwargs)
    os.remove(Path(path, MANIFEST_FILE))
    shards = sorted(Path(path, "shards").iterdir())
    for file in shards[: len(shards) // 2]:
        os.remove(file)
    raise RuntimeError("killed mid-deletion")


def truncate(path):
    path.write_bytes(path.read_bytes()[:10])


def assert_only_intact_checkpoints_are_seen(out, kept):
    """The leftover of checkpoint-1's deletion is neither listed, nor shown, nor taken by 'latest' or by path."""
    (leftover,) = interrupted_deletions(out)
    assert leftover.name == ".checkpoint-1.deleting"
    assert (leftover / STATE_FILE).is_file() and not (leftover / MANIFEST_FILE).exists()
    assert [step for step, _ in checkpoints(out)] == kept
    assert [name for name, _, _ in checkpoint_table(out)] == [f"checkpoint-{step}" for step in kept]
    assert resolve_checkpoint("latest", out) == out / f"checkpoint-{kept[-1]}"
    with pytest.raises(CheckpointError, match="a checkpoint rlhfkit was deleting"):
        resolve_checkpoint(str(leftover), out)
    for (
        step
    ) in kept:  # every listed checkpoint damaged: 'latest' has nothing to fall back to, the leftover least of all
        truncate(out / f"checkpoint-{step}" / "optimizer.pt")
    with pytest.raises(StorageError, match="no checkpoint of .* is intact"):
        resolve_checkpoint("latest", out)
    # Even put back under a listed name, the half-deleted checkpoint fails: it was written with a manifest.
    verdict = verify_checkpoint(leftover)
    assert not verdict.ok and verdict.reason() == f"{MANIFEST_FILE}: missing, though {STATE_FILE} says one was written"


def test_an_interrupted_prune_leaves_no_listed_partial_checkpoint(tmp_path, monkeypatch):
    accelerator = Accelerator(cpu=True)
    for step in (1, 2, 3):
        many_file_checkpoint(accelerator, tmp_path, step)
    before = file_count(tmp_path / "checkpoint-1")
    monkeypatch.setattr(shutil, "rmtree", manifest_first_then_half)
    with pytest.raises(RuntimeError, match="killed mid-deletion"):
        prune_checkpoints(tmp_path, 2)
    monkeypatch.undo()
    assert 0 < file_count(tmp_path / ".checkpoint-1.deleting") < before
    assert_only_intact_checkpoints_are_seen(tmp_path, [2, 3])

    prune_checkpoints(tmp_path, 2)  # the next prune removes the leftover first
    assert interrupted_deletions(tmp_path) == [] and [step for step, _ in checkpoints(tmp_path)] == [2, 3]


def test_the_next_save_removes_leftovers_even_without_a_limit(tmp_path):
    accelerator = Accelerator(cpu=True)
    leftover = tmp_path / ".checkpoint-5.deleting" / "shards"
    leftover.mkdir(parents=True)
    (leftover / "part-0000.bin").write_bytes(b"x" * 100)
    (tmp_path / "checkpoint-5.deleting").mkdir()  # not our name (no leading dot): left alone
    many_file_checkpoint(accelerator, tmp_path, 6, files=2)
    assert interrupted_deletions(tmp_path) == [] and (tmp_path / "checkpoint-5.deleting").is_dir()
    assert [step for step, _ in checkpoints(tmp_path)] == [6]


def test_saving_a_step_again_replaces_it_without_a_listed_partial(tmp_path, monkeypatch):
    """A resumed run saves checkpoint-N again: the old one is set aside before the new one takes its name."""
    accelerator = Accelerator(cpu=True)
    many_file_checkpoint(accelerator, tmp_path, 2, files=4)
    monkeypatch.setattr(shutil, "rmtree", manifest_first_then_half)
    with pytest.raises(RuntimeError, match="killed mid-deletion"):
        many_file_checkpoint(accelerator, tmp_path, 2, files=6)
    monkeypatch.undo()
    assert [step for step, _ in checkpoints(tmp_path)] == [2]
    assert verify_checkpoint(tmp_path / "checkpoint-2").ok and file_count(tmp_path / "checkpoint-2/shards") == 6
    assert [p.name for p in interrupted_deletions(tmp_path)] == [".checkpoint-2.deleting"]
    many_file_checkpoint(accelerator, tmp_path, 3, files=1)
    assert interrupted_deletions(tmp_path) == []


def test_a_checkpoint_that_cannot_be_renamed_is_kept_whole(tmp_path, monkeypatch, capsys):
    accelerator = Accelerator(cpu=True)
    for step in (1, 2):
        many_file_checkpoint(accelerator, tmp_path, step, files=2)

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", str(src))

    monkeypatch.setattr(os, "rename", refuse)
    prune_checkpoints(tmp_path, 1)
    monkeypatch.undo()
    assert [step for step, _ in checkpoints(tmp_path)] == [1, 2] and verify_checkpoint(tmp_path / "checkpoint-1").ok
    assert "save_total_limit: could not remove" in capsys.readouterr().err


# Run in a subprocess and SIGKILLed while it deletes: prune_checkpoints with shutil.rmtree slowed to one file every
# 20 ms, the manifest first and trainer_state.json last (so the leftover looks like a checkpoint without manifest).
SLOW_PRUNE = r"""
import os, shutil, sys, time
from pathlib import Path
from rlhfkit.checkpoint import MANIFEST_FILE, STATE_FILE, prune_checkpoints

def slow_rmtree(path, ignore_errors=False, **kwargs):
    files = [Path(d, n) for d, _, names in os.walk(path) for n in names]
    files.sort(key=lambda f: (f.name != MANIFEST_FILE, f.name == STATE_FILE, str(f)))
    for file in files:
        os.remove(file)
        time.sleep(0.02)
    for d, _, _ in sorted(os.walk(path), reverse=True):
        os.rmdir(d)

shutil.rmtree = slow_rmtree
prune_checkpoints(sys.argv[1], 2)
"""


@pytest.mark.slow  # a subprocess that imports torch
def test_sigkill_mid_deletion_leaves_no_listed_partial_checkpoint(tmp_path):
    accelerator = Accelerator(cpu=True)
    files = 300
    for step in (1, 2, 3):
        many_file_checkpoint(accelerator, tmp_path, step, files=files)
    leftover = tmp_path / ".checkpoint-1.deleting"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    process = subprocess.Popen([sys.executable, "-c", SLOW_PRUNE, str(tmp_path)], cwd=ROOT, env=env,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    try:
        # Kill once the deletion is under way: the manifest and some shards gone, most of it still there.
        while not (leftover.is_dir() and not (leftover / MANIFEST_FILE).exists() and file_count(leftover) < files):
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline, "the pruning process never started deleting"
            time.sleep(0.005)
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()
    assert 0 < file_count(leftover) < files
    assert_only_intact_checkpoints_are_seen(tmp_path, [2, 3])

    many_file_checkpoint(accelerator, tmp_path, 4, files=2, limit=2)  # the next save removes the leftover
    assert interrupted_deletions(tmp_path) == [] and [step for step, _ in checkpoints(tmp_path)] == [3, 4]
