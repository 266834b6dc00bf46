"""Experiment tracking through accelerate (Trackio, W&B, TensorBoard) and the run directory."""

from rlhfkit.tracking.logger import RunLogger
from rlhfkit.tracking.rundir import CONFIG_FILE, METRICS_FILE, SAMPLES_FILE, RunDirectory
from rlhfkit.tracking.tables import markdown_table, rich_table
from rlhfkit.tracking.trackers import (
    TRACKERS,
    flatten_config,
    installed_trackers,
    make_trackers,
    resolve_report_to,
    tensorboard_root,
)

__all__ = [
    "CONFIG_FILE",
    "METRICS_FILE",
    "SAMPLES_FILE",
    "TRACKERS",
    "RunDirectory",
    "RunLogger",
    "flatten_config",
    "installed_trackers",
    "make_trackers",
    "markdown_table",
    "resolve_report_to",
    "rich_table",
    "tensorboard_root",
]
