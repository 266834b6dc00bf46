"""PPO under `accelerate launch` with two CPU processes: episodes and counts are global, metrics pooled."""

import json

import pytest

from tests.helpers import asset_flags, run_two_processes

pytestmark = pytest.mark.slow  # a 2-process accelerate launch


def test_two_processes_pool_metrics(tiny_assets, tmp_path):
    out = tmp_path / "run"
    command = [
        "ppo",
        *asset_flags(tiny_assets), "--output_dir", str(out), "--report_to", "none",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--num_mini_batches", "2",
        "--num_ppo_epochs", "1", "--total_episodes", "32", "--response_length", "8",
        "--local_rollout_forward_batch_size", "8", "--num_sample_generations", "1", "--save_steps", "0",
    ]  # fmt: skip
    run_two_processes(command, tmp_path)
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    updates = [r for r in rows if "episode" in r]
    # 2 processes x 4 per device x 2 accumulation = 16 rollouts per update; 32 episodes = 2 updates,
    # each logged once (only the main process writes the run directory).
    assert [r["episode"] for r in updates] == [16, 32]
    for r in updates:
        assert 0 <= r["val/num_eos_tokens"] <= 16
        assert r["objective/rlhf_reward"] == pytest.approx(
            r["objective/scores"] + r["objective/non_score_reward"], abs=1e-5
        )
    evals = [r for r in rows if "eval/task_success" in r]
    assert evals and all(0 <= r["eval/task_success"] <= 1 for r in evals)
    # train()'s summary row: its loss pools each update over both processes as loss/total_avg does.
    summary = rows[-1]
    assert summary["step"] == 2 and summary["total_flos"] == 0.0
    losses = [r["loss/total_avg"] for r in updates]
    assert summary["train_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-9, abs=1e-12)
