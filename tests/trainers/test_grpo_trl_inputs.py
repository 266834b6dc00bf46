"""The forms of input TRL 1.16's GRPOTrainer takes (trainers/grpo/trainer.py, datasets.py, rewards/): a streamed train set
with max_steps, one reward tokenizer for one reward model, TRL's reward attributes, completions no reward function
scores (a warning, reward 0, training goes on), and reward_funcs left out."""

import os
import re
import unittest

import pytest
import torch
from datasets import load_from_disk
from transformers import AutoTokenizer

from rlhfkit import GRPOTrainer
from rlhfkit.errors import ConfigError
from tests.trainers import grpo_rewards
from tests.trainers.test_grpo import grpo_config, read_jsonl


def prompts(tiny_assets):
    return load_from_disk(str(tiny_assets / "prompts"))


def test_a_streamed_train_set_trains_max_steps_in_the_stream_s_order(tiny_assets, tmp_path):
    # 3 steps of 2 micro-batches of 8 completions, groups of 4: 4 prompts a step (steps_per_generation 2).
    args = grpo_config(tiny_assets, tmp_path, max_steps=3)
    rows = prompts(tiny_assets)["train"]
    seen = []

    def recorded(prompts, completions, **kwargs):
        seen.extend(prompts[:: args.num_generations])  # one per group
        return [float(len(c)) for c in completions]

    stream = rows.to_iterable_dataset()
    trainer = GRPOTrainer(str(tiny_assets / "sft"), recorded, args, train_dataset=stream)
    # TRL's rule for a stream, shown where TRL shows it: no batch is dispatched from the main process
    assert trainer.args.accelerator_config.dispatch_batches is False
    output = trainer.train()
    assert output.global_step == 3 and len(trainer.train_dataset) == 12  # only the rows 3 steps draw were read
    assert seen == rows["prompt"][:12]  # in the stream's order, not shuffled
    logged = [row["step"] for row in read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")) if "loss" in row]
    assert logged == [1, 2, 3]


def test_a_streamed_train_set_needs_max_steps(tiny_assets, tmp_path):
    args = grpo_config(tiny_assets, tmp_path, max_steps=-1, num_train_epochs=1)
    stream = prompts(tiny_assets)["train"].to_iterable_dataset()
    with pytest.raises(ConfigError, match="streamed IterableDataset, whose length is unknown, and max_steps is -1"):
        GRPOTrainer(str(tiny_assets / "sft"), grpo_rewards.recorded_length, args, train_dataset=stream)


def test_one_reward_tokenizer_for_one_reward_model_and_trl_s_reward_attributes(tiny_assets, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "reward")
    trainer = GRPOTrainer(
        str(tiny_assets / "sft"),
        str(tiny_assets / "reward"),
        grpo_config(tiny_assets, tmp_path, max_steps=1),
        train_dataset=prompts(tiny_assets)["train"],
        reward_processing_classes=tokenizer,  # TRL takes one tokenizer for a list of one
    )
    assert trainer.reward_processing_classes == [tokenizer]
    (model,) = trainer.reward_funcs
    assert isinstance(model, torch.nn.Module) and trainer.reward_func_names == ["reward"]
    assert torch.equal(trainer.reward_weights, torch.tensor([1.0]))
    trainer.train()


def test_completions_no_reward_function_scores_get_0_with_a_warning(tiny_assets, tmp_path):
    args = grpo_config(tiny_assets, tmp_path, max_steps=2)
    trainer = GRPOTrainer(
        str(tiny_assets / "sft"), grpo_rewards.always_none, args, train_dataset=prompts(tiny_assets)["train"]
    )
    with unittest.TestCase().assertLogs("rlhfkit", "WARNING") as logs:  # TRL's tests' way: Python's logging
        output = trainer.train()
    assert any(re.search("for 16 of 16 completions, e.g. completion 0 .* reward 0", line) for line in logs.output)
    assert output.global_step == 2
    rows = [row for row in read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")) if "reward" in row]
    assert [row["reward"] for row in rows] == [0.0, 0.0]


def test_chat_template_kwargs_render_the_conversational_prompts(tiny_assets, tmp_path):
    from datasets import Dataset

    from rlhfkit.models import load_tokenizer
    from tests.hub_cache import CHAT_TEMPLATE

    tokenizer = load_tokenizer(str(tiny_assets / "tokenizer"))
    tokenizer.chat_template = "{% if not enable_thinking %}/no_think {% endif %}" + CHAT_TEMPLATE
    conversations = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in ["sort 21=", "sort 12="]]})
    args = grpo_config(tiny_assets, tmp_path, max_steps=1, chat_template_kwargs='{"enable_thinking": false}')
    trainer = GRPOTrainer(str(tiny_assets / "sft"), grpo_rewards.recorded_length, args, train_dataset=conversations,
                          processing_class=tokenizer)  # fmt: skip
    rendered = [f"/no_think user: {p}\nassistant: " for p in ["sort 21=", "sort 12="]]
    assert trainer.train_dataset["input_ids"] == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    with pytest.raises(ConfigError, match="chat_template_kwargs sets add_generation_prompt"):
        grpo_config(tiny_assets, tmp_path, chat_template_kwargs={"add_generation_prompt": False})


def test_reward_funcs_left_out_says_why(tiny_assets, tmp_path):
    args = grpo_config(tiny_assets, tmp_path, max_steps=1)
    with pytest.raises(
        ConfigError,
        match="No reward source provided: GRPOTrainer needs reward_funcs.*or an environment_factory whose environments score",
    ):
        GRPOTrainer(str(tiny_assets / "sft"), args=args, train_dataset=prompts(tiny_assets)["train"])


def test_trl_s_mask_helpers_under_trl_s_names(tiny_assets, tmp_path):
    trainer = GRPOTrainer(
        str(tiny_assets / "sft"), grpo_rewards.recorded_length, grpo_config(tiny_assets, tmp_path, max_steps=1),
        train_dataset=prompts(tiny_assets)["train"],
    )  # fmt: skip
    # 10 valid tokens 0.1 ... 1.0 (the two padded ones are left out of the quantile): the 0.8-quantile is 0.82.
    entropies = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    expected = torch.tensor([[0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]], dtype=torch.bool)
    assert torch.equal(trainer.get_high_entropy_mask(entropies, mask, 0.8), expected)
    # Drift = mean(sampling - current) per sequence: 0.5 and 0.05; only the drifted, negative-advantage one is dropped.
    current = torch.zeros(3, 2)
    sampling = torch.tensor([[0.5, 0.5], [0.1, 0.0], [0.5, 0.5]])
    keep = GRPOTrainer.get_off_policy_mask(torch.tensor([[-1.0], [-1.0], [1.0]]), current, sampling,
                                           torch.ones(3, 2), 0.1)  # fmt: skip
    assert torch.equal(keep, torch.tensor([[0.0], [1.0], [1.0]]))
