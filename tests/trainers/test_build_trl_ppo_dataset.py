"""A dataset and tokenizer as TRL 1.12's examples/scripts/ppo/ppo.py prepares them: the prompts tokenized into an
``input_ids`` column alone (the text column removed), and a ``[PAD]`` token added to the tokenizer without resizing
the model's embeddings, so the pad id is one the model cannot embed. PPO trains on them end to end."""

import json
import os

import pytest
import torch
from datasets import load_from_disk
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from rlhfkit.config import PPOConfig
from rlhfkit.sampling import complete, sampling_config
from rlhfkit.tasks import load_task
from rlhfkit.trainers.ppo import PPOTrainer


def trl_prepared(dataset, tokenizer):
    """TRL's prepare_dataset: tokenize the prompt column, keep input_ids alone."""
    return dataset.map(
        lambda rows: {"input_ids": tokenizer(rows["prompt"], padding=False)["input_ids"]},
        batched=True,
        remove_columns=dataset.column_names,
    )


@pytest.fixture()
def trl_setup(tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "tokenizer")
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})  # as TRL's ppo.py; the embeddings are not resized
    policy = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft")
    reward = AutoModelForSequenceClassification.from_pretrained(tiny_assets / "reward", num_labels=1)
    rows = policy.get_input_embeddings().num_embeddings
    assert tokenizer.pad_token_id >= rows  # the premise: the pad id cannot be embedded
    prompts = load_from_disk(str(tiny_assets / "prompts"))
    train, test = prompts["train"].select(range(64)), prompts["test"].select(range(16))
    return tokenizer, policy, reward, train, test


@pytest.mark.parametrize(
    "rollout_batch", [pytest.param(16, id="one-rollout-chunk"), pytest.param(4, id="several-rollout-chunks")]
)
def test_ppo_trains_on_an_input_ids_only_dataset_with_a_pad_beyond_the_embeddings(
    trl_setup, tiny_assets, tmp_path, rollout_batch
):
    tokenizer, policy, reward, train, test = trl_setup
    args = PPOConfig(
        output_dir=str(tmp_path / "run"), report_to=["none"], learning_rate=3e-4, per_device_train_batch_size=8,
        gradient_accumulation_steps=2, num_mini_batches=2, num_ppo_epochs=1, total_episodes=32,
        local_rollout_forward_batch_size=rollout_batch, per_device_eval_batch_size=16, response_length=8,
        num_sample_generations=1, save_steps=0, seed=1, stop_token="eos",
    )  # fmt: skip
    task = load_task(tiny_assets)
    trainer = PPOTrainer(
        args=args,
        processing_class=tokenizer,
        model=policy,
        reward_model=reward,
        train_dataset=trl_prepared(train, tokenizer),
        eval_dataset=trl_prepared(test, tokenizer),
        task=task,
    )
    # The prompt text the reward functions, the checker and the tables read is decoded from the ids: the prompts.
    assert trainer.train_dataset["prompt"] == train["prompt"]
    before = {k: v.detach().clone() for k, v in trainer.policy.named_parameters()}
    trainer.train()
    after = dict(trainer.policy.named_parameters())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    with open(os.path.join(args.output_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    updates = [r for r in rows if "episode" in r]
    assert [r["step"] for r in updates] == [1, 2]
    assert all(r["objective/scores"] == r["objective/scores"] for r in updates)  # finite scores, not NaN
    evals = [r for r in rows if "eval/task_success" in r]
    assert [r["step"] for r in evals] == [0, 2]
    with open(os.path.join(args.output_dir, "samples.jsonl")) as f:
        samples = [json.loads(line) for line in f]
    assert {s["query"] for s in samples} <= set(test["prompt"])  # the queries decode to the prompts
    assert not any("[PAD]" in s["query"] for s in samples)


def test_completions_pad_with_an_id_the_model_can_embed(trl_setup):
    """The chunks' ids are fed to forwards as they are: the [PAD] id never appears in them; masks mark what is real."""
    tokenizer, policy, _, train, _ = trl_setup
    prompts = trl_prepared(train, tokenizer)["input_ids"][:16]
    config = sampling_config(12, 1.0, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    (chunk,) = complete(policy.eval(), prompts, config, 16)
    rows = policy.get_input_embeddings().num_embeddings
    assert int(chunk.input_ids.max()) < rows
    assert chunk.prompt_mask.sum(1).tolist() == [len(p) for p in prompts]
    assert not chunk.prompt_mask.all()  # prompts of different lengths: there was left padding to fill
    assert not chunk.completion_mask.all()  # and completions that ended early, right padding
    real = [row[m].tolist() for row, m in zip(chunk.prompt_ids, chunk.prompt_mask)]
    assert real == prompts
