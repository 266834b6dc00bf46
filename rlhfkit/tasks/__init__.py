"""The built-in offline task: tokenizer, tiny SFT model, reward model and prompts, built locally and cached."""

from . import addition, reverse, sort
from .base import Task, import_ref, load_task
from .build import BUILDER_VERSION, PRESETS, build_tiny, builtin_assets
from .generation import evaluate_success, generate_completions
from .tokenizer import build_tokenizer

TASKS: dict[str, Task] = {t.name: t for t in (sort.TASK, reverse.TASK, addition.TASK)}
DEFAULT_TASK = "sort"

__all__ = [
    "BUILDER_VERSION",
    "DEFAULT_TASK",
    "PRESETS",
    "TASKS",
    "Task",
    "build_tiny",
    "build_tokenizer",
    "builtin_assets",
    "evaluate_success",
    "generate_completions",
    "import_ref",
    "load_task",
]
