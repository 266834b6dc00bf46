"""The accelerate configs of examples/accelerate_configs/ (TRL's file names), each started with `accelerate launch
--config_file` across 2 CPU processes (gloo): DDP, DeepSpeed ZeRO-1/2/3 and FSDP2 train PPO and GRPO to the same
numbers and weights as DDP (fp32), resume exactly, train LoRA adapters with gradient checkpointing under bf16; FSDP1
and settings rlhfkit owns stop at once with exit status 2 and the fix, never a traceback of ours."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from datasets import load_from_disk
from safetensors.torch import load_file

from tests.helpers import asset_flags
from tests.trainers.test_resume import rows_of

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "accelerate_configs"
TRL_NAMES = ["multi_gpu", "deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3", "fsdp1", "fsdp2"]
ENGINES = ["deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3", "fsdp2"]
# What a run logs that must agree across engines (fp32: the same arithmetic, summed in another order at most).
COMPARED = {
    "ppo": ["objective/kl", "objective/scores", "loss/policy_avg", "loss/value_avg", "val/ratio", "grad_norm",
            "eval/scores"],
    "grpo": ["reward", "kl", "loss", "entropy", "grad_norm", "eval/reward"],
}  # fmt: skip


def launch(config, tmp_path, algorithm, out, *extra, processes=2, config_file=None):
    """`accelerate launch --config_file CONFIG -m rlhfkit ALGORITHM` on the tiny assets; the finished process."""
    assets = tmp_path.parent / "odd_assets"  # see odd_eval_assets
    if algorithm == "ppo":
        flags = [
            *asset_flags(assets), "--total_episodes", "32", "--per_device_train_batch_size", "8",
            "--response_length", "6", "--local_rollout_forward_batch_size", "8",
        ]  # fmt: skip
    else:
        flags = [
            "--model_name_or_path", str(assets / "sft"), "--reward_funcs", "partial_credit",
            "--dataset_name", str(assets / "prompts"), "--task", str(assets), "--max_steps", "2",
            "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "6",
            "--beta", "0.04", "--logging_steps", "1",
        ]  # fmt: skip
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file or CONFIGS / f"{config}.yaml"),
        "--num_processes", str(processes), "-m", "rlhfkit", algorithm, *flags, "--output_dir", str(out),
        "--report_to", "none", "--num_sample_generations", "1", "--save_steps", "1", *extra,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), DS_ACCELERATOR="cpu")
    return subprocess.run(cmd, cwd=tmp_path.parent, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def odd_eval_assets(tiny_assets, tmp_path_factory):
    """The tiny assets with 31 eval prompts: 2 processes get 16 and 15, so sharded engines pad the shorter share."""
    root = tmp_path_factory.mktemp("engines")
    assets = root / "odd_assets"
    shutil.copytree(tiny_assets, assets)
    prompts = load_from_disk(str(tiny_assets / "prompts"))
    prompts["test"] = prompts["test"].select(range(31))
    shutil.rmtree(assets / "prompts")
    prompts.save_to_disk(str(assets / "prompts"))
    return root / "runs"


_RUNS: dict = {}


def engine_run(config, algorithm, workdir, *extra):
    """A finished fp32 run under `config` (run once per module and reused): its output directory."""
    key = (config, algorithm, extra)
    if key not in _RUNS:
        workdir.mkdir(exist_ok=True)
        out = workdir / "-".join([config, algorithm, *[e.strip("-") for e in extra]])
        result = launch(config, workdir, algorithm, out, "--bf16", "false", *extra)
        assert result.returncode == 0, result.stderr[-4000:]
        _RUNS[key] = (out, result)
    return _RUNS[key]


def test_the_configs_have_trls_names_and_settings():
    for name in TRL_NAMES:
        config = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
        assert config["mixed_precision"] == "bf16" and config["num_machines"] == 1, name
    assert yaml.safe_load((CONFIGS / "deepspeed_zero3.yaml").read_text())["deepspeed_config"]["zero_stage"] == 3
    assert yaml.safe_load((CONFIGS / "fsdp2.yaml").read_text())["fsdp_config"]["fsdp_version"] == 2


@pytest.mark.slow
def test_multi_gpu_yaml_trains_two_processes_on_cpus(odd_eval_assets):
    """Without GPUs the torchrun launcher still starts two processes; rlhfkit joins them (gloo) and says so."""
    out, result = engine_run("multi_gpu", "ppo", odd_eval_assets)
    assert "training on 2 processes (MULTI_CPU" in result.stdout
    assert (out / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "config, algorithm", [(c, "ppo") for c in ENGINES] + [("deepspeed_zero3", "grpo"), ("fsdp2", "grpo")]
)
@pytest.mark.slow
def test_every_engine_trains_the_numbers_and_weights_of_ddp(config, algorithm, odd_eval_assets):
    """Under ZeRO-1/2/3 and FSDP2 in fp32, every compared metric of every logged row (evaluation on 31 prompts
    included: the padded share of a sharded engine is left out) and the final weights equal DDP's."""
    baseline, _ = engine_run("multi_gpu", algorithm, odd_eval_assets)
    out, result = engine_run(config, algorithm, odd_eval_assets)
    kind = "DEEPSPEED" if config.startswith("deepspeed") else "FSDP"
    assert f"training on 2 processes ({kind}" in result.stdout
    rows, expected = rows_of(out), rows_of(baseline)
    assert [r["step"] for r in rows] == [r["step"] for r in expected]
    compared = 0
    for row, want in zip(rows, expected):
        assert row.keys() == want.keys()
        for key in COMPARED[algorithm]:
            if key in want:
                assert row[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (row["step"], key)
                compared += 1
    assert compared >= 2 * len(COMPARED[algorithm]) - 2  # the training rows and both evaluations were compared
    files = ["model.safetensors"] + (["value_model/model.safetensors"] if algorithm == "ppo" else [])
    for name in files:
        mine, theirs = load_file(out / name), load_file(baseline / name)
        assert mine.keys() == theirs.keys(), name  # a tied weight saved once, as the model's own save does
        for key in theirs:
            torch.testing.assert_close(mine[key], theirs[key], rtol=1e-5, atol=1e-6)
    assert (out / "checkpoint-1" / "engine").is_dir() and not (out / "checkpoint-1" / "optimizer.pt").exists()


@pytest.mark.parametrize("config", ["deepspeed_zero3", "fsdp2"])
@pytest.mark.slow
def test_a_sharded_run_resumes_exactly(config, odd_eval_assets):
    """Resumed from checkpoint-1 (the engine's sharded model and optimizer state), the run logs the same rows and
    ends with the same weights as the run that never stopped."""
    original, _ = engine_run(config, "ppo", odd_eval_assets)
    resumed = odd_eval_assets / f"{config}-resumed"
    shutil.copytree(original, resumed)
    for name in ("checkpoint-2", "model.safetensors", "value_model"):
        path = resumed / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    result = launch(config, odd_eval_assets, "ppo", resumed, "--bf16", "false", "--resume_from_checkpoint", "latest")
    assert result.returncode == 0, result.stderr[-4000:]
    assert rows_of(resumed) == rows_of(original)
    for name in ("model.safetensors", "value_model/model.safetensors"):
        a, b = load_file(original / name), load_file(resumed / name)
        assert all(torch.equal(a[k], b[k]) for k in a), name


@pytest.mark.parametrize("config", ["deepspeed_zero2", "fsdp2"])
@pytest.mark.slow
def test_under_bf16_the_reference_computes_as_the_policy_and_the_first_kl_is_zero(config, odd_eval_assets):
    """The configs' bf16: DeepSpeed trains bf16 weights, FSDP2 computes in bf16; the frozen reference gets the same
    weights (its parameters cast, its RoPE buffers left in fp32 as the engines leave the policy's), so the KL of the
    first rollout, sampled from the reference's own weights, is 0 exactly."""
    out = odd_eval_assets / f"{config}-bf16"
    result = launch(config, odd_eval_assets, "ppo", out)
    assert result.returncode == 0, result.stderr[-4000:]
    first = next(r for r in rows_of(out) if "objective/kl" in r)
    assert first["step"] == 1 and first["objective/kl"] == 0.0


@pytest.mark.parametrize("config, algorithm", [("deepspeed_zero3", "grpo"), ("fsdp2", "ppo")])
@pytest.mark.slow
def test_lora_with_gradient_checkpointing_under_bf16_trains_sharded(config, algorithm, odd_eval_assets):
    """The configs' own precision (bf16 mixed precision), LoRA adapters and gradient checkpointing under ZeRO-3
    and FSDP2: finite metrics, and the adapter (and PPO's value adapter) saved and trained."""
    out = odd_eval_assets / f"{config}-{algorithm}-lora"
    result = launch(config, odd_eval_assets, algorithm, out, "--use_peft", "--lora_r", "4", "--gradient_checkpointing")
    assert result.returncode == 0, result.stderr[-4000:]
    rows = rows_of(out)
    assert all(v == v and abs(v) != float("inf") for r in rows for v in r.values() if isinstance(v, float))
    adapter = load_file(out / "adapter_model.safetensors")
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and any(v.abs().max() > 0 for v in lora_b)  # lora_B starts at 0: it moved
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4
    if algorithm == "ppo":
        assert (out / "value_model" / "adapter_model.safetensors").is_file()


def _refused(result, *needles):
    """Each process exits 2 with the message; the launcher reports that as its own failure (exit status 1)."""
    assert result.returncode != 0
    assert "exitcode  : 2" in result.stderr, result.stderr[-3000:]
    for needle in needles:
        assert needle in result.stderr, result.stderr[-3000:]
    frames = [line for line in result.stderr.splitlines() if line.strip().startswith("File ")]
    assert not [frame for frame in frames if "rlhfkit" in frame]  # only the launcher's own report of the exit


@pytest.mark.slow
def test_fsdp1_stops_at_once_saying_how_to_convert(odd_eval_assets):
    out = odd_eval_assets / "fsdp1"
    result = launch("fsdp1", odd_eval_assets, "ppo", out)
    _refused(result, "FSDP (version 1)", "accelerate to-fsdp2")
    assert not out.exists()  # stopped before anything was written


@pytest.mark.slow
def test_a_deepspeed_config_that_contradicts_the_flags_stops_with_the_fix(odd_eval_assets, tmp_path):
    """A DeepSpeed JSON with its own micro-batch size: exit 2 naming the key and the flag that sets it."""
    ds_json = tmp_path / "ds.json"
    ds_json.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}))
    config = yaml.safe_load((CONFIGS / "deepspeed_zero2.yaml").read_text())
    config["deepspeed_config"] = {"deepspeed_config_file": str(ds_json), "zero3_init_flag": False}
    del config["mixed_precision"]  # set by the DeepSpeed JSON when it has a config file
    config_file = tmp_path / "accelerate.yaml"
    config_file.write_text(yaml.safe_dump(config))
    out = odd_eval_assets / "ds-json"
    result = launch(None, odd_eval_assets, "ppo", out, config_file=config_file)
    _refused(result, "train_micro_batch_size_per_gpu=4", "--per_device_train_batch_size")
    assert not out.exists()
