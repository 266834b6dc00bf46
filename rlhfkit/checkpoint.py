"""Checkpoints that resume a run exactly, written atomically.

A checkpoint directory ``checkpoint-N`` (N = the step it was taken after) holds:

    model.safetensors, config.json, tokenizer files   the policy, loadable on its own by any transformers tool
                                                      (--use_peft: adapter_config.json and adapter_model.safetensors,
                                                      the LoRA adapter, which peft loads onto the base model)
    value_model/                                      PPO's value model (safetensors; --use_peft: its adapter)
    ref_model/                                        GRPO's reference with --sync_ref_model (it changes then)
    optimizer.pt                                      optimizer state (tensors and numbers only)
    engine/                                           instead of optimizer.pt under DeepSpeed or FSDP: the engine's
                                                      own sharded model and optimizer state (accelerate.save_state;
                                                      DeepSpeed's files are its own format, pickles included)
    extra_state.pt                                    the trainer's own tensors (PPO's KL controller, a GRPO batch still
                                                      in use) and the metric sums of an unfinished logging window
    rng_state_<rank>.pt                               every library's RNG state, one file per process
    trainer_state.json                                counters (steps, episodes, data position, skipped steps); written last

Everything is written into ``checkpoint-N.tmp`` and renamed once complete, so a crash during a save leaves the
previous checkpoints intact and never a directory that looks complete but is not (trainer_state.json is the
completeness mark). ``.pt`` files are loaded with ``torch.load(weights_only=True)``: no pickle code runs.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlhfkit.errors import CheckpointError

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
EXTRA_FILE = "extra_state.pt"
ENGINE_DIR = "engine"
VALUE_MODEL_DIR = "value_model"
REF_MODEL_DIR = "ref_model"
# 2: extra_state.pt holds {"trainer": the trainer's own state, "window": the unfinished logging window} and
# trainer_state.json the skipped-step counters ("nonfinite"), the same for PPO and GRPO.
FORMAT_VERSION = 2
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_path(output_dir: str | os.PathLike, step: int) -> str:
    """Where the checkpoint taken after `step` lives."""
    return os.path.join(output_dir, f"checkpoint-{step}")


def rng_state() -> dict[str, Any]:
    """The RNG states of Python, NumPy and torch (CPU and every CUDA device) of this process, as plain data."""
    np_state = np.random.get_state()
    state = {
        "python": _listify(random.getstate()),
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "rest": [np_state[0], *np_state[2:]]},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuplify(state["python"]))
    kind, *rest = state["numpy"]["rest"]
    np.random.set_state((kind, state["numpy"]["key"].numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _listify(value):
    return [_listify(v) for v in value] if isinstance(value, tuple) else value


def _tuplify(value):
    return tuple(_tuplify(v) for v in value) if isinstance(value, list) else value


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
    """
    path = str(path).rstrip("/")
    tmp = path + ".tmp"
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    accelerator.wait_for_everyone()
    torch.save(rng_state(), os.path.join(tmp, f"rng_state_{accelerator.process_index}.pt"))
    if save_engine is not None:
        save_engine(os.path.join(tmp, ENGINE_DIR))
    if accelerator.is_main_process:
        write_models(tmp)
        if optimizer is not None:
            torch.save(optimizer.state_dict(), os.path.join(tmp, OPTIMIZER_FILE))
        torch.save(extra or {}, os.path.join(tmp, EXTRA_FILE))
        record = {"format_version": FORMAT_VERSION, "num_processes": accelerator.num_processes, **state}
        Path(tmp, STATE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        prune_checkpoints(os.path.dirname(path) or ".", save_total_limit)
    accelerator.wait_for_everyone()


def checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run directory, oldest first: (step, path)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _CHECKPOINT_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def prune_checkpoints(output_dir: str | os.PathLike, limit: int | None) -> None:
    """Delete all but the newest `limit` complete checkpoints of `output_dir` (none when limit is None or 0)."""
    if not limit:
        return
    found = checkpoints(output_dir)
    for _, path in found[: max(0, len(found) - limit)]:
        shutil.rmtree(path, ignore_errors=True)


def resolve_checkpoint(spec: str, output_dir: str | os.PathLike | None) -> Path:
    """The checkpoint directory `spec` names: a path, or "latest" (the newest complete one in output_dir)."""
    if spec == "latest":
        if output_dir is None:
            raise CheckpointError(
                "--resume_from_checkpoint latest needs --output_dir: the run directory whose newest checkpoint to use."
            )
        found = checkpoints(output_dir)
        if not found:
            raise CheckpointError(
                f"--resume_from_checkpoint latest: {output_dir} holds no complete checkpoint-N directory. Pass "
                "the path of a checkpoint, or start the run without --resume_from_checkpoint."
            )
        return found[-1][1]
    path = Path(spec)
    if not path.is_dir():
        raise CheckpointError(f"--resume_from_checkpoint {spec!r} is not a directory.")
    return path


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    """trainer_state.json of a checkpoint, with a clear CheckpointError when it is missing or unreadable."""
    state_file = Path(path) / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(
            f"{path} is not a complete checkpoint (no {STATE_FILE}; a save was probably interrupted). Resume from "
            "an earlier checkpoint-N, or from 'latest', which skips incomplete ones."
        )
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{state_file} is corrupt ({e}). Resume from an earlier checkpoint.") from e
    if not isinstance(state, dict) or "format_version" not in state:
        raise CheckpointError(f"{state_file} is not an rlhfkit checkpoint (no format_version).")
    if state["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            f"{state_file} has checkpoint format {state['format_version']}; this rlhfkit reads format "
            f"{FORMAT_VERSION}. Resume it with the rlhfkit version that wrote it, or start the run afresh."
        )
    return state


def load_process_state(
    path: str | os.PathLike, state: dict, process_index: int, num_processes: int, engine: str = "DDP"
) -> tuple:
    """(extra, rng) of a checkpoint for this process; a clear CheckpointError when anything is missing or the run
    is launched under another engine (`engine`, as engines.Engine prints it) than the one that wrote it."""
    path = Path(path)
    if state["num_processes"] != num_processes:
        raise CheckpointError(
            f"{path} was written by {state['num_processes']} processes, this run has {num_processes}: resume with "
            f"the same number of processes (each process's data position and random state are in it)."
        )
    written_by = state.get("engine", "DDP")
    if written_by != engine:
        raise CheckpointError(
            f"{path} was written under {written_by}, this run is launched under {engine}: the optimizer state is "
            "kept as the engine sharded it. Resume with the same accelerate config as the checkpointed run."
        )
    state_file = ENGINE_DIR if engine != "DDP" else OPTIMIZER_FILE
    for name in (state_file, EXTRA_FILE, f"rng_state_{process_index}.pt"):
        if not (path / name).exists():
            raise CheckpointError(f"{path} is incomplete: {name} is missing. Resume from an earlier checkpoint.")
    try:
        extra = torch.load(path / EXTRA_FILE, weights_only=True)
        rng = torch.load(path / f"rng_state_{process_index}.pt", weights_only=True)
    except Exception as e:  # a truncated or foreign file: say which
        raise CheckpointError(f"{path}: cannot read its state files ({type(e).__name__}: {e}).") from e
    return extra, rng


def load_optimizer(optimizer: torch.optim.Optimizer, path: str | os.PathLike) -> None:
    try:
        optimizer.load_state_dict(torch.load(Path(path) / OPTIMIZER_FILE, weights_only=True))
    except Exception as e:
        raise CheckpointError(f"{path}: cannot restore the optimizer ({type(e).__name__}: {e}).") from e


def load_weights(model: torch.nn.Module, directory: str | os.PathLike) -> None:
    """Copy the weights of a save_pretrained directory into `model` (same architecture; strict).

    Loading through the model class lets transformers handle tied and sharded weights as it wrote them. A peft
    model (--use_peft) loads its adapter's weights only (load_adapter_weights).
    """
    from rlhfkit.models import is_peft_model

    if is_peft_model(model):
        return load_adapter_weights(model, directory)
    dtype = next(model.parameters()).dtype
    try:
        saved = type(model).from_pretrained(str(directory), dtype=dtype)
        model.load_state_dict(saved.state_dict())
    except Exception as e:
        raise CheckpointError(
            f"{directory}: cannot load its weights into the model ({type(e).__name__}: {e}). Resume with the same "
            "model as the checkpointed run, from an intact checkpoint."
        ) from e


def load_adapter_weights(model: torch.nn.Module, directory: str | os.PathLike) -> None:
    """Copy the adapter a peft model's save_pretrained wrote in `directory` (adapter_model.safetensors: LoRA
    matrices and modules_to_save) into the peft model `model`, whose base weights are untouched. Strict: the file
    must hold exactly the tensors the model's adapter has."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(directory) / "adapter_model.safetensors"
    try:
        saved = load_file(path)
        expected = set(get_peft_model_state_dict(model))
        if set(saved) != expected:
            missing, unexpected = sorted(expected - set(saved)), sorted(set(saved) - expected)
            raise ValueError(f"missing {missing[:3]}, unexpected {unexpected[:3]}")
        set_peft_model_state_dict(model, saved)
    except Exception as e:
        raise CheckpointError(
            f"{directory}: cannot load its LoRA adapter into the model ({type(e).__name__}: {e}). Resume with the "
            "same model and LoRA flags (--lora_r, --lora_target_modules, ...) as the checkpointed run."
        ) from e


def save_into(accelerator, path: str, write: Callable[[str], None]) -> None:
    """Write files into the directory `path` (the run directory, which already holds logs): `write(tmp_dir)` on the
    main process, then each written file or folder is moved into `path`, replacing one of the same name. A crash
    mid-write leaves only `path`.tmp behind, never a half-written model in `path`."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        tmp = path.rstrip("/") + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp)
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(tmp):
            target = os.path.join(path, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            os.replace(os.path.join(tmp, name), target)
        os.rmdir(tmp)
    accelerator.wait_for_everyone()
