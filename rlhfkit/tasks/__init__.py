"""The built-in offline tasks: prompts and checkers, and a tiny tokenizer, SFT model and reward model built locally
and cached."""

from .base import Task, import_ref
from .build import BUILDER_VERSION, PRESETS, build_tiny, builtin_assets
from .layout import Assets
from .registry import DEFAULT_TASK, TASKS, load_task
from .success import evaluate_success, generate_completions
from .tokenizer import build_tokenizer

__all__ = [
    "Assets",
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
