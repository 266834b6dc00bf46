"""Health checks on real pathological runs of the tiny built-in task (the NaN-reward case is in test_resume.py)."""

import json
import os

from rlhfkit.cli import main
from tests.helpers import asset_flags


def findings(output_dir):
    with open(os.path.join(output_dir, "health.jsonl")) as f:
        return [json.loads(line) for line in f]


def absurd_ppo(assets, out, *flags):
    return [
        "ppo", *asset_flags(assets), "--output_dir", str(out), "--report_to", "none", "--learning_rate", "0.05",
        "--per_device_train_batch_size", "8", "--local_rollout_forward_batch_size", "8", "--response_length", "8",
        "--total_episodes", "64", "--num_ppo_epochs", "4", "--num_sample_generations", "0", "--save_steps", "0",
        *flags,
    ]  # fmt: skip


def test_absurd_learning_rate_trips_the_ratio_and_update_size_rules(tiny_assets, tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["--report_to", "trackio", "--project", "health-test", "--run_name", "absurd"]
    assert main(absurd_ppo(tiny_assets, out, *flags)) == 0  # --health warn (default) reports and goes on
    rules = {f["rule"] for f in findings(out)}
    assert "ratio_far_from_one" in rules
    assert rules & {"updates_too_large", "value_loss_spike", "nonfinite_metric"}
    printed = capsys.readouterr().out
    assert "ratio_far_from_one" in printed and "Try:" in printed
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert max(r["health/warnings"] + r["health/critical"] for r in rows if "episode" in r) >= 1
    # Each finding also went to the tracker's own alert API (shown on the Trackio dashboard, forwarded to webhooks).
    from trackio.sqlite_storage import SQLiteStorage

    alerts = SQLiteStorage.get_alerts("health-test", run_name="absurd")
    assert any("ratio_far_from_one" in alert["title"] for alert in alerts), alerts


def test_health_stop_ends_training_with_a_checkpoint(tiny_assets, tmp_path, capsys):
    out = tmp_path / "run"
    # Thresholds are configurable: here a ratio outside [0.67, 1.5] already counts as critical.
    strict = "ratio_warning_low=0.8,ratio_warning_high=1.25,ratio_critical_low=0.67,ratio_critical_high=1.5"
    code = main(absurd_ppo(tiny_assets, out, "--health", "stop", "--health_thresholds", strict))
    err = capsys.readouterr().err
    assert code == 3, err
    assert "stopped at step" in err and "--health stop" in err and "rlhfkit doctor" in err
    step = max(f["step"] for f in findings(out) if f["severity"] == "critical")
    checkpoint = out / f"checkpoint-{step}"
    assert (checkpoint / "trainer_state.json").is_file() and (checkpoint / "model.safetensors").is_file()
    assert not (out / "model.safetensors").exists()  # it did not run to the end
    # The doctor sees the same critical finding after the fact.
    assert main(["doctor", str(out), "--health_thresholds", strict]) == 1
