"""A run killed with SIGKILL (no handler runs, nothing is flushed on purpose) resumes from its newest complete
checkpoint with --resume_from_checkpoint latest and ends with the same metrics and weights as a run never killed."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.helpers import asset_flags
from tests.trainers.test_grpo_async import TIMING
from tests.trainers.test_resume import rows_of, weights

pytestmark = pytest.mark.slow  # kills and resumes rlhfkit runs in subprocesses, some under 2-process launches

STEPS = 6
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def agent_command(tiny_assets, out, *extra):
    """GRPO with a stateful environment and scripted tool calls (agent_run.py), synchronous or asynchronous."""
    return [sys.executable, os.path.join(ROOT, "tests", "trainers", "agent_run.py"), str(out), *extra]


def async_agent_command(tiny_assets, out):
    return agent_command(tiny_assets, out, "--async")


def run(cmd, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def two_process_ppo_command(tiny_assets, out):
    config = os.path.join(ROOT, "examples/accelerate_configs/cpu_2proc.yaml")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config]
    return [*launch, *ppo_command(tiny_assets, out)[1:]]


def inside_a_checkpoint_write(out):
    return (out / "checkpoint-3.tmp").exists()  # the atomic write's directory, before its rename


def after_checkpoint_3(out):
    return (out / "checkpoint-3").exists()  # while step 4 (or its checkpoint) runs


def at_a_random_moment(seed):
    """A moment drawn with `seed`: 0 to 0.3 s after checkpoint-k appears, k in 1..4 (at least 2 steps remain)."""
    rng = random.Random(seed)
    k, delay, seen = rng.randint(1, 4), rng.uniform(0.0, 0.3), []

    def kill_when(out):
        if not seen and (out / f"checkpoint-{k}").exists():
            seen.append(time.time())
        return bool(seen) and time.time() - seen[0] >= delay

    return kill_when


@pytest.fixture(scope="module")
def references(tiny_assets, tmp_path_factory):
    """The uninterrupted run of each command, run once for the module."""
    made = {}

    def reference(command):
        if command not in made:
            out = tmp_path_factory.mktemp(command.__name__) / "reference"
            run(command(tiny_assets, out), out.parent)
            made[command] = out
        return made[command]

    return reference


@pytest.mark.parametrize(
    "command, kill_when",
    [
        (ppo_command, after_checkpoint_3),
        (grpo_command, after_checkpoint_3),
        (ppo_command, inside_a_checkpoint_write),
        (two_process_ppo_command, after_checkpoint_3),
        *[(ppo_command, at_a_random_moment(seed)) for seed in range(3)],
        (agent_command, after_checkpoint_3),
        (async_agent_command, after_checkpoint_3),
    ],
    ids=["ppo", "grpo", "ppo-inside-a-checkpoint-write", "ppo-2-processes", *[f"ppo-random-{s}" for s in range(3)],
         "agent-environment", "agent-environment-async"],
)  # fmt: skip
def test_sigkill_then_resume_latest_ends_as_an_uninterrupted_run(
    references, tiny_assets, tmp_path, command, kill_when
):
    reference = references(command)

    out = tmp_path / "killed"
    cmd = command(tiny_assets, out)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # A session of its own: SIGKILL reaches the launcher and every process it started, as `kill -9 -PGID` does.
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    deadline = time.time() + 300
    while time.time() < deadline and not kill_when(out) and proc.poll() is None:
        time.sleep(0.0005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL  # it did die before the end
    if kill_when is inside_a_checkpoint_write:
        assert (out / "checkpoint-3.tmp").exists()  # it died mid-write: the half-written directory is left behind

    resumed = run([*cmd, "--resume_from_checkpoint", "latest"], tmp_path)
    assert "Traceback" not in resumed.stderr
    assert without_timing(rows_of(out)) == without_timing(rows_of(reference))  # every row once, every number equal
    for name, tensor in weights(reference).items():
        assert torch.equal(tensor, weights(out)[name]), name
    if command in (agent_command, async_agent_command):  # the episodes too: the environments resumed exactly
        assert (out / "samples.jsonl").read_text() == (reference / "samples.jsonl").read_text()
        assert any(r.get("reward_std", 0) > 0 for r in rows_of(out))  # the groups' rewards differ: it learns


def without_timing(rows):
    """The rows without the tools' and the generation worker's wall-clock seconds (the only numbers that differ)."""
    return [{k: v for k, v in r.items() if not k.endswith("/latency_s") and k not in TIMING} for r in rows]
