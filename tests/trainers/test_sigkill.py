"""A run killed with SIGKILL (no handler runs, nothing is flushed on purpose) resumes from its newest complete
checkpoint with --resume_from_checkpoint latest and ends with the same metrics and weights as a run never killed."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.helpers import asset_flags
from tests.trainers.test_resume import rows_of, weights

STEPS = 6


def ppo_command(tiny_assets, out):
    flags = [
        *asset_flags(tiny_assets), "--output_dir", str(out), "--report_to", "none",
        "--total_episodes", str(8 * STEPS), "--per_device_train_batch_size", "8",
        "--local_rollout_forward_batch_size", "8", "--response_length", "8", "--num_ppo_epochs", "1",
        "--num_sample_generations", "0", "--save_steps", "1", "--save_total_limit", "2", "--seed", "5",
    ]  # fmt: skip
    return [sys.executable, "-m", "rlhfkit.cli", "ppo", *flags]


def grpo_command(tiny_assets, out):
    flags = [
        "--model_name_or_path", str(tiny_assets / "sft"), "--dataset_name", str(tiny_assets / "prompts"),
        "--task", str(tiny_assets), "--output_dir", str(out), "--report_to", "none", "--num_generations", "4",
        "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2", "--max_steps", str(STEPS),
        "--max_completion_length", "8", "--num_sample_generations", "0", "--save_steps", "1",
        "--save_total_limit", "2", "--logging_steps", "1", "--seed", "5",
    ]  # fmt: skip
    return [sys.executable, "-m", "rlhfkit.cli", "grpo", *flags]


def run(cmd, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.parametrize("command", [ppo_command, grpo_command], ids=["ppo", "grpo"])
def test_sigkill_then_resume_latest_ends_as_an_uninterrupted_run(tiny_assets, tmp_path, command):
    reference = tmp_path / "reference"
    run(command(tiny_assets, reference), tmp_path)

    out = tmp_path / "killed"
    cmd = command(tiny_assets, out)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and not (out / "checkpoint-3").exists():  # killed while step 4 (or its save) runs
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / f"checkpoint-{STEPS}").exists()  # it did die before the end

    resumed = run([*cmd, "--resume_from_checkpoint", "latest"], tmp_path)
    assert "Traceback" not in resumed.stderr
    assert rows_of(out) == rows_of(reference)  # every row once, every number equal
    for name, tensor in weights(reference).items():
        assert torch.equal(tensor, weights(out)[name]), name
