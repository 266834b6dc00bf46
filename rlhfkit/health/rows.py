"""A run's logged rows as the readers of ``rlhfkit doctor`` hand them over (Source), and how a tracker's keys become
the names the rules read. The readers (sources.py and the modules beside it: trainer_state.py, hub.py, verl.py,
wandb_csv.py) build on this module; sources.py picks the reader for a path."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

TRAIN_PREFIX, STEP_KEYS = "train/", ("train/global_step", "global_step", "_step", "step")


class Source(NamedTuple):
    """A run's rows (each with its "step"), in order, and where they came from. The defaults are shared: build new
    lists and dicts, never mutate them."""

    rows: list[dict[str, Any]]
    description: str  # e.g. "metrics.jsonl", "TensorBoard events in runs/Nov25_23-06-20_host"
    skipped_lines: list[int] = []  # metrics.jsonl lines that were not a JSON object
    reader: str = ""  # which reader read it: one of the *_READER names below
    mapped: dict[str, str] = {}  # rule name -> the source's key it was read from, where they differ
    notes: list[str] = []  # what the reader left out or chose, in words (a summary row, a resume, which checkpoint)
    framework: str | None = None  # the framework its metric names were recognised as (frameworks.py), if any


# Source.reader values.
METRICS_READER, TENSORBOARD_READER, WANDB_READER, TRACKIO_READER = "metrics.jsonl", "tensorboard", "wandb", "trackio"
TRAINER_STATE_READER, WANDB_CSV_READER, VERL_LOG_READER, VERL_JSONL_READER = (
    "trainer_state", "wandb_csv", "verl_log", "verl_jsonl"
)  # fmt: skip


def rule_name(key: str) -> str | None:
    """The name the rules read for a tracker key: ``train/reward`` -> ``reward``; ``eval/...`` unchanged; None for
    the step itself and the tracker's own bookkeeping (keys starting with "_")."""
    if key in STEP_KEYS or key.startswith("_"):
        return None
    return key[len(TRAIN_PREFIX) :] if key.startswith(TRAIN_PREFIX) else key


# How W&B's JSON writes the values that JSON has no number for.
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def rows_by_step(items: Iterable[tuple[int, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Rows merged per step, ordered by step, with tracker keys turned into rule names; numbers only."""
    merged: dict[int, dict[str, Any]] = {}
    for step, values in items:
        row = merged.setdefault(int(step), {})
        for key, value in values.items():
            name = rule_name(key)
            if name is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
                row[name] = value
    return [{"step": step, **row} for step, row in sorted(merged.items()) if row]
