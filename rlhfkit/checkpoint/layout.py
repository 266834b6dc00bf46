"""What a checkpoint directory holds, and where a run's checkpoints are: every file name, in one place.

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
    trainer_state.json                                counters (steps, episodes, data position, skipped steps) and the run's config
    manifest.json                                     every other file's relative path, size and sha256; written last

trainer_state.json is the completeness mark: a directory without it is a save that did not finish. Pruning
(save_total_limit) first renames a checkpoint to ``.checkpoint-N.deleting`` (:func:`deleting_path`), then deletes it:
a process killed mid-deletion leaves only that hidden directory, which no listing shows and no resume takes. Standard
library only, so listing a run's checkpoints loads nothing heavy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
EXTRA_FILE = "extra_state.pt"
ENGINE_DIR = "engine"
VALUE_MODEL_DIR = "value_model"
REF_MODEL_DIR = "ref_model"
MANIFEST_FILE = "manifest.json"
RNG_FILE_PREFIX = "rng_state_"
# 2: extra_state.pt holds {"trainer": the trainer's own state, "window": the unfinished logging window} and
# trainer_state.json the skipped-step counters ("nonfinite"), the same for PPO and GRPO.
FORMAT_VERSION = 2
CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
# A checkpoint being deleted: renamed out of CHECKPOINT_DIR's names first (hidden, so a `checkpoint-*` glob misses it).
DELETING_DIR = re.compile(r"^\.checkpoint-(\d+)\.deleting$")


def rng_file(process_index: int) -> str:
    """The name of process `process_index`'s RNG state file."""
    return f"{RNG_FILE_PREFIX}{process_index}.pt"


def checkpoint_path(output_dir: str | os.PathLike, step: int) -> str:
    """Where the checkpoint taken after `step` lives."""
    return os.path.join(output_dir, f"checkpoint-{step}")


def checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run directory, oldest first: (step, path)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = CHECKPOINT_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def deleting_path(path: str | os.PathLike) -> Path:
    """Where checkpoint `path` is renamed before it is deleted: ``.checkpoint-N.deleting`` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.deleting")


def interrupted_deletions(output_dir: str | os.PathLike) -> list[Path]:
    """The ``.checkpoint-N.deleting`` directories of a run directory: deletions a killed process did not finish."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    return sorted(child for child in root.iterdir() if DELETING_DIR.match(child.name))


def files_under(root: Path) -> Iterator[Path]:
    """Every file under root, in a fixed order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            yield Path(dirpath, name)
