"""The run directory files: run_config.json, metrics.jsonl, samples.jsonl; reading them back."""

import json
import math
from pathlib import Path

import numpy as np
import torch

from rlhfkit.tracking.rundir import (
    CONFIG_FILE,
    METRICS_FILE,
    RunDirectory,
    holds_run,
    read_config,
    read_jsonl,
    to_jsonable,
)


def lines(path):
    """Every line as JSON, strictly: what the writer produced, without the tolerant reader."""
    return [json.loads(line) for line in open(path)]


def test_to_jsonable_turns_tensors_and_numpy_into_plain_values():
    value = {"t": torch.tensor(1.5), "a": np.arange(3), "f": np.float32(0.25), "p": Path("/x"), 3: (1, None)}
    assert to_jsonable(value) == {"t": 1.5, "a": [0, 1, 2], "f": 0.25, "p": "/x", "3": [1, None]}


def test_fresh_run_empties_old_records_and_resume_keeps_them(tmp_path):
    run = RunDirectory(tmp_path / "out")
    run.prepare({"lr": 0.1})
    run.append_metrics(1, {"a": 1.0})
    run.append_samples(1, "completions", ["q", "r"], [["x", "y"], ["z", "w"]])
    assert json.loads((tmp_path / "out" / "run_config.json").read_text()) == {"lr": 0.1}
    assert lines(tmp_path / "out" / "metrics.jsonl") == [{"step": 1, "a": 1.0}]
    assert lines(tmp_path / "out" / "samples.jsonl") == [
        {"step": 1, "key": "completions", "q": "x", "r": "y"},
        {"step": 1, "key": "completions", "q": "z", "r": "w"},
    ]

    RunDirectory(tmp_path / "out").prepare({"lr": 0.2}, resume=True)
    assert len(lines(tmp_path / "out" / "metrics.jsonl")) == 1
    RunDirectory(tmp_path / "out").prepare({"lr": 0.3})
    assert lines(tmp_path / "out" / "metrics.jsonl") == []
    assert json.loads((tmp_path / "out" / "run_config.json").read_text()) == {"lr": 0.3}


def test_resume_step_keeps_the_lines_up_to_it_and_drops_a_torn_one(tmp_path):
    run = RunDirectory(tmp_path)
    run.prepare({"lr": 0.1})
    for step in (1, 2, 3):
        run.append_metrics(step, {"a": float(step), "b": math.nan})
    with open(tmp_path / METRICS_FILE, "a") as f:
        f.write('{"step": 4, "a": 4.')  # the line a crash cut short
    RunDirectory(tmp_path).prepare({"lr": 0.1}, resume=True, resume_step=2)
    rows, unreadable = read_jsonl(tmp_path / METRICS_FILE)
    assert [(r["step"], r["a"]) for r in rows] == [(1, 1.0), (2, 2.0)] and unreadable == []
    assert math.isnan(rows[0]["b"])


def test_read_jsonl_skips_blank_lines_and_reports_lines_that_are_not_objects(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"step": 1}\n\n[1, 2]\nnot json\n{"step": 2, "v": NaN}\n{"step": 3, "v": 1.', encoding="utf-8")
    rows, unreadable = read_jsonl(path)
    assert [r["step"] for r in rows] == [1, 2] and math.isnan(rows[1]["v"])
    assert unreadable == [3, 4, 6]


def test_read_config_is_empty_unless_run_config_holds_an_object(tmp_path):
    assert read_config(tmp_path) == {}
    (tmp_path / CONFIG_FILE).write_text('{"run_name": "a"', encoding="utf-8")
    assert read_config(tmp_path) == {}
    (tmp_path / CONFIG_FILE).write_text("[1]", encoding="utf-8")
    assert read_config(tmp_path) == {}
    RunDirectory(tmp_path).prepare({"run_name": "a"})
    assert read_config(tmp_path) == {"run_name": "a"}


def test_holds_run_once_a_step_is_logged_or_a_config_stands_alone(tmp_path):
    assert not holds_run(tmp_path / "missing") and not holds_run(tmp_path)
    run = RunDirectory(tmp_path)
    run.prepare({"lr": 0.1})
    assert not holds_run(tmp_path)  # built, never trained: reusable
    run.append_metrics(1, {"a": 1.0})
    assert holds_run(tmp_path)
    (tmp_path / METRICS_FILE).unlink()
    assert holds_run(tmp_path)  # a config without metrics.jsonl is someone's run
