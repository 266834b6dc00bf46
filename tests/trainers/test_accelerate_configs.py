"""The accelerate configs of examples/accelerate_configs/, under TRL's file names, each started with
`accelerate launch --config_file` on this CPU machine: DDP trains; DeepSpeed and FSDP, which rlhfkit does not support
yet, stop at once with exit status != 0 and a message that says what to launch instead, never a traceback of ours
and never N processes training alone."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import asset_flags

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "accelerate_configs"
TRL_NAMES = ["multi_gpu", "deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3", "fsdp1", "fsdp2"]


def launch(config, tiny_assets, tmp_path, processes=1):
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / f"{config}.yaml"),
        "--num_processes", str(processes), "-m", "rlhfkit", "ppo", *asset_flags(tiny_assets),
        "--output_dir", str(tmp_path / "run"), "--report_to", "none", "--total_episodes", "32",
        "--per_device_train_batch_size", "8", "--response_length", "6", "--num_sample_generations", "0",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), DS_ACCELERATOR="cpu")
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_the_configs_have_trls_names_and_settings():
    for name in TRL_NAMES:
        config = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
        assert config["mixed_precision"] == "bf16" and config["num_machines"] == 1, name
    assert yaml.safe_load((CONFIGS / "deepspeed_zero3.yaml").read_text())["deepspeed_config"]["zero_stage"] == 3
    assert yaml.safe_load((CONFIGS / "fsdp2.yaml").read_text())["fsdp_config"]["fsdp_version"] == 2


def test_multi_gpu_yaml_trains_two_processes_on_cpus(tiny_assets, tmp_path):
    """Without GPUs the torchrun launcher still starts two processes; rlhfkit joins them (gloo) and says so."""
    result = launch("multi_gpu", tiny_assets, tmp_path, processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "training on 2 processes (MULTI_CPU" in result.stdout
    assert (tmp_path / "run" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "config, engine",
    [
        ("deepspeed_zero1", "DeepSpeed ZeRO stage 1"),
        ("deepspeed_zero2", "DeepSpeed ZeRO stage 2"),
        ("deepspeed_zero3", "DeepSpeed ZeRO stage 3"),
        ("fsdp1", "FSDP (version 1)"),
        ("fsdp2", "FSDP (version 2)"),
    ],
)
def test_sharding_engines_stop_at_once_saying_what_to_launch_instead(config, engine, tiny_assets, tmp_path):
    if config.startswith("deepspeed"):
        pytest.importorskip("deepspeed")  # accelerate launch itself needs it (the deepspeed extra)
    result = launch(config, tiny_assets, tmp_path)
    assert result.returncode != 0
    assert (
        f"rlhfkit ppo: error: this run was launched under {engine}, which rlhfkit does not support yet"
        in result.stderr
    )
    assert "multi_gpu.yaml" in result.stderr
    frames = [line for line in result.stderr.splitlines() if line.strip().startswith("File ")]
    assert not [frame for frame in frames if "rlhfkit" in frame]  # only the launcher's own report of the exit
    assert not (tmp_path / "run").exists()  # stopped before anything was written
