"""TRL 1.16's asynchronous GRPO names (trl.experimental.async_grpo) on rlhfkit: AsyncGRPOConfig maps onto GRPO with
async_generation and TRL's asynchronous defaults (config/async_grpo.py), AsyncGRPOTrainer takes TRL's signature, and
what rlhfkit cannot honour exits with the reason."""

import dataclasses
import os

import pytest
import torch
from datasets import load_from_disk

from rlhfkit import AsyncGRPOConfig, AsyncGRPOTrainer, GRPOConfig
from rlhfkit.config.async_grpo import SERVER_FIELDS
from rlhfkit.errors import ConfigError
from tests.trainers import grpo_rewards
from tests.trainers.test_grpo import read_jsonl


def async_config(assets, tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), report_to=["none"], learning_rate=1e-3, num_generations=4,
        per_device_train_batch_size=8, max_steps=3, max_completion_length=8, save_steps=0, seed=3,
        num_sample_generations=0, generation_threads=1,
    )  # fmt: skip
    return AsyncGRPOConfig(**{**values, **overrides})


def test_trl_s_asynchronous_defaults_map_onto_async_generation():
    trl = pytest.importorskip("trl.experimental.async_grpo")
    ours, theirs = AsyncGRPOConfig(output_dir="x"), trl.AsyncGRPOConfig(output_dir="x", bf16=False)  # a CPU
    assert isinstance(ours, GRPOConfig) and ours.async_generation and ours.beta == 0.0
    for name in ("max_staleness", "max_completion_length", "num_generations", "logging_steps", "lr_scheduler_type",
                 "learning_rate", "temperature", "epsilon", *SERVER_FIELDS):  # fmt: skip
        assert getattr(ours, name) == getattr(theirs, name), name
    # Every field TRL's asynchronous config declares (beyond TrainingArguments'), at TRL's default, is taken.
    own = trl.AsyncGRPOConfig.__annotations__
    fields = {f.name: f for f in dataclasses.fields(trl.AsyncGRPOConfig) if f.init and f.name in own}
    assert len(fields) > 25
    values = {name: getattr(theirs, name) for name in fields}
    assert AsyncGRPOConfig(output_dir="x", **values).max_staleness == 4


@pytest.mark.parametrize(
    "name, value", [("token_budget", 4096), ("weight_sync_steps", 2), ("vllm_server_base_url", "http://gpu:8000")]
)
def test_a_trl_asynchronous_field_rlhfkit_cannot_honour_exits_with_the_reason(name, value):
    with pytest.raises(
        ConfigError, match=f"AsyncGRPOConfig\\({name}=.*at its default .* only: {SERVER_FIELDS[name][:20]}"
    ):
        AsyncGRPOConfig(output_dir="x", **{name: value})


def test_async_grpo_trainer_trains_with_generation_in_the_worker(tiny_assets, tmp_path):
    args = async_config(tiny_assets, tmp_path)
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    trainer = AsyncGRPOTrainer(str(tiny_assets / "sft"), grpo_rewards.recorded_length, args,
                               train_dataset=dataset["train"])  # fmt: skip
    assert trainer.generation_worker is not None and trainer.ref_model is None  # beta 0: no reference model
    output = trainer.train()
    assert output.global_step == 3
    rows = [row for row in read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")) if "loss" in row]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(row["sample/staleness_max"] <= 4 for row in rows if "sample/staleness_max" in row)
    assert torch.isfinite(torch.tensor([row["loss"] for row in rows])).all()


def test_async_grpo_trainer_refuses_trl_s_vllm_plumbing_and_another_config(tiny_assets, tmp_path):
    dataset = load_from_disk(str(tiny_assets / "prompts"))["train"]
    with pytest.raises(ConfigError, match="rollout_worker=...\\): these drive TRL's vLLM server"):
        AsyncGRPOTrainer(str(tiny_assets / "sft"), grpo_rewards.recorded_length, async_config(tiny_assets, tmp_path),
                         train_dataset=dataset, rollout_worker=object())  # fmt: skip
    with pytest.raises(ConfigError, match="pass an AsyncGRPOConfig"):
        AsyncGRPOTrainer(str(tiny_assets / "sft"), grpo_rewards.recorded_length, GRPOConfig(output_dir="x"),
                         train_dataset=dataset)  # fmt: skip
