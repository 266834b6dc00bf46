"""--reward_funcs: the names of reward functions (built-in, TRL's, or references to a module's function) to
callables."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable

from rlhfkit.errors import ConfigError
from rlhfkit.trl_rewards import TRL_REWARDS, trl_reward_function

REFERENCE_FORMS = "'module:function', 'path/to/file.py:function' or TRL's dotted 'module.function'"


def import_reward_function(ref: str) -> Callable:
    """The function named by a reference: "module:function", "path/to/file.py:function", or TRL's dotted
    "module.function" (split at the last dot, as TRL's GRPO script does). The module is imported only because the user
    named it; the current directory is importable, as with ``python -m``."""
    if ":" in ref:
        module_name, _, attr = ref.rpartition(":")
        form = "a 'module:function' or 'path/to/file.py:function' reference"
    else:
        module_name, _, attr = ref.rpartition(".")
        form = "TRL's dotted 'module.function' reference"
    accepted = f"--reward_funcs takes a built-in reward name, {REFERENCE_FORMS}."
    if ":" not in ref and ref.endswith(".py"):
        raise ConfigError(f"--reward_funcs {ref!r}: name the function in the file too, as '{ref}:function'.")
    if not module_name or not attr:
        raise ConfigError(f"--reward_funcs {ref!r}: expected a module and a function name. {accepted}")
    tried = f"read as {form}: module {module_name!r}, function {attr!r}"
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise ConfigError(
                    f"--reward_funcs {ref!r}: the file {module_name!r} does not exist (relative to {os.getcwd()})."
                )
            spec = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"--reward_funcs {ref!r}: cannot import {module_name!r} ({e}); {tried}, looked up from the current "
            f"directory and the installed packages. {accepted}"
        ) from e
    except SyntaxError as e:
        raise ConfigError(
            f"--reward_funcs {ref!r}: {e.filename}, line {e.lineno}: {type(e).__name__}: {e.msg}. Fix the file."
        ) from None
    except ConfigError:
        raise
    except Exception as e:  # the module raised while it was imported
        frame = traceback.extract_tb(e.__traceback__)[-1]
        raise ConfigError(
            f"--reward_funcs {ref!r}: importing {module_name!r} raised {type(e).__name__}: {e} ({frame.filename}, "
            f"line {frame.lineno}). Fix the module: it runs when rlhfkit imports it."
        ) from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"--reward_funcs {ref!r}: {module_name!r} has no function {attr!r} ({tried}). {accepted}")
    return fn


def resolve_reward_funcs(names: list[str] | None, task) -> list:
    """Reward callables for --reward_funcs (GRPO's and PPO's). Each name is looked up in order as: one of the task's
    built-in rewards; one of TRL's built-in reward names (rlhfkit.trl_rewards: think_format_reward,
    get_soft_overlong_punishment, accuracy_reward, reasoning_accuracy_reward); a reference (import_reward_function):
    "module:function", "path/to/file.py:function", or TRL's dotted "module.function".

    No names: the task's rule-based rewards (GRPO's default). No task and no names: an error (GRPO needs a reward).
    """
    builtin = dict(task.reward_funcs) if task is not None else {}
    if not names:
        if not builtin:
            raise ConfigError(
                "GRPO needs a reward: pass --reward_funcs module:function (or a built-in name with --task) and/or "
                "--reward_model_path PATH."
            )
        return list(builtin.values())
    funcs = []
    for name in names:
        if name in builtin:
            funcs.append(builtin[name])
        elif name in TRL_REWARDS:
            funcs.append(trl_reward_function(name))
        elif ":" in name or "." in name:
            funcs.append(import_reward_function(name))
        else:
            known = ", ".join(builtin) or "none without --task"
            raise ConfigError(
                f"--reward_funcs {name!r} is not a built-in reward of the task (built-in: {known}), nor one of TRL's "
                f"built-in rewards ({', '.join(TRL_REWARDS)}), nor a reference: {REFERENCE_FORMS}."
            )
    return funcs
