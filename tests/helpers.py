"""Small helpers shared by the tests."""

import os
import subprocess
import sys
from typing import NoReturn

import pytest
import torch

from rlhfkit import ops, perf
from rlhfkit.metrics import registry
from rlhfkit.models import policy_logits


def asset_flags(assets, task: bool = True) -> list[str]:
    """CLI flags pointing `rlhfkit ppo` at the built-in task's assets in `assets` (a path)."""
    flags = [
        "--model_name_or_path", str(assets / "tokenizer"),
        "--sft_model_path", str(assets / "sft"),
        "--reward_model_path", str(assets / "reward"),
        "--dataset_name", str(assets / "prompts"),
    ]  # fmt: skip
    return flags + (["--task", str(assets)] if task else [])


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_two_processes(command: list[str], cwd, **env: str) -> None:
    """Run `rlhfkit COMMAND...` under accelerate launch with 2 CPU processes (one thread each) from `cwd`, with the
    repository importable (tests' reward functions) and the extra environment `env`; fail with its stderr."""
    config = os.path.join(REPO, "examples", "accelerate_configs", "cpu_2proc.yaml")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, "-m", "rlhfkit.cli", *command]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO, **env)
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


def full_forward_logprobs(model, chunk, temperature: float):
    """(B, T) log-probs of a generated Chunk's response tokens from one full forward (the logits of every position,
    cut to the response's): the independent reference that sampling log-probs are checked against."""
    width = chunk.prompt_ids.shape[1]
    logits = policy_logits(model, chunk.input_ids, chunk.attention_mask)[:, width - 1 : -1]
    return ops.logprobs_from_logits(logits, chunk.completion_ids, temperature)


def expand_templates(
    metrics: list[registry.Metric],
    reward_func_names: list[str],
    async_generation: bool = False,
    tool_names: list[str] | None = None,
    sandbox: bool = False,
    moe: bool = False,
) -> list[registry.Metric]:
    """`metrics` with every template replaced by its expansion for each reward function (tools/ templates: for each
    tool), order kept: what a run with those reward functions logs (without async_generation, none of the metrics
    only it logs; without tool_names, none of the tools/ and eval/tools/ ones; without sandbox, none of the sandbox/ and
    eval/sandbox/ ones that a code-running reward logs; without moe, no aux_loss (a mixture of experts' routers); nor
    those the machine's device does not give, not_logged_on_this_machine)."""
    out: list[registry.Metric] = []
    for m in metrics:
        if m.when.startswith("async_generation") and not async_generation:
            continue
        tools = m.name.startswith(("tools/", "eval/tools/"))
        if tools and tool_names is None:
            continue
        if m.name.startswith(("sandbox/", "eval/sandbox/")) and not sandbox:
            continue
        if m is registry.AUX_LOSS and not moe:
            continue
        if m.name in not_logged_on_this_machine():
            continue
        names = tool_names if tools else reward_func_names
        out += [registry.expand(m, name) for name in names] if registry.is_template(m) else [m]
    return out


# The perf/ metrics that measure the machine (speed, memory): like wall-clock seconds, they differ between equal runs.
MACHINE_METRICS = {
    registry.PERF_MFU.name,
    registry.PERF_TRAINING_TOKENS_PER_S.name,
    registry.PERF_PEAK_MEMORY_ROLLOUT.name,
    registry.PERF_PEAK_MEMORY_OPTIMIZATION.name,
}


def not_logged_on_this_machine() -> set[str]:
    """The perf/ metrics a float32 test run does not log here: perf/mfu without RLHFKIT_PEAK_TFLOPS (no float32 peak),
    and the per-phase peak memory where perf.phase_memory_enabled says no (CPUs, without RLHFKIT_PHASE_MEMORY=1)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    names = set()
    if perf.device_peak_flops(device, torch.float32) is None:
        names.add(registry.PERF_MFU.name)
    if not perf.phase_memory_enabled(device):
        names |= {registry.PERF_PEAK_MEMORY_ROLLOUT.name, registry.PERF_PEAK_MEMORY_OPTIMIZATION.name}
    return names


def skip_or_fail(reason: str, require_env: str) -> NoReturn:
    """Skip the test for `reason`, or fail it where `require_env`=1: CI sets it for what .ci/run installs (Chromium,
    bubblewrap), whose tests must never skip silently there."""
    if os.environ.get(require_env) == "1":
        pytest.fail(f"{reason}; {require_env}=1 requires it", pytrace=False)
    pytest.skip(reason)
