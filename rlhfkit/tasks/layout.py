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
