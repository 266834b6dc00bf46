"""An assets directory of the built-in task: what ``rlhfkit build-tiny`` writes (tasks/build.py) and every other
command reads, each a standard transformers or datasets format:

    tokenizer/   character tokenizer (save_pretrained)
    sft/         the policy after its supervised warm start (+ a tokenizer copy)
    reward/      the reward model, sequence classification with 1 label (+ a tokenizer copy)
    prompts/     datasets.DatasetDict {"train", "test"} with columns "prompt", "answer" (save_to_disk)
    task.json    the task's name, check/reward function references and the build's measurements
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Assets:
    """The paths inside the assets directory `root`."""

    root: Path

    def __init__(self, root: str | os.PathLike):
        object.__setattr__(self, "root", Path(root))

    @property
    def tokenizer(self) -> str:
        return str(self.root / "tokenizer")

    @property
    def sft(self) -> str:
        return str(self.root / "sft")

    @property
    def reward(self) -> str:
        return str(self.root / "reward")

    @property
    def prompts(self) -> str:
        return str(self.root / "prompts")

    @property
    def task_file(self) -> Path:
        return self.root / "task.json"

    def is_built(self) -> bool:
        """Whether a build completed here (task.json is written last)."""
        return self.task_file.is_file()


def ensure_replaceable(out_dir: Path) -> None:
    """A build may replace a missing or empty dir or a previous build (a dir with task.json), never other data."""
    if out_dir.exists() and not Assets(out_dir).is_built() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} exists, is not empty and is not an rlhfkit assets dir")


def install(tmp: Path, out_dir: Path) -> None:
    """Move the finished build into place, replacing a previous build."""
    if out_dir.exists():
        ensure_replaceable(out_dir)
        trash = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(out_dir, trash)
        os.replace(tmp, out_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)
