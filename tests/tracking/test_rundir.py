"""The run directory files: run_config.json, metrics.jsonl, samples.jsonl."""

import json
from pathlib import Path

import numpy as np
import torch

from rlhfkit.tracking.rundir import RunDirectory, to_jsonable


def read_jsonl(path):
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
    assert read_jsonl(tmp_path / "out" / "metrics.jsonl") == [{"step": 1, "a": 1.0}]
    assert read_jsonl(tmp_path / "out" / "samples.jsonl") == [
        {"step": 1, "key": "completions", "q": "x", "r": "y"},
        {"step": 1, "key": "completions", "q": "z", "r": "w"},
    ]

    RunDirectory(tmp_path / "out").prepare({"lr": 0.2}, resume=True)
    assert len(read_jsonl(tmp_path / "out" / "metrics.jsonl")) == 1
    RunDirectory(tmp_path / "out").prepare({"lr": 0.3})
    assert read_jsonl(tmp_path / "out" / "metrics.jsonl") == []
    assert json.loads((tmp_path / "out" / "run_config.json").read_text()) == {"lr": 0.3}
