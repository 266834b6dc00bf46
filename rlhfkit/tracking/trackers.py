"""Which trackers a run uses, and how accelerate's own tracker classes are set up for it.

Runs, configs and scalars go through accelerate's tracker classes; this module decides their names,
directories and modes. Histograms, tables and alerts, which accelerate has no API for, RunLogger sends
with each tracker library's own types.

Where each tracker writes (see :func:`make_trackers`):
  trackio      project = `project`, run name = `run_name`; data in trackio's SQLite store under
               $TRACKIO_DIR (trackio's default: the user's cache). ``trackio show --project PROJECT``.
  wandb        project = $WANDB_PROJECT or `project`, run name = `run_name`, files under `output_dir`/wandb/.
               Offline (``wandb sync`` later) when $WANDB_MODE is unset and no API key is configured.
  tensorboard  event files under `logging_dir`/`run_name`, or `output_dir`/runs/`run_name` when no
               logging_dir is given, so several runs sharing a logging_dir stay apart.
  others       accelerate's tracker of that name (comet_ml, mlflow, aim, clearml, dvclive, swanlab), named after
               `project`; a directory, where the tracker needs one, under `output_dir`/<name>.
"""

from __future__ import annotations

import json
import netrc
import os
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

# First-class: tested, with histograms, completion tables and alerts besides scalars.
TRACKERS: tuple[str, ...] = ("trackio", "wandb", "tensorboard")
# Every other tracker accelerate ships: scalars and the config, through accelerate's own classes.
OTHER_TRACKERS: tuple[str, ...] = ("comet_ml", "mlflow", "aim", "clearml", "dvclive", "swanlab")
_INSTALL_HINT = {
    "trackio": "pip install trackio",
    "wandb": "pip install 'rlhfkit[wandb]'",
    "tensorboard": "pip install 'rlhfkit[tensorboard]'",
    **{name: f"pip install {name}" for name in OTHER_TRACKERS},
}


def installed_trackers() -> list[str]:
    """The trackers of TRACKERS and OTHER_TRACKERS that accelerate can use in this environment (each library is
    looked for only here, so a tracker nobody asked for is never imported)."""
    import accelerate.utils

    return [name for name in (*TRACKERS, *OTHER_TRACKERS) if getattr(accelerate.utils, f"is_{name}_available")()]


REPORT_TO_NAMES: tuple[str, ...] = (*TRACKERS, *OTHER_TRACKERS, "all", "none")


def parse_report_to(value: str | Sequence[str] | None) -> list[str]:
    """The names of a `report_to` setting, checked for spelling only: lower-case, deduplicated, in order.

    None and [] give []; a comma-separated string ("wandb,tensorboard") is split. Raises ValueError for an
    entry that is not text, an unknown name, or "none" combined with trackers.
    """
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"entries must be tracker names ({', '.join(REPORT_TO_NAMES)}), got {item!r}")
        for name in item.split(","):
            name = name.strip().lower()
            if name and name not in names:
                names.append(name)
    unknown = [n for n in names if n not in REPORT_TO_NAMES]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a tracker; use {', '.join(REPORT_TO_NAMES)}")
    if "none" in names and len(names) > 1:
        raise ValueError("'none' cannot be combined with trackers")
    return names


def resolve_report_to(value: str | Sequence[str] | None) -> list[str]:
    """The trackers a `report_to` setting asks for (:func:`parse_report_to`): "none" gives [], "all" every
    installed one of TRACKERS. Raises ValueError for a misspelt setting and ImportError for a tracker that is
    requested by name but not installed.
    """
    try:
        names = parse_report_to(value)
    except ValueError as e:
        raise ValueError(f"report_to={value!r}: {e}") from None
    if names == ["none"]:
        return []
    installed = installed_trackers()
    resolved: list[str] = []
    for name in names:
        if name == "all":
            resolved += [n for n in installed if n not in resolved]
        elif name not in resolved:
            if name not in installed:
                raise ImportError(f"report_to includes {name!r} but it is not installed: {_INSTALL_HINT[name]}")
            resolved.append(name)
    return resolved


def tensorboard_root(output_dir: str | os.PathLike, logging_dir: str | os.PathLike | None) -> Path:
    """Directory holding one TensorBoard sub-directory per run (`tensorboard --logdir` it)."""
    return Path(logging_dir) if logging_dir else Path(output_dir) / "runs"


def wandb_has_credentials() -> bool:
    """True if W&B could authenticate: $WANDB_API_KEY, an identity token file, or a netrc entry for the host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_init_kwargs(
    run_name: str, output_dir: str | os.PathLike, resume: bool = False, run_id: str | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``wandb.init`` (through accelerate's WandBTracker).

    The run's files go under `output_dir`/wandb. Without credentials and without an explicit
    $WANDB_MODE the run is offline instead of prompting for a login, so a first run never blocks.
    """
    kwargs: dict[str, Any] = {"name": run_name, "dir": str(output_dir)}
    if "WANDB_MODE" not in os.environ and not wandb_has_credentials():
        kwargs["mode"] = "offline"
    if resume:
        kwargs["resume"] = "allow"
        if run_id:
            kwargs["id"] = run_id  # continue the same W&B run
    return kwargs


def trackio_init_kwargs(run_name: str, resume: bool = False) -> dict[str, Any]:
    """Keyword arguments for ``trackio.init`` (through accelerate's TrackioTracker)."""
    kwargs: dict[str, Any] = {"name": run_name}
    if resume:
        kwargs["resume"] = "allow"  # continue the run of the same name in the same project
    return kwargs


def make_trackers(
    report_to: str | Sequence[str] | None,
    *,
    project: str,
    run_name: str,
    output_dir: str | os.PathLike,
    logging_dir: str | os.PathLike | None = None,
    resume: bool = False,
    wandb_id: str | None = None,
) -> list:
    """accelerate tracker objects for a run, to pass as ``Accelerator(log_with=...)``.

    Building the objects here (instead of passing names) lets each tracker get its own run name and
    directory: accelerate's name-based setup would put TensorBoard under <logging_dir>/<project>,
    mixing runs. Nothing starts until ``accelerator.init_trackers`` (main process only).
    """
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, TensorBoardTracker, TrackioTracker, WandBTracker

    trackers = []
    for name in resolve_report_to(report_to):
        if name == "tensorboard":
            trackers.append(TensorBoardTracker(run_name, str(tensorboard_root(output_dir, logging_dir))))
        elif name == "wandb":
            # As transformers' WandbCallback: $WANDB_PROJECT names the project; WANDB_ENTITY, WANDB_TAGS and the
            # other WANDB_* variables are read by wandb.init itself.
            wandb_project = os.environ.get("WANDB_PROJECT") or project
            trackers.append(WandBTracker(wandb_project, **wandb_init_kwargs(run_name, output_dir, resume, wandb_id)))
        elif name == "trackio":
            trackers.append(TrackioTracker(project, **trackio_init_kwargs(run_name, resume)))
        else:  # as accelerate builds it from its name: the project first, a directory where it needs one
            tracker_class = LOGGER_TYPE_TO_CLASS[name]
            where = {"logging_dir": str(Path(output_dir) / name)} if tracker_class.requires_logging_directory else {}
            trackers.append(tracker_class(project, **where))
    return trackers


def flatten_config(config: Mapping[str, Any], sep: str = "/") -> dict[str, bool | int | float | str]:
    """Flatten a nested config into scalar values, as TensorBoard's hparams require.

    Nested mappings become "outer/inner" keys; None becomes "None"; lists, tuples and other values
    become their JSON text (or str()), so nothing is dropped.
    """
    flat: dict[str, bool | int | float | str] = {}

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, inner in value.items():
                visit(f"{prefix}{sep}{key}" if prefix else str(key), inner)
        elif isinstance(value, Enum):
            visit(prefix, value.value)
        elif isinstance(value, (bool, int, float, str)):
            flat[prefix] = value
        elif value is None:
            flat[prefix] = "None"
        elif isinstance(value, os.PathLike):
            flat[prefix] = os.fspath(value)
        else:
            try:
                flat[prefix] = json.dumps(value, default=str)
            except (TypeError, ValueError):
                flat[prefix] = str(value)

    for key, value in config.items():
        visit(str(key), value)
    return flat
