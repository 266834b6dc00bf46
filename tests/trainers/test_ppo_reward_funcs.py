"""PPO scored by reward functions (verifiable rewards), alone or weighted with a reward model (tiny built-in task)."""

import json
import math
import os
import unittest

import pytest
import torch
from datasets import load_from_disk
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from rlhfkit import PPOTrainer
from rlhfkit.config import PPOConfig
from rlhfkit.errors import ConfigError
from rlhfkit.metrics import registry
from rlhfkit.models import token_values, value_model_from_policy
from rlhfkit.trainers.build import build_ppo_trainer
from tests.helpers import expand_templates
from tests.trainers import grpo_rewards
from tests.trainers.test_ppo import read_jsonl, small_config, update_rows
from tests.trainers.test_resume import assert_same_run, resume_from


def functions_only(assets, tmp_path, **overrides) -> PPOConfig:
    """PPO with the task's correctness checker as its only reward (no reward model, no value model given)."""
    return small_config(assets, tmp_path, reward_model_path=None, reward_funcs=["correctness"], **overrides)


class CapturingTrainer(PPOTrainer):
    """Keeps every generation batch, to check its scores against the reward sources computed independently."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches, generate_and_score = [], self.generation.generate_and_score

        def capturing(rows, *more):
            batch = generate_and_score(rows, *more)
            self.batches.append((rows, batch))
            return batch

        self.generation.generate_and_score = capturing


def python_api_trainer(assets, tmp_path, reward_funcs, with_reward_model=True, **overrides) -> CapturingTrainer:
    args = small_config(assets, tmp_path, total_episodes=16, num_sample_generations=0, **overrides)
    tokenizer = AutoTokenizer.from_pretrained(str(assets / "tokenizer"))
    reward_model = AutoModelForSequenceClassification.from_pretrained(str(assets / "reward"), num_labels=1)
    return CapturingTrainer(
        args,
        tokenizer,
        AutoModelForCausalLM.from_pretrained(str(assets / "sft")),
        reward_model=reward_model if with_reward_model else None,
        train_dataset=load_from_disk(str(assets / "prompts"))["train"],
        reward_funcs=reward_funcs,
    )


def reference_rm_score(reward_model, batch, b: int) -> float:
    """The reward model's score of completion b, from its unpadded tokens alone: the last token's value, float64."""
    ids = torch.cat([batch.prompt_ids[b][batch.prompt_mask[b]], batch.completion_ids[b][batch.completion_mask[b]]])
    model = reward_model.double()
    hidden = model.model(input_ids=ids[None]).last_hidden_state
    return model.score(hidden)[0, -1, 0].item()


def test_one_function_alone_trains_with_a_value_model_from_the_policy(tiny_assets, tmp_path, monkeypatch):
    record = tmp_path / "calls"
    monkeypatch.setenv("RLHFKIT_TEST_RECORD", str(record))
    args = small_config(
        tiny_assets, tmp_path, reward_model_path=None, reward_funcs=["tests.trainers.grpo_rewards:recorded_length"],
        per_device_eval_batch_size=7,  # evaluation's calls have at most 7 completions, training's 16
    )  # fmt: skip
    trainer = build_ppo_trainer(args)
    assert trainer.reward_model is None and trainer.rewards.names == ["recorded_length"]

    # The value model starts from the policy's backbone with a zero score head: every value is 0 at first.
    model = trainer.unwrapped
    policy_backbone, value_backbone = model.policy.model.state_dict(), model.value_model.model.state_dict()
    assert all(torch.equal(policy_backbone[k], value_backbone[k]) for k in policy_backbone)
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(token_values(model.value_model, ids, torch.ones_like(ids).bool()), torch.zeros(1, 4))

    trainer.train()
    rows = read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))
    logged = set().union(*(r.keys() for r in rows)) - {"step"}
    assert logged == {m.name for m in expand_templates(registry.metrics_for("ppo"), ["recorded_length"])}

    # Each update's objective/scores is the mean of the function's rewards for that update's 16 rollouts.
    calls = [json.loads(line) for line in open(f"{record}.rank0")]
    train_calls = [c for c in calls if len(c["rewards"]) == 16]
    updates = update_rows(rows)
    assert len(train_calls) == len(updates) == 3
    for call, row in zip(train_calls, updates):
        mean = sum(call["rewards"]) / 16
        std = math.sqrt(sum((r - mean) ** 2 for r in call["rewards"]) / 15)
        assert row["objective/scores"] == pytest.approx(mean, abs=1e-6)
        assert row["rewards/recorded_length/mean"] == pytest.approx(mean, abs=1e-6)
        assert row["rewards/recorded_length/std"] == pytest.approx(std, abs=1e-6)
        assert "answer" in call and call["answer"] is not None  # the dataset's other columns reach the function
    evals = [r for r in rows if "eval/scores" in r]
    assert [r["step"] for r in evals] == [0, 3]
    assert os.path.isfile(os.path.join(args.output_dir, "value_model", "model.safetensors"))


def test_function_and_reward_model_are_weighted(tiny_assets, tmp_path):
    """score_b = 2 * len(completion_b) / 10 + 0.5 * RM(b): weights over the functions, then the reward model."""
    trainer = python_api_trainer(
        tiny_assets, tmp_path, [grpo_rewards.recorded_length], reward_weights=[2.0, 0.5], seed=3
    )
    assert trainer.rewards.names == ["recorded_length", "reward"]
    trainer.train()
    (rows, batch), = trainer.batches  # fmt: skip
    for b in range(0, 16, 5):
        expected = 2.0 * len(batch.completions[b]) / 10 + 0.5 * reference_rm_score(trainer.reward_model, batch, b)
        assert batch.scores[b].item() == pytest.approx(expected, abs=1e-4)
    (row,) = update_rows(read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl")))
    combined = 2.0 * row["rewards/recorded_length/mean"] + 0.5 * row["rewards/reward/mean"]
    assert row["objective/scores"] == pytest.approx(combined, abs=1e-5)


def test_a_function_returning_none_is_left_out_for_those_completions(tiny_assets, tmp_path):
    trainer = python_api_trainer(tiny_assets, tmp_path, [grpo_rewards.half_none], seed=4)
    trainer.train()
    (_, batch), = trainer.batches  # fmt: skip
    half, rm = batch.reward_outputs
    assert half.applicable.tolist() == [i % 2 == 0 for i in range(16)]
    expected = torch.where(half.applicable, half.values, 0.0) + rm.values  # None adds nothing: not a 0 reward
    assert torch.allclose(batch.scores.double().cpu(), expected, atol=1e-6)
    (row,) = update_rows(read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl")))
    assert row["rewards/half_none/mean"] == 1.0 and row["rewards/half_none/std"] == 0.0  # over the 8 it scored


def test_completions_no_source_scores_get_0_with_a_warning_and_training_goes_on(tiny_assets, tmp_path):
    trainer = python_api_trainer(tiny_assets, tmp_path, [grpo_rewards.half_none], with_reward_model=False)
    with unittest.TestCase().assertLogs("rlhfkit", "WARNING") as logs:
        trainer.train()
    assert any("returned None or NaN for 8 of 16 completions, e.g. completion 1" in line for line in logs.output)
    (_, batch), = trainer.batches  # fmt: skip
    (half,) = batch.reward_outputs
    assert torch.equal(batch.scores.double().cpu(), torch.where(half.applicable, half.values, 0.0))


@pytest.mark.parametrize("flags", [{}, {"use_peft": True}], ids=["full", "lora"])
def test_first_minibatch_ratio_is_one(tiny_assets, tmp_path, flags):
    args = functions_only(
        tiny_assets, tmp_path, num_ppo_epochs=1, num_mini_batches=1, total_episodes=32, num_sample_generations=0,
        **flags,
    )  # fmt: skip
    build_ppo_trainer(args).train()
    updates = update_rows(read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")))
    assert len(updates) == 2
    for r in updates:
        assert r["val/ratio"] == pytest.approx(1.0, abs=1e-5)
        assert r["policy/approxkl_avg"] == pytest.approx(0.0, abs=1e-8)
        assert r["policy/clipfrac_avg"] == 0.0


def test_resumes_exactly(tiny_assets, tmp_path):
    def make_config(out, **extra):
        return functions_only(tiny_assets, tmp_path, output_dir=str(out), total_episodes=64, save_steps=2, **extra)

    original = tmp_path / "original"
    build_ppo_trainer(make_config(original)).train()
    resumed = resume_from(original, 2, tmp_path, make_config, build_ppo_trainer)
    assert_same_run(original, resumed, ["model.safetensors", "value_model/model.safetensors"])


def test_python_api_needs_some_reward(tiny_assets, tmp_path):
    with pytest.raises(ConfigError, match="PPOTrainer needs a reward: pass reward_model .* and/or reward_funcs"):
        python_api_trainer(tiny_assets, tmp_path, None, with_reward_model=False)


def test_reward_weights_count_functions_then_the_reward_model():
    with pytest.raises(ConfigError, match=r"reward_weights=\[1.0\]: needs one weight per reward.*a:f, b:g, rm"):
        PPOConfig(reward_funcs=["a:f", "b:g"], reward_model_path="rm", reward_weights=[1.0])
    PPOConfig(reward_funcs=["a:f"], reward_model_path="rm", reward_weights=[1.0, 0.5])  # one each: fine


def test_value_model_from_policy_copies_the_backbone_and_zeroes_the_head(tiny_assets):
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_assets / "sft"))
    value = value_model_from_policy(policy)
    assert type(value).__name__.endswith("ForSequenceClassification") and value.config.num_labels == 1
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    mask = torch.ones_like(ids).bool()
    hidden_policy = policy.model(input_ids=ids).last_hidden_state
    hidden_value = value.model(input_ids=ids).last_hidden_state
    assert torch.equal(hidden_policy, hidden_value)
    assert torch.count_nonzero(value.score.weight) == 0
    assert torch.equal(token_values(value, ids, mask), torch.zeros(1, 5))
    with torch.no_grad():  # a copy: training the value model leaves the policy alone
        value.model.embed_tokens.weight.add_(1.0)
    assert torch.equal(policy.model(input_ids=ids).last_hidden_state, hidden_policy)
