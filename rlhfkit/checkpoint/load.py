"""Reading a checkpoint back: which one to resume (verified against its manifest), its counters, this process's
state, the optimizer and the models' weights, each failure a CheckpointError or StorageError that names the file
and says how to go on.

``.pt`` files are loaded with ``torch.load(weights_only=True)``: no pickle code runs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from rlhfkit.checkpoint.integrity import Verdict, verify_checkpoint
from rlhfkit.checkpoint.layout import (
    CHECKPOINT_DIR,
    DELETING_DIR,
    ENGINE_DIR,
    EXTRA_FILE,
    FORMAT_VERSION,
    OPTIMIZER_FILE,
    STATE_FILE,
    checkpoints,
    rng_file,
)
from rlhfkit.errors import CheckpointError, StorageError


def resolve_checkpoint(spec: str, output_dir: str | os.PathLike | None) -> Path:
    """The checkpoint directory `spec` names, verified against its manifest (verify_checkpoint): a path, or "latest".

    "latest": the newest complete checkpoint of output_dir that verifies. When newer ones fail, one line on stderr
    says which checkpoint is taken and why the newer ones were not; when none verifies, StorageError. A path that
    fails verification: StorageError naming the file, the reason and the previous checkpoint that verifies.
    A checkpoint without manifest.json (written before manifests) is taken unverified, as before; one whose
    trainer_state.json says a manifest was written fails without it. A ``.checkpoint-N.deleting`` directory (a
    deletion by save_total_limit that a killed process did not finish) is never listed, and refused by path.
    """
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
        failed: list[Verdict] = []
        for _, path in reversed(found):
            verdict = verify_checkpoint(path)
            if verdict.ok:
                if failed:
                    _announce(path, failed)
                return path
            failed.append(verdict)
        reasons = "; ".join(f"{v.path.name}: {v.reason()}" for v in failed)
        raise StorageError(
            f"--resume_from_checkpoint latest: no checkpoint of {output_dir} is intact ({reasons}). Start the run "
            "afresh (--overwrite_output_dir, or another --output_dir)."
        )
    path = Path(spec)
    if not path.is_dir():
        raise CheckpointError(f"--resume_from_checkpoint {spec!r} is not a directory.")
    if DELETING_DIR.match(path.resolve().name):
        raise CheckpointError(
            f"--resume_from_checkpoint {spec}: a checkpoint rlhfkit was deleting (save_total_limit, or a newer "
            "save of its step) when its process was killed, possibly half gone. Resume from a checkpoint-N "
            "directory, or from 'latest'."
        )
    verdict = verify_checkpoint(path)
    if not verdict.ok:
        previous = _previous_good(path)
        advice = (
            f"The previous intact checkpoint is {previous}: resume from it (or from 'latest', which skips damaged ones)."
            if previous is not None
            else "No earlier checkpoint beside it is intact: start the run afresh."
        )
        raise StorageError(f"--resume_from_checkpoint {spec}: the checkpoint is damaged: {verdict.reason()}. {advice}")
    return path


_ANNOUNCED: set = set()


def _announce(taken: Path, failed: list[Verdict]) -> None:
    """Say once, on the main process, which checkpoint 'latest' took and why the newer ones failed."""
    key = (str(taken), tuple((v.path.name, v.failures) for v in failed))
    if key in _ANNOUNCED or os.environ.get("RANK", "0") != "0":
        return
    _ANNOUNCED.add(key)
    why = "; ".join(f"{v.path.name} failed verification ({v.reason()})" for v in failed)
    print(f"[rlhfkit] resuming from {taken.name}, the newest intact checkpoint: {why}.", file=sys.stderr, flush=True)


def _previous_good(path: Path) -> Path | None:
    """The newest checkpoint beside `path`, older than it, that verifies (or has no manifest)."""
    match = CHECKPOINT_DIR.match(path.name)
    step = int(match.group(1)) if match else None
    for number, other in reversed(checkpoints(path.parent)):
        if (step is None or number < step) and other.resolve() != path.resolve() and verify_checkpoint(other).ok:
            return other
    return None


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
    for name in (state_file, EXTRA_FILE, rng_file(process_index)):
        if not (path / name).exists():
            raise CheckpointError(f"{path} is incomplete: {name} is missing. Resume from an earlier checkpoint.")
    try:
        extra = torch.load(path / EXTRA_FILE, weights_only=True)
        rng = torch.load(path / rng_file(process_index), weights_only=True)
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
        _raise_if_damaged(e, directory)
        raise CheckpointError(
            f"{directory}: cannot load its weights into the model ({type(e).__name__}: {e}). Resume with the same "
            "model as the checkpointed run, from an intact checkpoint."
        ) from e


def _raise_if_damaged(error: Exception, directory: str | os.PathLike) -> None:
    """A weight file safetensors cannot parse is damaged (truncated, overwritten), not another model: say so,
    naming the file (a checkpoint without manifest.json is not verified before it is loaded)."""
    if type(error).__name__ != "SafetensorError":
        return
    files = sorted(Path(directory).glob("*.safetensors"))
    name = files[0] if len(files) == 1 else Path(directory)
    raise StorageError(
        f"{name} is damaged: safetensors cannot read it ({error}); it was probably truncated or overwritten. Resume "
        "from an earlier checkpoint-N (`rlhfkit checkpoints RUN_DIR` lists them and their state)."
    ) from error


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
        _raise_if_damaged(e, directory)
        raise CheckpointError(
            f"{directory}: cannot load its LoRA adapter into the model ({type(e).__name__}: {e}). Resume with the "
            "same model and LoRA flags (--lora_r, --lora_target_modules, ...) as the checkpointed run."
        ) from e
