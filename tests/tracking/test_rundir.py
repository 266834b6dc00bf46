"""The run directory files: run_config.json, metrics.jsonl, samples.jsonl; reading them back; the run directory's
lock (the whole run's lifetime under it is tests/trainers/test_run_lock.py)."""

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from rlhfkit.tracking.rundir import (
    CONFIG_FILE,
    LOCK_FILE,
    METRICS_FILE,
    RunDirectory,
    RunLock,
    holds_run,
    locked_by,
    locked_message,
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


def test_resume_at_the_last_step_drops_the_summary_row_logged_after_its_checkpoint(tmp_path):
    """A run killed after train()'s summary row (logged after the final checkpoint) and resumed from that checkpoint
    keeps the step's own rows, not the ended call's summary: the resumed call logs its own."""
    run = RunDirectory(tmp_path)
    run.prepare({"lr": 0.1})
    run.append_metrics(1, {"a": 1.0})
    run.append_metrics(2, {"a": 2.0})
    run.append_metrics(2, {"eval/reward": 0.5})
    run.append_metrics(2, {"train_runtime": 3.0, "train_loss": 0.1})
    RunDirectory(tmp_path).prepare({"lr": 0.1}, resume=True, resume_step=2, after_checkpoint=["train_runtime"])
    rows, _ = read_jsonl(tmp_path / METRICS_FILE)
    assert rows == [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}, {"step": 2, "eval/reward": 0.5}]


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


HOLDER = """
import sys, time
from rlhfkit.tracking.rundir import RunLock
lock, holder = RunLock.acquire(sys.argv[1], command="rlhfkit grpo --output_dir shared")
print("locked" if lock is not None else "refused", flush=True)
if lock is not None:
    time.sleep(600)
"""


def holding(output_dir) -> subprocess.Popen:
    """Another process holding output_dir's lock."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(output_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_lock_held_by_another_process_is_refused_naming_its_pid_host_and_command(tmp_path):
    proc = holding(tmp_path)
    try:
        lock, holder = RunLock.acquire(tmp_path)
        assert lock is None and holder["pid"] == proc.pid and holder["host"] == socket.gethostname()
        assert holder["command"] == "rlhfkit grpo --output_dir shared" and holder["started"]
        assert locked_by(tmp_path) == holder
        message = locked_message(tmp_path, holder)
        assert f"process {proc.pid}, started " in message and "command: rlhfkit grpo --output_dir shared" in message
        assert "not this machine" not in message
        assert f"on host gpu-node-7 (not this machine), started {holder['started']}" in locked_message(
            tmp_path, {**holder, "host": "gpu-node-7"}
        )
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_a_dead_holder_never_blocks_the_next_run(tmp_path):
    proc = holding(tmp_path)
    proc.kill()  # SIGKILL on POSIX: no cleanup runs
    proc.wait()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == proc.pid  # its holder file stays...
    assert locked_by(tmp_path) is None  # ... but holds nothing
    lock, holder = RunLock.acquire(tmp_path, command="the next run")
    assert lock is not None and lock.held and holder == {}
    assert json.loads((tmp_path / LOCK_FILE).read_text())["command"] == "the next run"
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists() and not lock.held
    lock.release()  # again: nothing


def test_a_process_supersedes_its_own_lock_and_does_not_see_itself_as_the_holder(tmp_path):
    assert locked_by(tmp_path / "new") is None and not (tmp_path / "new").exists()  # reading creates nothing
    first, _ = RunLock.acquire(tmp_path)
    assert locked_by(tmp_path) is None  # this process's own lock
    second, _ = RunLock.acquire(tmp_path)
    assert not first.held and second.held
    done = subprocess.run([sys.executable, "-c", HOLDER, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "refused"
    del second  # garbage collected: released
    proc = holding(tmp_path)
    proc.kill()
    proc.wait()
