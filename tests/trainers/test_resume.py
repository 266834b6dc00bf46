"""Resuming exactly: a run stopped at a checkpoint and resumed gives the same metrics and weights as a run that
never stopped; a real SIGINT saves a checkpoint and says how to resume; a failing tracker is dropped, not fatal."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.errors import ConfigError
from rlhfkit.trainers.build import build_grpo_trainer, build_ppo_trainer
from tests.helpers import MACHINE_METRICS, asset_flags
from tests.trainers.test_grpo import grpo_config
from tests.trainers.test_ppo import small_config

# the only numbers allowed to differ
WALL_CLOCK = {"eps", "time/rollout", "time/optimization", "step_time"} | MACHINE_METRICS
# ...besides those of the summary row that ends a train() call: they describe the call, and a resumed one is shorter
# (train_loss is the mean over its own steps, as transformers' Trainer counts them).
PER_CALL = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"}


def rows_of(output_dir):
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK | PER_CALL} for line in f]


def weights(output_dir, name="model.safetensors"):
    return load_file(os.path.join(output_dir, name))


def resume_from(run_dir, checkpoint_step, tmp_path, make_config, build):
    """Copy a finished run as it stood when checkpoint-<step> was written plus the rows logged after it (as after
    a crash), resume it, and return the resumed run's directory."""
    copy = crashed_copy(run_dir, checkpoint_step, tmp_path)
    args = make_config(copy, resume_from_checkpoint="latest")
    build(args, set()).train()
    return copy


def crashed_copy(run_dir, checkpoint_step, tmp_path):
    """A copy of a finished run as it stood after a crash just after checkpoint-<step> and the rows logged after it."""
    copy = tmp_path / "resumed"
    shutil.copytree(run_dir, copy)
    for name in os.listdir(copy):  # the final model and later checkpoints did not exist yet
        later = name.startswith("checkpoint-") and name != f"checkpoint-{checkpoint_step}"
        final = ("model.safetensors", "value_model", "ref_model", "adapter_model.safetensors", "adapter_config.json")
        if later or name in final:
            path = copy / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return copy


def assert_same_run(original, resumed, model_files):
    assert rows_of(resumed) == rows_of(original)
    for name in model_files:
        a, b = weights(original, name), weights(resumed, name)
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)


@pytest.mark.parametrize("logging_steps, logged", [(1, [1, 2, 3, 4]), (3, [3, 4])])
def test_ppo_resumes_exactly(tiny_assets, tmp_path, logging_steps, logged):
    def make_config(out, **extra):
        return small_config(
            tiny_assets, tmp_path, output_dir=str(out), total_episodes=64, save_steps=2, kl_target=0.5,
            logging_steps=logging_steps, **extra,
        )  # fmt: skip
        # 4 updates of 16; the adaptive KL coefficient is part of the state, and with logging_steps 3 so is the
        # logging window of updates 1-3, half done at the checkpoint after update 2

    original = tmp_path / "original"
    build_ppo_trainer(make_config(original)).train()
    resumed = resume_from(original, 2, tmp_path, make_config, build_ppo_trainer)
    assert [r["step"] for r in rows_of(resumed) if "episode" in r] == logged
    assert_same_run(original, resumed, ["model.safetensors", "value_model/model.safetensors"])


def test_grpo_resumes_exactly_mid_batch_and_mid_window(tiny_assets, tmp_path):
    def make_config(out, **extra):
        # Checkpoint after step 3: the batch generated at step 3 still serves step 4 (num_iterations=2), and the
        # logging window of steps 3-4 is half done (logging_steps=2).
        return grpo_config(
            tiny_assets, tmp_path, output_dir=str(out), max_steps=6, num_iterations=2, logging_steps=2, save_steps=3,
            beta=0.04, num_sample_generations=2, **extra,
        )  # fmt: skip

    original = tmp_path / "original"
    build_grpo_trainer(make_config(original), set()).train()
    resumed = resume_from(original, 3, tmp_path, make_config, build_grpo_trainer)
    assert [r["step"] for r in rows_of(resumed) if "loss" in r] == [2, 4, 6]
    assert_same_run(original, resumed, ["model.safetensors"])


def test_train_resumes_the_checkpoint_it_names_on_a_trainer_built_for_a_fresh_run(tiny_assets, tmp_path):
    # transformers' way: build the trainer as for a new run, then train(resume_from_checkpoint=<a checkpoint's path>).
    def make_config(out, **extra):
        return grpo_config(
            tiny_assets, tmp_path, output_dir=str(out), max_steps=4, num_iterations=2, logging_steps=2, save_steps=1,
            **extra,
        )  # fmt: skip

    original = tmp_path / "original"
    build_grpo_trainer(make_config(original), set()).train()
    copy = crashed_copy(original, 2, tmp_path)
    trainer = build_grpo_trainer(make_config(copy), set())  # no resume_from_checkpoint in its config
    assert trainer.state.global_step == 0  # nothing restored until train(), as in transformers
    output = trainer.train(resume_from_checkpoint=str(copy / "checkpoint-2"))
    assert output.global_step == 4 and trainer.args.resume_from_checkpoint == str(copy / "checkpoint-2")
    assert [r["step"] for r in rows_of(copy) if "loss" in r] == [2, 4]
    assert_same_run(original, copy, ["model.safetensors"])


def test_a_fresh_trainer_on_a_finished_run_is_refused_when_it_trains(tiny_assets, tmp_path):
    out = tmp_path / "run"
    build_grpo_trainer(grpo_config(tiny_assets, tmp_path, output_dir=str(out), max_steps=1), set()).train()
    before = (out / "metrics.jsonl").read_text()
    trainer = build_grpo_trainer(grpo_config(tiny_assets, tmp_path, output_dir=str(out), max_steps=2), set())
    with pytest.raises(ConfigError, match="already holds a run"):
        trainer.train()
    trainer.end()
    assert (out / "metrics.jsonl").read_text() == before and not (out / ".rlhfkit.lock").exists()


def test_grpo_resumes_exactly_mid_generation_with_a_synced_reference(tiny_assets, tmp_path):
    def make_config(out, **extra):
        # A generation serves 4 steps (steps_per_generation 4, one micro-batch per step): the checkpoint after step 3
        # holds a generation with one micro-batch left; the reference, synced after step 2, is saved with it.
        return grpo_config(
            tiny_assets, tmp_path, output_dir=str(out), max_steps=6, per_device_train_batch_size=2, num_generations=4,
            gradient_accumulation_steps=1, steps_per_generation=4, save_steps=3, beta=0.04, sync_ref_model=True,
            ref_model_sync_steps=2, **extra,
        )  # fmt: skip

    original = tmp_path / "original"
    build_grpo_trainer(make_config(original), set()).train()
    resumed = resume_from(original, 3, tmp_path, make_config, build_grpo_trainer)
    assert_same_run(original, resumed, ["model.safetensors", "ref_model/model.safetensors"])


def test_ppo_with_lora_resumes_exactly(tiny_assets, tmp_path):
    """The checkpoint holds the policy's and the value model's adapters (and the value head); resuming loads them
    into the same adapters and continues exactly: the same metrics and the same final adapters."""
    pytest.importorskip("peft")

    def make_config(out, **extra):
        return small_config(
            tiny_assets, tmp_path, output_dir=str(out), total_episodes=64, save_steps=2, use_peft=True, lora_r=4,
            **extra,
        )  # fmt: skip

    original = tmp_path / "original"
    build_ppo_trainer(make_config(original)).train()
    resumed = resume_from(original, 2, tmp_path, make_config, build_ppo_trainer)
    assert [r["step"] for r in rows_of(resumed) if "episode" in r] == [1, 2, 3, 4]
    assert not (original / "checkpoint-2" / "model.safetensors").exists()  # adapters only
    assert_same_run(original, resumed, ["adapter_model.safetensors", "value_model/adapter_model.safetensors"])


def test_grpo_with_lora_resumes_exactly_mid_batch(tiny_assets, tmp_path):
    pytest.importorskip("peft")

    def make_config(out, **extra):
        return grpo_config(
            tiny_assets, tmp_path, output_dir=str(out), max_steps=4, num_iterations=2, save_steps=3, beta=0.04,
            use_peft=True, **extra,
        )  # fmt: skip

    original = tmp_path / "original"
    build_grpo_trainer(make_config(original), set()).train()
    resumed = resume_from(original, 3, tmp_path, make_config, build_grpo_trainer)
    assert [r["step"] for r in rows_of(resumed) if "loss" in r] == [1, 2, 3, 4]
    assert_same_run(original, resumed, ["adapter_model.safetensors"])


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_and_the_run_resumes(tiny_assets, tmp_path):
    out = tmp_path / "run"
    flags = [
        *asset_flags(tiny_assets), "--output_dir", str(out), "--report_to", "none", "--total_episodes", "2000",
        "--per_device_train_batch_size", "8", "--local_rollout_forward_batch_size", "8", "--response_length", "8",
        "--num_ppo_epochs", "1", "--num_sample_generations", "0", "--save_steps", "0",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "rlhfkit.cli", "ppo", *flags]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Interrupted by SIGINT" in stderr and "--resume_from_checkpoint latest" in stderr
    assert "Traceback" not in stderr
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    checkpoint = out / f"checkpoint-{steps[-1]}"
    assert (checkpoint / "trainer_state.json").is_file() and (checkpoint / "model.safetensors").is_file()

    # Resume with the command the message gives, shortened to finish soon: the run continues where it stopped. A
    # shorter run changes the learning-rate schedule, so the resume says so with --allow_config_change.
    total = (steps[-1] + 2) * 8
    resume = [*cmd, "--resume_from_checkpoint", "latest", "--total_episodes", str(total)]
    refused = subprocess.run(resume, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and f"total_episodes: 2000 -> {total}" in refused.stderr, refused.stderr[-3000:]
    done = subprocess.run(
        [*resume, "--allow_config_change"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows_after = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps_after = [row["step"] for row in rows_after if "episode" in row]  # not the resumed train()'s summary row
    assert steps_after == list(range(1, steps[-1] + 3))  # each step exactly once
    parts = [json.loads(line) for line in (out / "run_config_history.jsonl").read_text().splitlines()]
    assert [(p["part"], p["start_step"]) for p in parts] == [(1, 0), (2, steps[-1])]
    assert parts[1]["changed"]["total_episodes"] == {"from": 2000, "to": total}
    assert parts[1]["allowed_by_flag"] == ["total_episodes"]
    assert not (out / ".rlhfkit.lock").exists()  # released as the run ended


def test_a_failing_tracker_is_dropped_and_training_goes_on(tiny_assets, tmp_path, capsys):
    args = small_config(tiny_assets, tmp_path, report_to=["tensorboard", "trackio"], total_episodes=48)
    trainer = build_ppo_trainer(args)
    trainer.run.begin()  # the trackers start when the run begins (train() would)
    writer = trainer.accelerator.get_tracker("tensorboard", unwrap=True)
    calls = []

    def disk_full(*a, **k):
        calls.append(1)
        raise OSError(28, "No space left on device")

    writer.add_scalar = disk_full
    trainer.train()
    printed = capsys.readouterr().out
    assert printed.count("the tensorboard tracker failed") == 1 and "No space left on device" in printed
    assert len(calls) == 1  # dropped after the first failure
    assert [r["step"] for r in rows_of(args.output_dir) if "episode" in r] == [1, 2, 3]
    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs(args.project, args.run_name)
    assert sorted({row["step"] for row in logs if "train/episode" in row}) == [1, 2, 3]


@pytest.mark.parametrize("limit", [2])
def test_nonfinite_losses_skip_steps_then_stop_with_a_checkpoint(tiny_assets, tmp_path, limit):
    """Rewards that overflow make the loss NaN: the NaN health rule fires, the steps are skipped, then training stops.
    (A reward function's own NaN means "not applicable", as None: tests/rewards/test_calling.py.)"""
    from rlhfkit.errors import NonFiniteStop

    args = grpo_config(
        tiny_assets, tmp_path, reward_funcs=["tests.trainers.grpo_rewards:overflowing_reward"], max_steps=5,
        max_nonfinite_steps=limit,
    )  # fmt: skip
    trainer = build_grpo_trainer(args, {"reward_funcs"})
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    with pytest.raises(NonFiniteStop) as info:
        trainer.train()
    assert f"last {limit} optimizer steps" in str(info.value) and info.value.exit_status == 4
    rows = rows_of(args.output_dir)
    assert [r["nonfinite_steps"] for r in rows if "loss" in r] == [1, 1]
    after = dict(trainer.model.named_parameters())
    assert all(torch.equal(before[k], after[k]) for k in before)  # no NaN update reached the weights
    assert os.path.isfile(os.path.join(args.output_dir, f"checkpoint-{limit}", "trainer_state.json"))
    with open(os.path.join(args.output_dir, "health.jsonl")) as f:
        findings = [json.loads(line) for line in f]
    assert findings[0]["rule"] == "nonfinite_metric" and findings[0]["severity"] == "critical"
    assert "rewards/overflowing_reward/mean" in findings[0]["message"]
