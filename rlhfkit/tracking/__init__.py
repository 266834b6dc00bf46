"""Experiment tracking through accelerate (Trackio, W&B, TensorBoard) and the run directory.

Names are resolved on first use: `rlhfkit.tracking.rundir` is stdlib-only, and reading a run directory (the
config's output_dir check, doctor, report) must not load NumPy and the trackers' setup through this package.
"""

import importlib

_EXPORTS = {
    "CONFIG_FILE": "rundir",
    "HEALTH_FILE": "rundir",
    "METRICS_FILE": "rundir",
    "SAMPLES_FILE": "rundir",
    "RunDirectory": "rundir",
    "holds_run": "rundir",
    "read_config": "rundir",
    "read_jsonl": "rundir",
    "RunLogger": "logger",
    "markdown_table": "tables",
    "rich_table": "tables",
    "TRACKERS": "trackers",
    "flatten_config": "trackers",
    "installed_trackers": "trackers",
    "make_trackers": "trackers",
    "resolve_report_to": "trackers",
    "tensorboard_root": "trackers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"rlhfkit.tracking.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'rlhfkit.tracking' has no attribute {name!r}")
