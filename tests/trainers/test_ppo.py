"""End-to-end PPO runs on the tiny built-in task (test preset), read back from the run directory and trackers."""

import json
import math
import os

import pytest
import torch

from rlhfkit.config import PPOConfig
from rlhfkit.metrics import registry
from rlhfkit.trainers.build import build_ppo_trainer
from tests.helpers import expand_templates


def small_config(assets, tmp_path, **overrides) -> PPOConfig:
    values = dict(
        model_name_or_path=str(assets / "tokenizer"),
        sft_model_path=str(assets / "sft"),
        reward_model_path=str(assets / "reward"),
        dataset_name=str(assets / "prompts"),
        task=str(assets),
        output_dir=str(tmp_path / "run"),
        report_to=["none"],
        learning_rate=3e-4,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        num_mini_batches=2,
        num_ppo_epochs=2,
        total_episodes=48,  # 3 updates of 16
        local_rollout_forward_batch_size=8,
        per_device_eval_batch_size=16,
        response_length=8,
        num_sample_generations=1,
        save_steps=0,
        seed=1,
    )
    values.update(overrides)
    return PPOConfig(**values)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def run(tiny_assets, tmp_path_factory):
    """One short run; returns (trainer, metrics rows, initial policy parameters)."""
    tmp = tmp_path_factory.mktemp("ppo")
    trainer = build_ppo_trainer(small_config(tiny_assets, tmp))
    before = {k: v.detach().clone() for k, v in trainer.unwrapped.policy.named_parameters()}
    trainer.train()
    rows = read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl"))
    return trainer, rows, before


def update_rows(rows):
    return [r for r in rows if "episode" in r]


def test_logs_exactly_the_registry_set(run):
    _, rows, _ = run
    logged = set().union(*(r.keys() for r in rows)) - {"step"}
    expected = {m.name for m in expand_templates(registry.metrics_for("ppo"), [])}  # no reward_funcs
    assert logged == expected


def test_invariants_hold_on_every_update(run):
    trainer, rows, _ = run
    batch = trainer.sizes.batch_size
    updates = update_rows(rows)
    assert [r["step"] for r in updates] == [1, 2, 3]
    for r in updates:
        assert all(math.isfinite(v) for k, v in r.items() if isinstance(v, float)), r
        assert r["episode"] == r["step"] * batch
        assert 0 <= r["val/num_eos_tokens"] <= batch
        assert r["objective/rlhf_reward"] == pytest.approx(
            r["objective/scores"] + r["objective/non_score_reward"], abs=1e-5
        )
        assert r["objective/non_score_reward"] == pytest.approx(-r["objective/kl_coef"] * r["objective/kl"], abs=1e-5)
        for name in ("policy/clipfrac_avg", "val/clipfrac_avg", "rollout/task_success"):
            assert 0.0 <= r[name] <= 1.0
        assert r["objective/entropy"] >= 0  # masked sum of -log p: no sentinel can make it negative
        assert r["val/ratio_var"] >= 0 and r["policy/approxkl_avg"] >= 0
        assert r["loss/total_avg"] == pytest.approx(r["loss/policy_avg"] + 0.1 * r["loss/value_avg"], rel=1e-5)
    # Linear decay from learning_rate towards 0, one value per update.
    assert [r["lr"] for r in updates] == pytest.approx([3e-4 * (1 - k / 3) for k in range(3)])


def test_parameters_change_and_final_model_is_saved(run):
    trainer, _, before = run
    after = dict(trainer.unwrapped.policy.named_parameters())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    out = trainer.args.output_dir
    for name in ("config.json", "model.safetensors", "value_model/model.safetensors", "tokenizer_config.json"):
        assert os.path.exists(os.path.join(out, name)), name
    # The run's own config survives the model save beside it.
    with open(os.path.join(out, "run_config.json")) as f:
        assert json.load(f)["learning_rate"] == trainer.args.learning_rate


def test_samples_and_eval_are_logged(run):
    trainer, rows, _ = run
    samples = read_jsonl(os.path.join(trainer.args.output_dir, "samples.jsonl"))
    assert samples and {"query", "model response", "score"} <= set(samples[0])
    evals = [r for r in rows if "eval/task_success" in r]
    assert [r["step"] for r in evals] == [0, 3]  # before training, then at the end (num_sample_generations=1)


@pytest.mark.parametrize("flags", [{}, {"use_peft": True}], ids=["full", "lora"])
def test_first_minibatch_ratio_is_one(tiny_assets, tmp_path, flags):
    """With one epoch and one mini-batch every ratio is taken before the only optimizer step: exactly 1.

    This catches any mismatch between rollout and training log-probs (position ids with left padding,
    dropout, temperature, LoRA's adapter dropout), which would show up as val/ratio != 1 and approxkl > 0.
    """
    args = small_config(
        tiny_assets, tmp_path, num_ppo_epochs=1, num_mini_batches=1, total_episodes=32, num_sample_generations=0,
        **flags,
    )  # fmt: skip
    trainer = build_ppo_trainer(args)
    trainer.train()
    for r in update_rows(read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))):
        assert r["val/ratio"] == pytest.approx(1.0, abs=1e-5)
        assert r["val/ratio_var"] == pytest.approx(0.0, abs=1e-8)
        assert r["policy/approxkl_avg"] == pytest.approx(0.0, abs=1e-8)
        assert r["policy/clipfrac_avg"] == 0.0
