"""The built-in tasks by name, and loading the task an assets dir was built for."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rlhfkit.errors import ConfigError

from . import addition, agent, code, reverse, reverse_chat, sort
from .base import Task, import_ref
from .layout import Assets

TASKS: dict[str, Task] = {
    t.name: t for t in (sort.TASK, reverse.TASK, addition.TASK, agent.TASK, reverse_chat.TASK, code.TASK)
}
DEFAULT_TASK = "sort"


def load_task(path: str | Path) -> Task:
    """Read `task.json` from an assets dir (or the file itself) and return the registered `Task`.

    The check function is imported from its "module:function" reference, and the reward functions from theirs, so
    a task.json written by another version (or by hand) is honoured as written.
    """
    path = Path(path)
    file = Assets(path).task_file if path.is_dir() else path
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
        base = TASKS[meta["name"]]
    except FileNotFoundError:
        raise ConfigError(
            f"--task {str(path)!r}: no task file at {file}. Pass an assets directory built by rlhfkit (it holds "
            "task.json), or the task.json itself."
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--task {str(path)!r}: {file} cannot be read ({e}).") from None
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"--task {str(path)!r}: {file} is not valid JSON: line {e.lineno}, column {e.colno}: {e.msg}."
        ) from None
    except (KeyError, TypeError):
        raise ConfigError(
            f'--task {str(path)!r}: {file} must name one of the built-in tasks in its "name" field '
            f"({', '.join(TASKS)})."
        ) from None
    check = import_ref(meta["check"])
    reward_funcs = {name: import_ref(ref) for name, ref in meta.get("reward_funcs", {}).items()}
    # replace, not a new Task: a task's own kind (the agent task's tools) is kept
    return dataclasses.replace(
        base,
        check=check,
        reward_funcs=reward_funcs or dict(base.reward_funcs),
        max_new_tokens=int(meta.get("max_new_tokens", base.max_new_tokens)),
    )
