"""A verl run's logged rows, for ``rlhfkit doctor``: the console log or the JSONL of verl's file logger.

verl's trainer hands every step's metrics to each of its loggers (verl/utils/tracking.py, ``trainer.logger``):

- ``console`` prints one line per call (verl/utils/logger/aggregate_logger.py, ``concat_dict_to_str``):
  ``step:N - key:value - key:value ...``, the numbers only; values as ``{v:.3f}`` until mid-2025, since then as
  ``pprint.pformat(v)`` (full precision, ``nan``/``inf``, ``np.float64(0.5)`` for numpy scalars under numpy 2). A run
  under Ray prints it behind the actor's colour-coded prefix, ``(main_task pid=64899) step:0 - ...``, amid the
  config dump, model loading and sample generations; a step logged twice (the initial validation, then the
  training metrics) makes two lines that belong to one row.
- ``file`` (``FileLogger``) writes one JSON object per call, ``{"step": N, "data": {key: value, ...}}``: with
  ``json.dumps`` (NaN and infinities as the literals ``NaN``/``Infinity``) until January 2026, since then with
  orjson, which writes every NaN and infinity as ``null``.

Keys are returned exactly as logged (``critic/score/mean``, ``actor/entropy``); frameworks.map_names turns them into
the names the rules read. A line that is cut off or otherwise unreadable is skipped and its number reported, as for
metrics.jsonl: a crashed or running job leaves a torn last line.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from rlhfkit.health.rows import Source, rows_by_step

SNIFF_BYTES = 256 * 1024  # how much of a file the sniffers read: verl's preamble (config, model loading) fits

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# "step:N" not inside a longer word ("global_step:3", "a/step:3"), followed by its first " - " or the line's end.
STEP_LINE = re.compile(r"(?<![\w/.-])step:(\d+)(?: - (.*?))?\s*$")
NUMPY_SCALAR = re.compile(r"(?:np|numpy)\.\w+\((.*)\)")  # pprint of a numpy scalar under numpy 2: np.float64(0.5)
BOOLEANS = ("True", "False")  # numbers.Number to verl's console logger, but flags, not metrics


def _console_value(text: str) -> float | None:
    """The number a console field's value spells (float() reads nan, inf, -inf, 1e-06), None for True/False;
    ValueError when it is no number."""
    text = text.strip()
    if text in BOOLEANS:
        return None
    numpy_scalar = NUMPY_SCALAR.fullmatch(text)
    return float(numpy_scalar.group(1) if numpy_scalar else text)


def parse_step_line(line: str) -> tuple[int, dict[str, float]] | None:
    """The step and metrics of one console line, None when the line is no step line. A step line whose fields are
    not all ``key:number`` raises ValueError."""
    match = STEP_LINE.search(ANSI.sub("", line))
    if match is None:
        return None
    step, fields = int(match.group(1)), match.group(2)
    values: dict[str, float] = {}
    for field in fields.split(" - ") if fields else ():
        key, colon, text = field.rpartition(":")
        if not colon or not key.strip() or any(c.isspace() for c in key.strip()):
            raise ValueError(f"not a key:value field: {field!r}")
        value = _console_value(text)
        if value is not None:
            values[key.strip()] = value
    return step, values


def read_verl_log(path: str | os.PathLike) -> Source:
    """The rows of verl's console log: every ``step:N - key:value - ...`` line, colour codes and the Ray prefix
    removed, lines of the same step merged. Step lines that cannot be read are skipped and their numbers returned;
    a log with no readable step line is a ValueError."""
    items, skipped, lines = [], [], 0
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        for number, line in enumerate(f, start=1):
            lines = number
            try:
                parsed = parse_step_line(line)
            except ValueError:
                skipped.append(number)
                continue
            if parsed is not None:
                items.append(parsed)
    rows = rows_by_step(items)
    if not rows:
        found = f"{len(skipped)} unreadable step line(s)" if skipped else "no step line"
        raise ValueError(
            f"{os.fspath(path)!r} is not a verl console log: {lines} line(s), {found} (`step:N - key:value - ...`); "
            "pass the output of a verl run with trainer.logger including 'console', or its file logger's JSONL"
        )
    return Source(rows=rows, description=f"verl console log {os.fspath(path)}", skipped_lines=skipped)


def _record_values(data: Mapping[str, Any]) -> dict[str, float]:
    """A record's numbers as floats; null is NaN (orjson writes every NaN and infinity as null); strings, lists,
    booleans and nested objects are left out."""
    values = {}
    for key, value in data.items():
        if value is None:
            values[key] = math.nan
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            values[key] = float(value)
    return values


def _record(line: str) -> tuple[int, dict[str, float]] | None:
    """The step and values of one file-logger line, None when it is not a ``{"step": N, "data": {...}}`` record."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
        return None
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not float(step).is_integer():
        return None
    return int(step), _record_values(record["data"])


def read_verl_jsonl(path: str | os.PathLike) -> Source:
    """The rows of verl's file logger (``trainer.logger=['file']``: one ``{"step": N, "data": {...}}`` per line),
    records of the same step merged. Lines that are not such a record (a torn last line) are skipped and their
    numbers returned; a file with no record is a ValueError."""
    items, skipped, lines = [], [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            lines = number
            if not line.strip():
                continue
            parsed = _record(line)
            if parsed is None:
                skipped.append(number)
            else:
                items.append(parsed)
    rows = rows_by_step(items)
    if not rows:
        raise ValueError(
            f"{os.fspath(path)!r} is not a verl file-logger JSONL: {lines} line(s), {len(skipped)} not a record "
            '({"step": N, "data": {...}}), none with a number; pass the file verl writes with trainer.logger '
            "including 'file' ($VERL_FILE_LOGGER_PATH, or <project>/<experiment>.jsonl), or its console log"
        )
    return Source(rows=rows, description=f"verl file-logger JSONL {os.fspath(path)}", skipped_lines=skipped)


def _head(path: str | os.PathLike) -> str:
    """The first SNIFF_BYTES of a file as text; "" when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(SNIFF_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ""


def looks_like_verl_log(path: str | os.PathLike) -> bool:
    """Whether the file's first SNIFF_BYTES hold a verl console step line with at least one metric."""
    for line in _head(path).splitlines():
        try:
            parsed = parse_step_line(line)
        except ValueError:
            continue
        if parsed is not None and parsed[1]:
            return True
    return False


def looks_like_verl_jsonl(path: str | os.PathLike) -> bool:
    """Whether the file's first non-blank line is a verl file-logger record (``{"step": N, "data": {...}}``)."""
    first = next((line for line in _head(path).splitlines() if line.strip()), "")
    return _record(first) is not None
