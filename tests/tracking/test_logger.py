"""RunLogger: the run directory in-process, and real Trackio, W&B and TensorBoard runs read back with
each tracker's own reader (TensorBoard's EventAccumulator, `wandb leet inspect` on the offline
transaction log, trackio's SQLiteStorage)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate import Accelerator

from rlhfkit.tracking.logger import RunLogger, tracker_key

ROOT = Path(__file__).resolve().parents[2]
DEMO = Path(__file__).with_name("demo_run.py")


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


def test_run_directory_and_console_without_trackers(tmp_path, capsys):
    out = tmp_path / "run"
    config = {"learning_rate": 3e-6, "report_to": [], "nested": {"kl_coef": 0.05}}
    logger = RunLogger(Accelerator(), out, config, project="p", run_name="r", report_to="none")
    logger.log({"objective/kl": torch.tensor(0.5), "episode": np.int64(64), "val/ratio": np.float32(1.0)}, step=1)
    logger.log({"objective/kl": 0.25}, step=2)
    logger.log_histograms({"env/reward_dist": np.arange(4.0)}, step=2)  # no tracker: nothing to do
    logger.log_table("completions", ["query", "model response", "score"], [["1+1=", "2[EOS]", np.float64(0.5)]], 2)
    logger.progress(2, 10, {"objective/rlhf_reward": 1.25, "val/ratio": 1.0, "eps": 3.5, "lr": 0.1})
    logger.finish()

    assert json.loads((out / "run_config.json").read_text()) == config
    assert read_jsonl(out / "metrics.jsonl") == [
        {"step": 1, "objective/kl": 0.5, "episode": 64, "val/ratio": 1.0},
        {"step": 2, "objective/kl": 0.25},
    ]
    assert read_jsonl(out / "samples.jsonl") == [
        {"step": 2, "key": "completions", "query": "1+1=", "model response": "2[EOS]", "score": 0.5}
    ]
    printed = capsys.readouterr().out
    assert "completions (step 2)" in printed and "2[EOS]" in printed
    assert "update 2/10 | episode 0 | eps 3.5 | objective/rlhf_reward 1.25" in printed


def test_report_to_must_match_the_accelerator_trackers(tmp_path):
    with pytest.raises(ValueError, match="make_trackers"):
        RunLogger(Accelerator(), tmp_path, {}, project="p", run_name="r", report_to=["tensorboard"])


def test_extra_columns_go_where_asked_and_never_replace_or_misalign_a_column(tmp_path):
    logger = RunLogger(Accelerator(), tmp_path, {}, project="p", run_name="r", report_to=None)
    columns, rows = ["prompt", "completion", "advantage"], [["a", "b", 0.5], ["c", "d", -0.5]]
    logger.log_table("completions", columns, rows, 1, extra_columns={"judge": [True, None]}, extra_before="advantage")
    logger.log_table("completions", columns, rows, 2, extra_columns={"len": np.array([1, 2])})  # after the last
    samples = read_jsonl(tmp_path / "samples.jsonl")
    assert [list(s) for s in samples] == [
        ["step", "key", "prompt", "completion", "judge", "advantage"],
        ["step", "key", "prompt", "completion", "judge", "advantage"],
        ["step", "key", "prompt", "completion", "advantage", "len"],
        ["step", "key", "prompt", "completion", "advantage", "len"],
    ]
    assert [s.get("judge", s.get("len")) for s in samples] == [True, None, 1, 2]
    with pytest.raises(ValueError, match="extra column 'advantage' is already a column"):
        logger.log_table("completions", columns, rows, 3, extra_columns={"advantage": [1, 2]})
    with pytest.raises(ValueError, match="extra column 'judge' has 1 values for 2 rows"):
        logger.log_table("completions", columns, rows, 3, extra_columns={"judge": [1]})
    with pytest.raises(ValueError, match="reserved"):
        logger.log_table("completions", columns, rows, 3, extra_columns={"step": [1, 2]})
    with pytest.raises(ValueError, match="column 'prompt' twice"):
        logger.log_table("completions", ["prompt", "prompt"], [["a", "b"]], 3)
    assert len(read_jsonl(tmp_path / "samples.jsonl")) == 4  # nothing written by the refused tables


def test_table_rows_must_match_the_columns(tmp_path):
    logger = RunLogger(Accelerator(), tmp_path, {}, project="p", run_name="r", report_to=None)
    with pytest.raises(ValueError, match="2 cells"):
        logger.log_table("completions", ["query", "score"], [["only one"]], 1)
    with pytest.raises(ValueError, match="reserved"):
        logger.log_table("completions", ["step", "score"], [[1, 2]], 1)


# ------------------------------------------------------------------------------------------------
# Real trackers
# ------------------------------------------------------------------------------------------------

COLUMNS = ["query", "model response", "score"]
STEPS = [
    {
        "step": 1,
        "scalars": {"objective/kl": 0.5, "episode": 8.0},
        "histograms": {"env/reward_dist": [1.0, 2.0, 3.0, 4.0, float("nan")]},  # NaN cannot be binned: dropped
        "table": {"key": "completions", "columns": COLUMNS, "rows": [["1+1=", "2 | [PAD]\nx", 0.5]]},
    },
    {
        "step": 2,
        "scalars": {"objective/kl": 0.75, "episode": 16.0},
        "histograms": {"env/reward_dist": [2.0, 3.0, 4.0, 5.0, 6.0]},
        "table": {
            "key": "completions",
            "columns": COLUMNS,
            "rows": [["2+2=", "4", 1.5], ["3+3=", "5", -1.0]],
            # What reward functions logged with log_extra: any JSON-able value, None where a row has none, types
            # mixed within a column.
            "extra": {"verdict": ["right", None], "detail": [{"n": 1}, 2]},
            "extra_before": "score",
        },
    },
]


def full_table(table: dict) -> tuple[list, list]:
    """The columns and rows a tracker shows for a table of STEPS: its extra columns before `extra_before`."""
    if "extra" not in table:
        return table["columns"], table["rows"]
    at = table["columns"].index(table["extra_before"])
    extra = list(table["extra"].values())
    rows = [[*row[:at], *(c[i] for c in extra), *row[at:]] for i, row in enumerate(table["rows"])]
    return [*table["columns"][:at], *table["extra"], *table["columns"][at:]], rows


CONFIG = {"learning_rate": 0.001, "report_to": ["wandb"], "nested": {"kl_coef": 0.05, "stop": None}}
FLAT_CONFIG = {"learning_rate": 0.001, "report_to": '["wandb"]', "nested/kl_coef": 0.05, "nested/stop": "None"}


def finite(values):
    return [v for v in values if math.isfinite(v)]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """Run tests/tracking/demo_run.py once in a fresh process with all three trackers."""
    tmp = tmp_path_factory.mktemp("trackers")
    spec = {
        "output_dir": str(tmp / "out"),
        "project": "rlhfkit-test",
        "run_name": "demo",
        "report_to": ["tensorboard", "wandb", "trackio"],
        "config": CONFIG,
        "steps": STEPS,
    }
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        HF_HUB_OFFLINE="1",
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CACHE_DIR=str(tmp / "wandb-cache"),
        WANDB_DATA_DIR=str(tmp / "wandb-data"),
        WANDB_CONFIG_DIR=str(tmp / "wandb-config"),
        TRACKIO_DIR=str(tmp / "trackio"),
    )
    result = subprocess.run(
        [sys.executable, str(DEMO), str(tmp / "spec.json")], cwd=tmp, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return tmp / "out", env, result.stdout


@pytest.mark.slow
def test_real_run_directory(demo_run):
    out, _, stdout = demo_run
    assert read_jsonl(out / "metrics.jsonl") == [{"step": e["step"], **e["scalars"]} for e in STEPS]
    assert read_jsonl(out / "samples.jsonl") == [
        {"step": e["step"], "key": "completions", **dict(zip(full_table(e["table"])[0], row))}
        for e in STEPS
        for row in full_table(e["table"])[1]
    ]
    assert list(read_jsonl(out / "samples.jsonl")[-1]) == ["step", "key", "query", "model response", "verdict"] + [
        "detail",
        "score",
    ]
    assert json.loads((out / "run_config.json").read_text()) == CONFIG
    assert "completions (step 2)" in stdout and "wandb sync" in stdout


@pytest.mark.slow
def test_tensorboard_reads_back(demo_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _, _ = demo_run
    events = EventAccumulator(str(out / "runs" / "demo"), size_guidance={"tensors": 0, "histograms": 0})
    events.Reload()
    for name in STEPS[0]["scalars"]:  # under TRL's keys: train/<name>
        expected = [(s["step"], s["scalars"][name]) for s in STEPS]
        assert [(e.step, e.value) for e in events.Scalars(tracker_key(name))] == expected
    assert [(e.step, e.value) for e in events.Scalars("train/global_step")] == [(s["step"], s["step"]) for s in STEPS]
    for event, entry in zip(events.Histograms("train/env/reward_dist"), STEPS):
        values = finite(entry["histograms"]["env/reward_dist"])
        h = event.histogram_value
        assert event.step == entry["step"]
        assert (h.num, h.sum, h.min, h.max) == (len(values), sum(values), min(values), max(values))
    texts = events.Tensors("completions/text_summary")
    assert [t.step for t in texts] == [1, 2]
    markdown = texts[0].tensor_proto.string_val[0].decode()
    assert markdown.splitlines() == [
        "| query | model response | score |",
        "|---|---|---|",
        "| 1+1= | 2 \\| [PAD]<br>x | 0.5 |",
    ]
    assert texts[1].tensor_proto.string_val[0].decode().splitlines() == [
        "| query | model response | verdict | detail | score |",
        "|---|---|---|---|---|",
        "| 2+2= | 4 | right | {'n': 1} | 1.5 |",
        "| 3+3= | 5 | None | 2 | -1 |",
    ]


@pytest.mark.slow
def test_wandb_offline_run_reads_back(demo_run):
    out, env, _ = demo_run
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    # wandb's own reader of the .wandb transaction log.
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    run = next(r["run"] for r in records if r["type"] == "run")
    assert (run["project"], run["display_name"]) == ("rlhfkit-test", "demo")
    config = {}
    for r in records:
        if r["type"] == "config":
            config.update(r["config"].get("update", {}))
    assert {k: config[k] for k in FLAT_CONFIG} == FLAT_CONFIG

    history = {r["history"]["item"]["_step"]: r["history"]["item"] for r in records if r["type"] == "history"}
    assert sorted(history) == [1, 2]
    for entry in STEPS:
        row = history[entry["step"]]
        for name, value in entry["scalars"].items():
            assert row[tracker_key(name)] == value
        assert row["train/global_step"] == entry["step"]
        values = finite(entry["histograms"]["env/reward_dist"])
        assert row["train/env/reward_dist._type"] == "histogram"
        assert sum(row["train/env/reward_dist.values"]) == len(values)
        bins = row["train/env/reward_dist.bins"]
        assert (bins[0], bins[-1]) == (min(values), max(values))
        # The table under TRL's key, and one per step, so every step's samples stay visible in W&B.
        for key in ("completions", f"completions/step_{entry['step']:06d}"):
            assert row[f"{key}._type"] == "table-file"
            table = json.loads((run_dir / "files" / row[f"{key}.path"]).read_text())
            columns, rows = full_table(entry["table"])
            assert table["columns"] == columns and table["data"] == rows


@pytest.mark.slow
def test_trackio_store_reads_back(demo_run):
    _, env, _ = demo_run
    # trackio fixes its storage directory at import, so read its store in a process that imports it
    # under the test's TRACKIO_DIR.
    code = (
        "import json; from trackio.sqlite_storage import SQLiteStorage as S; "
        "print(json.dumps({'runs': S.get_runs('rlhfkit-test'), 'logs': S.get_logs('rlhfkit-test', 'demo'), "
        "'config': S.get_run_config('rlhfkit-test', 'demo')}))"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    store = json.loads(result.stdout.strip().splitlines()[-1])
    assert store["runs"] == ["demo"]
    assert {k: store["config"][k] for k in FLAT_CONFIG} == FLAT_CONFIG
    assert "allow_val_change" not in store["config"]

    logs = store["logs"]
    for entry in STEPS:
        at_step = [log for log in logs if log["step"] == entry["step"]]
        scalars = {
            k: v for log in at_step for k, v in log.items() if k.startswith("train/") and not isinstance(v, dict)
        }
        assert scalars == {
            **{tracker_key(k): v for k, v in entry["scalars"].items()},
            "train/global_step": entry["step"],
        }
        (hist,) = [log["train/env/reward_dist"] for log in at_step if "train/env/reward_dist" in log]
        values = finite(entry["histograms"]["env/reward_dist"])
        assert hist["_type"] == "trackio.histogram" and sum(hist["values"]) == len(values)
        assert (hist["bins"][0], hist["bins"][-1]) == (min(values), max(values))
        # Trackio keeps every step's table under the same key.
        (table,) = [log["completions"] for log in at_step if "completions" in log]
        assert table["_type"] == "trackio.table"
        columns, rows = full_table(entry["table"])
        assert table["_value"] == [dict(zip(columns, row)) for row in rows]


def test_tensorboard_s_writer_thread_fails_quietly_and_raises_in_the_writing_thread(capfd):
    import threading
    import time

    from tensorboard.summary.writer.event_file_writer import _AsyncWriter

    from rlhfkit.tracking.logger import quiet_tensorboard_writer_threads

    class FullDisk:
        def write(self, data):
            raise OSError(28, "No space left on device")

        def flush(self):
            pass

        def close(self):
            pass

    previous = threading.excepthook
    try:
        quiet_tensorboard_writer_threads()
        quiet_tensorboard_writer_threads()  # once per process: no hook around the hook
        assert threading.excepthook.quiets_tensorboard and threading.excepthook is not previous
        writer = _AsyncWriter(FullDisk(), flush_secs=3600)
        writer.write(b"event")
        deadline = time.time() + 10
        while writer._worker.exception is None and time.time() < deadline:
            time.sleep(0.01)
        with pytest.raises(OSError, match="No space left"):  # where RunLogger._guarded reports it and drops it
            writer.write(b"next")
        assert "Exception in thread" not in capfd.readouterr().err
    finally:
        threading.excepthook = previous


def test_tracker_keys_are_the_ones_transformers_callbacks_send():
    # transformers' rewrite_logs: eval_* -> eval/*, test_* -> test/*, everything else under train/
    assert [tracker_key(name) for name in ("reward", "eval/reward", "test/reward", "train_loss")] == [
        "train/reward",
        "eval/reward",
        "test/reward",
        "train/train_loss",
    ]
