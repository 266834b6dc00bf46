"""A W&B run's history exported as CSV, read as the rows the health rules replay; stdlib csv only.

Two exports are read: the run's history table (``run.history().to_csv(...)`` or ``scan_history`` written out: one
row per logged step, a column per key, W&B's ``_step``/``_runtime``/``_timestamp`` beside transformers'
``train/global_step``), and a chart panel's "Export CSV" of one run (``Step``, ``<run> - train/reward``,
``<run> - train/reward__MIN``, ``__MAX``: the run's prefix comes off, the min/max columns are left out).

The step is the first of these columns present: ``train/global_step``, ``global_step``, ``_step``, ``step``,
``Step`` (transformers' global step before W&B's own count of log calls, as for a .wandb file). Keys are the
trackers': ``train/reward`` is read as ``reward`` (sources.rows_by_step). An empty cell is a missing value; "NaN",
"inf", "-inf", "Infinity" are non-finite floats (kept, for the ``nonfinite_metric`` rule); other text is not a
number and is left out.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from rlhfkit.health.rows import STEP_KEYS, WANDB_CSV_READER, Source, rows_by_step

STEP_COLUMNS = (*STEP_KEYS, "Step")
AGGREGATE_SUFFIXES = ("__MIN", "__MAX")  # a chart panel's export: the min and max beside each plotted value
RUN_SEPARATOR = " - "  # a chart panel's export: "<run name> - <key>"


def cell_value(cell: str) -> float | None:
    """The number in a CSV cell; None for an empty cell or text that is not a number (float() reads "NaN", "inf",
    "-Infinity", ...)."""
    cell = cell.strip()
    if not cell:
        return None
    try:
        return float(cell)
    except ValueError:
        return None


def column_names(header: list[str], where: str) -> list[str | None]:
    """The keys of a CSV header: a chart panel's run prefix taken off, its __MIN/__MAX columns (and unnamed ones,
    such as pandas' index) None. ValueError when the columns belong to several runs."""
    names = [name.strip() for name in header]
    values = [name for name in names if name and name not in STEP_COLUMNS]
    runs = {name.split(RUN_SEPARATOR, 1)[0] for name in values if RUN_SEPARATOR in name}
    if values and len(runs) > 1 and all(RUN_SEPARATOR in name for name in values):
        raise ValueError(
            f"{where} holds the columns of {len(runs)} runs ({', '.join(sorted(runs))}): export one run's history"
        )
    if len(runs) == 1 and all(RUN_SEPARATOR in name for name in values):
        names = [name.split(RUN_SEPARATOR, 1)[1] if RUN_SEPARATOR in name else name for name in names]
    return [None if not name or name.endswith(AGGREGATE_SUFFIXES) else name for name in names]


def read_wandb_csv(path: Path) -> Source:
    """The rows of a W&B history CSV (module docstring). ValueError names what is missing: a header, a step column,
    any row with a step."""
    where = f"{str(path)!r}"
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            records = list(csv.reader(f))
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not a text CSV file: pass a W&B history exported as CSV") from None
    except csv.Error as e:
        raise ValueError(f"{where} is not readable as CSV ({e}): pass a W&B history exported as CSV") from None
    if not records:
        raise ValueError(f"{where} is empty: pass a W&B history exported as CSV (a header, then a row per step)")
    columns = column_names(records[0], where)
    step_column = next((name for name in STEP_COLUMNS if name in columns), None)
    if step_column is None:
        shown = ", ".join(name for name in columns if name) or "none"
        raise ValueError(
            f"{where} has no step column ({', '.join(STEP_COLUMNS)}; columns found: {shown}): export the history "
            "with its _step or train/global_step column"
        )
    items: list[tuple[int, dict[str, Any]]] = []
    without_step = 0
    for record in records[1:]:
        values = {
            name: value for name, cell in zip(columns, record) if name and (value := cell_value(cell)) is not None
        }
        step = values.pop(step_column, None)
        if step is None or not math.isfinite(step):
            without_step += 1 if any(cell.strip() for cell in record) else 0
            continue
        items.append((int(step), values))
    if not items:
        raise ValueError(f"{where} has no row with a number in its step column {step_column!r}")
    notes = [f"steps from the {step_column!r} column"]
    if without_step:
        notes.append(f"{without_step} row(s) without a step left out")
    return Source(rows_by_step(items), f"W&B history CSV {path}", reader=WANDB_CSV_READER, notes=notes)
