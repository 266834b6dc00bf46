"""A real PPO run logging to Trackio, W&B and TensorBoard, read back with each tracker's own reader: TRL's keys
(train/<name>, eval/<name>, train/global_step), the completions table, and the older trainer's names."""

import json
import os
import subprocess
import sys

import pytest

from rlhfkit.metrics import registry
from rlhfkit.tracking.logger import tracker_key
from tests.helpers import asset_flags, expand_templates

pytestmark = pytest.mark.slow  # its fixture runs rlhfkit ppo in a subprocess

# A reward model alone: no rewards/<name>/ templates (they come with --reward_funcs).
PPO_SCALARS = {tracker_key(m.name) for m in expand_templates(registry.metrics_for("ppo"), [])}
PPO_SCALARS |= {"train/global_step"}
PPO_HISTOGRAMS = {tracker_key(m.name) for m in registry.metrics_for("ppo", kind="histogram")}
# The older trainer's names (seeds 000/001), sent unprefixed with --log_legacy_names.
OLDER = {alias for m in registry.metrics_for("ppo", kind=None) for alias in m.aliases}
OLDER_SCALARS = {a for m in registry.metrics_for("ppo", kind="scalar") for a in m.aliases}
# Seed 003's openrlbenchmark command: its x-axis and its 16 metrics, as TRL's runs have them in W&B.
OPENRLBENCHMARK = {"train/episode"} | {
    f"train/{name}"
    for name in (
        "objective/rlhf_reward", "objective/scores", "objective/kl", "objective/non_score_reward",
        "objective/entropy", "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg", "loss/value_avg",
        "val/clipfrac_avg", "policy/entropy_avg", "val/ratio", "val/ratio_var", "val/num_eos_tokens", "lr", "eps",
    )
}  # fmt: skip


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
        WANDB_PROJECT="ppo-wandb-project",  # as in TRL, W&B's project comes from here when set
        WANDB_TAGS="tl-dr,rlhfkit",
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
        "--log_legacy_names",
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
    assert set(events.Tags()["scalars"]) == PPO_SCALARS | OLDER_SCALARS
    assert set(events.Tags()["histograms"]) == PPO_HISTOGRAMS | (OLDER - OLDER_SCALARS)
    rows = {json.loads(line)["step"]: json.loads(line) for line in open(out / "metrics.jsonl")}
    for name in ("objective/kl", "objective/scores", "val/ratio", "episode"):
        (event,) = [e for e in events.Scalars(tracker_key(name)) if e.step == 1]
        assert event.value == pytest.approx(rows[1][name], rel=1e-6)
    (event,) = [e for e in events.Scalars("ppo/mean_scores") if e.step == 1]  # an older name, same value
    assert event.value == pytest.approx(rows[1]["objective/scores"], rel=1e-6)
    global_step = events.Scalars("train/global_step")  # with every row, training and eval (step 0 is eval only)
    assert {e.step for e in global_step} == {0, 1, 2} and all(e.value == e.step for e in global_step)
    assert {t.step for t in events.Tensors("completions/text_summary")} == {0, 2}
    assert "episode" in rows[1] and "train/episode" not in rows[1]  # the run directory keeps the bare names


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
    assert OPENRLBENCHMARK | {"train/global_step"} <= keys
    assert PPO_SCALARS | OLDER_SCALARS <= keys
    assert {f"{h}._type" for h in PPO_HISTOGRAMS | (OLDER - OLDER_SCALARS)} <= keys
    assert {"completions._type", "completions/step_000000._type", "completions/step_000002._type"} <= keys
    text = result.stdout
    assert "ppo-wandb-project" in text and "tl-dr" in text  # $WANDB_PROJECT and $WANDB_TAGS, as in TRL
    # Every chart's x-axis is train/global_step, as transformers' WandbCallback sets it.
    metrics = [r for r in records if r["type"] == "metric"]
    assert any(
        m["metric"].get("glob_name") == "*" and m["metric"].get("step_metric") == "train/global_step" for m in metrics
    ), metrics[:3]


def test_trackio_store_has_every_ppo_metric(tracked_run):
    _, env = tracked_run
    code = (
        "import json; from trackio.sqlite_storage import SQLiteStorage as S; "
        "print(json.dumps(S.get_logs('ppo-test', 'tracked'), default=str))"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    logs = json.loads(result.stdout.strip().splitlines()[-1])
    keys = set().union(*(log.keys() for log in logs))
    assert PPO_SCALARS | PPO_HISTOGRAMS | OLDER | {"completions"} <= keys
