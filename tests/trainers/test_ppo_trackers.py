"""A real PPO run logging to Trackio, W&B and TensorBoard, read back with each tracker's own reader."""

import json
import os
import subprocess
import sys

import pytest

from rlhfkit.metrics import registry
from tests.helpers import asset_flags

PPO_SCALARS = {m.name for m in registry.metrics_for("ppo", kind="scalar")}
PPO_HISTOGRAMS = {m.name for m in registry.metrics_for("ppo", kind="histogram")}


@pytest.fixture(scope="module")
def tracked_run(tiny_assets, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ppo-trackers")
    env = dict(
        os.environ,
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CACHE_DIR=str(tmp / "wandb-cache"),
        WANDB_DATA_DIR=str(tmp / "wandb-data"),
        WANDB_CONFIG_DIR=str(tmp / "wandb-config"),
        TRACKIO_DIR=str(tmp / "trackio"),
    )
    out = tmp / "run"
    cmd = [
        sys.executable,
        "-m",
        "rlhfkit.cli",
        "ppo",
        *asset_flags(tiny_assets),
        "--output_dir",
        str(out),
        "--run_name",
        "tracked",
        "--project",
        "ppo-test",
        "--report_to",
        "trackio",
        "wandb",
        "tensorboard",
        "--per_device_train_batch_size",
        "8",
        "--num_ppo_epochs",
        "1",
        "--total_episodes",
        "16",
        "--response_length",
        "8",
        "--num_sample_generations",
        "1",
        "--save_steps",
        "0",
    ]
    result = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, env


def test_tensorboard_has_every_ppo_metric(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = tracked_run
    events = EventAccumulator(
        str(out / "runs" / "tracked"), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0}
    )
    events.Reload()
    assert set(events.Tags()["scalars"]) == PPO_SCALARS
    assert set(events.Tags()["histograms"]) == PPO_HISTOGRAMS
    rows = {json.loads(line)["step"]: json.loads(line) for line in open(out / "metrics.jsonl")}
    for name in ("objective/kl", "objective/scores", "val/ratio", "episode"):
        (event,) = [e for e in events.Scalars(name) if e.step == 1]
        assert event.value == pytest.approx(rows[1][name], rel=1e-6)
    assert {t.step for t in events.Tensors("completions/text_summary")} == {0, 2}


def test_wandb_offline_run_has_every_ppo_metric(tracked_run):
    out, env = tracked_run
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    keys = set().union(*(r["history"]["item"].keys() for r in records if r["type"] == "history"))
    assert PPO_SCALARS <= keys
    assert {f"{h}._type" for h in PPO_HISTOGRAMS} <= keys
    assert {"completions/step_000000._type", "completions/step_000002._type"} <= keys


def test_trackio_store_has_every_ppo_metric(tracked_run):
    _, env = tracked_run
    code = (
        "import json; from trackio.sqlite_storage import SQLiteStorage as S; "
        "print(json.dumps(S.get_logs('ppo-test', 'tracked'), default=str))"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    logs = json.loads(result.stdout.strip().splitlines()[-1])
    keys = set().union(*(log.keys() for log in logs))
    assert PPO_SCALARS | PPO_HISTOGRAMS | {"completions"} <= keys
