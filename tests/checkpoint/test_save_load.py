"""Checkpoint files: RNG round trip, atomic writes, finding the latest complete checkpoint, clear errors."""

import json
import random

import numpy as np
import pytest
import torch
from accelerate import Accelerator

from rlhfkit.checkpoint import (
    STATE_FILE,
    checkpoints,
    load_process_state,
    read_state,
    resolve_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from rlhfkit.errors import CheckpointError


def draw():
    return random.random(), float(np.random.rand()), float(np.random.randn()), torch.rand(3).tolist()


def test_rng_state_round_trip_through_a_weights_only_file(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # leaves a cached Gaussian in NumPy's state
    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = draw()
    draw()
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert draw() == expected


def fake_checkpoint(accelerator, path, step, save_total_limit=None):
    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    save_checkpoint(
        accelerator,
        path,
        lambda tmp: (path.parent / "weights-written").touch(),
        optimizer,
        {"progress": {"step": step}},
        {"batch": None},
        save_total_limit,
    )


def test_save_is_atomic_and_latest_skips_incomplete(tmp_path):
    accelerator = Accelerator(cpu=True)
    fake_checkpoint(accelerator, tmp_path / "checkpoint-2", 2)
    fake_checkpoint(accelerator, tmp_path / "checkpoint-4", 4)
    # A save that died half way: the .tmp directory and a directory without trainer_state.json are ignored.
    (tmp_path / "checkpoint-6.tmp").mkdir()
    (tmp_path / "checkpoint-8").mkdir()
    assert [step for step, _ in checkpoints(tmp_path)] == [2, 4]
    assert resolve_checkpoint("latest", tmp_path) == tmp_path / "checkpoint-4"
    state = read_state(tmp_path / "checkpoint-4")
    assert state["progress"] == {"step": 4} and state["num_processes"] == 1
    extra, rng = load_process_state(tmp_path / "checkpoint-4", state, 0, 1)
    assert extra == {"batch": None} and set(rng) >= {"python", "numpy", "torch"}
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir() if p.name != "checkpoint-6.tmp")


def test_save_total_limit_keeps_the_newest_complete_checkpoints(tmp_path):
    accelerator = Accelerator(cpu=True)
    (tmp_path / "checkpoint-9").mkdir()  # incomplete, with a higher step: neither counted nor deleted
    for step in (2, 4, 6):
        fake_checkpoint(accelerator, tmp_path / f"checkpoint-{step}", step, save_total_limit=2)
    assert [step for step, _ in checkpoints(tmp_path)] == [4, 6]
    assert (tmp_path / "checkpoint-9").is_dir()


def test_errors_name_the_checkpoint_and_the_fix(tmp_path):
    accelerator = Accelerator(cpu=True)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resolve_checkpoint("latest", tmp_path)
    with pytest.raises(CheckpointError, match="needs --output_dir"):
        resolve_checkpoint("latest", None)
    with pytest.raises(CheckpointError, match="not a directory"):
        resolve_checkpoint(str(tmp_path / "nope"), tmp_path)
    (tmp_path / "checkpoint-1").mkdir()
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        read_state(tmp_path / "checkpoint-1")
    (tmp_path / "checkpoint-1" / STATE_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        read_state(tmp_path / "checkpoint-1")
    fake_checkpoint(accelerator, tmp_path / "checkpoint-3", 3)
    state = read_state(tmp_path / "checkpoint-3")
    with pytest.raises(CheckpointError, match="2 processes|same number of processes"):
        load_process_state(tmp_path / "checkpoint-3", state, 0, 2)
    with pytest.raises(CheckpointError, match="written under DDP, this run is launched under DeepSpeed ZeRO stage 3"):
        load_process_state(tmp_path / "checkpoint-3", state, 0, 1, "DeepSpeed ZeRO stage 3")
    with pytest.raises(CheckpointError, match="engine is missing"):  # an engine checkpoint without its engine state
        load_process_state(
            tmp_path / "checkpoint-3", {**state, "engine": "FSDP (version 2)"}, 0, 1, "FSDP (version 2)"
        )
    (tmp_path / "checkpoint-3" / "rng_state_0.pt").write_bytes(b"truncated")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_process_state(tmp_path / "checkpoint-3", state, 0, 1)
    (tmp_path / "checkpoint-3" / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match="optimizer.pt is missing"):
        load_process_state(tmp_path / "checkpoint-3", state, 0, 1)
    assert json.loads((tmp_path / "checkpoint-3" / STATE_FILE).read_text())["progress"]["step"] == 3
