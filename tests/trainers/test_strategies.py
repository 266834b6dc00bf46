"""TrainingArguments' schedules in short real runs: --save_strategy, --eval_strategy, --logging_strategy (with
--logging_first_step), --eval_on_start, --shuffle_dataset, --disable_dropout and --dataset_num_proc.

The prompt datasets are small slices of the built-in task's, so that an epoch ends inside a run of a few steps.
"""

import json
import os

import pytest
from datasets import DatasetDict, load_from_disk
from transformers import AutoModelForCausalLM

from rlhfkit.data import endless_batches, tokenize_prompts
from rlhfkit.trainers.build import build_grpo_trainer, build_ppo_trainer
from rlhfkit.trainers.grpo import GRPOTrainer
from tests.trainers import grpo_rewards
from tests.trainers.test_grpo import grpo_config
from tests.trainers.test_ppo import small_config


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def small_prompts(assets, path, train, test):
    """The first `train` / `test` prompts of the built-in task, saved as a dataset with both splits."""
    full = load_from_disk(str(assets / "prompts"))
    DatasetDict(train=full["train"].select(range(train)), test=full["test"].select(range(test))).save_to_disk(path)
    return str(path)


def checkpoints(output_dir):
    return sorted(int(name.split("-")[1]) for name in os.listdir(output_dir) if name.startswith("checkpoint-"))


def logged(output_dir):
    rows = read_jsonl(os.path.join(output_dir, "metrics.jsonl"))
    train = [r["step"] for r in rows if "episode" in r]
    evals = [r["step"] for r in rows if any(k.startswith("eval/") for k in r)]
    tables = sorted({r["step"] for r in read_jsonl(os.path.join(output_dir, "samples.jsonl"))})
    return train, evals, tables


def test_ppo_epoch_checkpoints_eval_every_steps_and_no_training_rows(tiny_assets, tmp_path):
    """40 prompts, 16 per update, 4 updates: the first pass ends during update 3. eval_strategy steps replaces the
    num_sample_generations schedule (no evaluation at step 0); logging_strategy no logs no training row."""
    data = small_prompts(tiny_assets, tmp_path / "prompts", train=40, test=8)
    args = small_config(
        tiny_assets, tmp_path, dataset_name=data, total_episodes=64, num_ppo_epochs=1, num_sample_generations=1,
        save_strategy="epoch", save_steps=1, eval_strategy="steps", eval_steps=3, logging_strategy="no",
    )  # fmt: skip
    build_ppo_trainer(args).train()
    train, evals, tables = logged(args.output_dir)
    assert checkpoints(args.output_dir) == [3, 4]  # the end of the first epoch, and the final one
    assert train == [] and evals == [3, 4] and tables == [3, 4]


def test_grpo_eval_per_epoch_checkpoints_per_steps_and_first_row(tiny_assets, tmp_path):
    """6 prompts, 4 per generation, 2 steps per generation (num_iterations), 6 steps: passes end with generations 2
    and 3, after steps 4 and 6. Prompts are drawn in dataset order (shuffle_dataset false)."""
    data = small_prompts(tiny_assets, tmp_path / "prompts", train=6, test=4)
    args = grpo_config(
        tiny_assets, tmp_path, dataset_name=data, max_steps=6, num_iterations=2, shuffle_dataset=False,
        eval_strategy="epoch", eval_on_start=True, save_steps=2, logging_steps=5, logging_first_step=True,
    )  # fmt: skip
    trainer = build_grpo_trainer(args, set())
    trainer.train()
    train, evals, tables = logged(args.output_dir)
    assert checkpoints(args.output_dir) == [2, 4, 6]
    assert train == [1, 5, 6] and evals == [0, 4, 6] and tables == [4, 6]
    # The completions table of step 4 shows generation 2: prompts 4, 5, 0, 1 of the dataset, 4 completions each.
    prompts = load_from_disk(data)["train"]["prompt"]
    table = [r for r in read_jsonl(os.path.join(args.output_dir, "samples.jsonl")) if r["step"] == 4]
    assert [r["prompt"] for r in table] == [prompts[i] for i in (4, 5, 0, 1) for _ in range(4)]


def test_save_strategy_no_keeps_only_the_final_checkpoint(tiny_assets, tmp_path):
    args = grpo_config(tiny_assets, tmp_path, max_steps=2, save_strategy="no", save_steps=1)
    build_grpo_trainer(args, set()).train()
    assert checkpoints(args.output_dir) == [2]
    assert os.path.exists(os.path.join(args.output_dir, "model.safetensors"))


@pytest.mark.parametrize("disable", [True, False])
def test_disable_dropout_false_keeps_the_checkpoints_dropout(tiny_assets, tmp_path, disable):
    model = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft")
    attention = model.model.layers[0].self_attn
    attention.attention_dropout = 0.1
    args = grpo_config(tiny_assets, tmp_path, disable_dropout=disable)
    GRPOTrainer(model, grpo_rewards.half_none, args, train_dataset=load_from_disk(args.dataset_name)["train"])
    assert attention.attention_dropout == (0.0 if disable else 0.1)


def test_dataset_num_proc_prepares_the_same_prompts(tiny_assets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_assets / "tokenizer")
    train = load_from_disk(str(tiny_assets / "prompts"))["train"].select(range(16))
    lengths = [len(ids) for ids in tok(list(train["prompt"]), add_special_tokens=False)["input_ids"]]
    limit = max(lengths) - 1  # the longest prompts are dropped or cut
    for overflow, rows in (("drop", sum(n <= limit for n in lengths)), ("truncate", 16)):
        one = tokenize_prompts(train, tok, "prompt", limit, overflow=overflow, log=lambda *a: None)
        two = tokenize_prompts(train, tok, "prompt", limit, overflow=overflow, log=lambda *a: None, num_proc=2)
        assert len(one) == rows < 16 or overflow == "truncate"
        assert one["input_ids"] == two["input_ids"] and max(map(len, two["input_ids"])) == limit


def test_unshuffled_batches_follow_the_dataset_and_resume_exactly():
    batches = endless_batches(5, 2, seed=0, shuffle=False)
    assert [next(batches) for _ in range(4)] == [[0, 1], [2, 3], [4, 0], [1, 2]]  # passes follow one another
    assert next(endless_batches(5, 2, seed=0, skip=2, shuffle=False)) == [4, 0]  # a resumed run goes on
    ranks = [endless_batches(5, 1, seed=0, rank=r, world_size=2, shuffle=False) for r in (0, 1)]
    assert [next(ranks[0]), next(ranks[1]), next(ranks[0]), next(ranks[1])] == [[0], [1], [2], [3]]
