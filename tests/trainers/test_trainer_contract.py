"""transformers' Trainer contract on rlhfkit's trainers (trainers/api.py, run.py): train() returns a TrainOutput whose
training_loss is the mean logged loss and ends with transformers' summary row; evaluate() on another dataset under
another prefix; push_to_hub's keywords; TRL 1.16's agent arguments refused with the reason."""

import os

import pytest
import torch
from datasets import DatasetDict, load_from_disk
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.trainer_utils import TrainOutput

from rlhfkit import GRPOConfig, GRPOTrainer, PPOConfig, PPOTrainer
from rlhfkit.errors import ConfigError
from rlhfkit.models import load_reward_model
from tests.trainers.test_grpo import grpo_config
from tests.trainers.test_trl_api import Recorder, read_jsonl

# transformers' Trainer._finalize_training: speed_metrics("train", ...), total_flos, train_loss; log() adds epoch
SUMMARY = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss", "epoch"}


class Scored:
    """A reward function (completion length / 10) that keeps every call's prompts and rewards."""

    __name__ = "scored"

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, **kwargs):
        rewards = [len(c) / 10 for c in completions]
        self.calls.append((list(prompts), rewards))
        return rewards


@pytest.fixture(scope="module")
def grpo(tiny_assets, tmp_path_factory):
    """A GRPO trainer trained 3 steps, a row every step; its TrainOutput, reward function and callback, and its
    metrics.jsonl rows and log_history as train() left them."""
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    reward, recorder = Scored(), Recorder()
    args = grpo_config(tiny_assets, tmp_path_factory.mktemp("grpo-contract"), max_steps=3, logging_steps=1)
    trainer = GRPOTrainer(
        str(tiny_assets / "sft"),
        reward,
        args,
        train_dataset=dataset["train"],
        eval_dataset=dataset["test"].select(range(8)),
        callbacks=[recorder],
    )
    output = trainer.train()
    rows = read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))
    return trainer, output, reward, recorder, rows, list(trainer.state.log_history), list(recorder.logs)


def test_grpo_train_returns_the_mean_logged_loss_and_the_summary_row(grpo):
    trainer, output, _, _, rows, history, logs = grpo
    losses = [row["loss"] for row in rows if "loss" in row]  # one row per step (logging_steps=1)
    assert isinstance(output, TrainOutput) and output.global_step == trainer.state.global_step == 3
    assert len(losses) == 3 and output.training_loss == pytest.approx(sum(losses) / 3, rel=1e-9, abs=1e-12)
    summary = history[-1]
    assert set(summary) == SUMMARY | {"step"} and summary["step"] == 3
    assert summary == rows[-1]  # written to metrics.jsonl as well
    assert output.metrics == {k: v for k, v in summary.items() if k != "step"}
    assert logs[-1] == (3, output.metrics)  # on_log with it, as transformers' log()
    assert summary["train_loss"] == output.training_loss and summary["total_flos"] == 0.0
    last = [row for row in rows if "episode" in row][-1]
    runtime = summary["train_runtime"]
    assert summary["epoch"] == last["epoch"] == trainer.state.epoch
    assert summary["train_samples_per_second"] == pytest.approx(last["episode"] / runtime, rel=1e-2)
    assert summary["train_steps_per_second"] == pytest.approx(3 / runtime, rel=1e-2)
    state = trainer.state
    assert (state.max_steps, state.num_train_epochs, state.total_flos) == (3, 1, 0.0)
    assert trainer.processing_class is trainer.tokenizer


def test_evaluate_another_dataset_under_another_prefix(grpo, tiny_assets):
    trainer, _, reward, recorder, *_ = grpo
    other = load_from_disk(str(tiny_assets / "prompts"))["train"].select(range(5))
    reward.calls.clear()
    metrics = trainer.evaluate(eval_dataset=other, ignore_keys=["past_key_values"], metric_key_prefix="test")
    # One greedy completion of each prompt of the dataset given, scored by the reward function.
    prompts = [prompt for call, _ in reward.calls for prompt in call]
    rewards = [value for _, values in reward.calls for value in values]
    assert prompts == other["prompt"]
    # beta 0 and one greedy completion per prompt (advantage 0): the training loss's formula gives 0
    assert metrics == {"test_reward": pytest.approx(sum(rewards) / len(rewards)), "test_loss": 0.0}
    rows = read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl"))
    # the registry's eval/reward and eval/loss, renamed
    assert rows[-1] == {"step": 3, "test/reward": metrics["test_reward"], "test/loss": 0.0}
    assert trainer.state.log_history[-1] == rows[-1] and recorder.evaluations[-1] == (3, metrics)
    # The trainer's own eval set, under transformers' default prefix: its 8 prompts.
    reward.calls.clear()
    assert set(trainer.evaluate()) == {"eval_reward", "eval_loss"}
    assert sum(len(prompts) for prompts, _ in reward.calls) == 8
    # Several named sets at once, each under {prefix}_{name} as transformers' Trainer.evaluate names them.
    reward.calls.clear()
    metrics = trainer.evaluate(eval_dataset={"a": other.select(range(2)), "b": other}, metric_key_prefix="test")
    assert set(metrics) == {"test_a_reward", "test_b_reward", "test_a_loss", "test_b_loss"}
    assert [len(prompts) for prompts, _ in reward.calls] == [2, 5]
    rows = read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl"))
    assert rows[-2:] == [
        {"step": 3, "test_a/reward": metrics["test_a_reward"], "test_a/loss": 0.0},
        {"step": 3, "test_b/reward": metrics["test_b_reward"], "test_b/loss": 0.0},
    ]
    with pytest.raises(ConfigError, match="the set name 'x/y' must be a non-empty string without '/'"):
        trainer.evaluate(eval_dataset={"x/y": other})


def test_two_named_eval_sets_are_each_evaluated_on_schedule_and_track_the_best(tiny_assets, tmp_path):
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    args = grpo_config(
        tiny_assets, tmp_path, max_steps=2, eval_strategy="steps", eval_steps=1, metric_for_best_model="hard_reward"
    )
    recorder = Recorder()
    sets = DatasetDict({"easy": dataset["test"].select(range(3)), "hard": dataset["test"].select(range(3, 7))})
    trainer = GRPOTrainer(
        str(tiny_assets / "sft"), Scored(), args, train_dataset=dataset["train"], eval_dataset=sets,
        callbacks=[recorder],
    )  # fmt: skip
    trainer.train()
    rows = read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))
    evaluated = [(row["step"], *row) for row in rows if any(key.startswith("eval") for key in row)]
    easy, hard = ("step", "eval_easy/reward", "eval_easy/loss"), ("step", "eval_hard/reward", "eval_hard/loss")
    assert evaluated == [(1, *easy), (1, *hard), (2, *easy), (2, *hard)]
    returned = [{"eval_easy_reward", "eval_easy_loss"}, {"eval_hard_reward", "eval_hard_loss"}]
    assert [set(metrics) for _, metrics in recorder.evaluations] == returned * 2
    hard = [row["eval_hard/reward"] for row in rows if "eval_hard/reward" in row]
    assert trainer.state.best_metric == max(hard)
    assert trainer.state.best_global_step == 1 + hard.index(max(hard))


def test_streamed_eval_sets_are_read_whole_alone_or_named(tiny_assets, tmp_path):
    # TRL evaluates over a finite IterableDataset: every row of it, alone or in a dict of named sets
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    test = dataset["test"].select(range(6))
    reward = Scored()
    args = grpo_config(tiny_assets, tmp_path, max_steps=1)
    stream = test.to_iterable_dataset()
    trainer = GRPOTrainer(str(tiny_assets / "sft"), reward, args, train_dataset=dataset["train"], eval_dataset=stream)
    assert trainer.eval_dataset is stream and len(trainer.eval_prompts) == 6  # as passed, and read whole
    metrics = trainer.evaluate()
    assert set(metrics) == {"eval_reward", "eval_loss"} and sorted(reward.calls[-1][0]) == sorted(test["prompt"])
    named = {"streamed": test.select(range(3)).to_iterable_dataset(), "held": test.select(range(3, 6))}
    args = grpo_config(tiny_assets, tmp_path, max_steps=1, output_dir=str(tmp_path / "named"))
    trainer = GRPOTrainer(str(tiny_assets / "sft"), reward, args, train_dataset=dataset["train"], eval_dataset=named)
    assert set(trainer.evaluate()) == {
        "eval_streamed_reward",
        "eval_held_reward",
        "eval_streamed_loss",
        "eval_held_loss",
    }
    assert [len(prompts) for prompts, _ in reward.calls[-2:]] == [3, 3]


class LengthReward:
    """A reward of each completion's token count that keeps the completions' token ids, in call order."""

    __name__ = "length"

    def __init__(self):
        self.completion_ids = []

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        self.completion_ids += completion_ids
        return [float(len(ids)) for ids in completion_ids]


def test_eval_loss_is_the_training_loss_on_the_eval_completions(tiny_assets, tmp_path):
    # dr_grpo, beta 0, 2 completions per eval prompt sampled hot (lengths vary), one evaluation batch: the ratio is
    # 1, so the loss is -sum_i A_i n_i / (B * max_completion_length), A normalised within each prompt's pair (unbiased
    # std + 1e-4)
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    reward = LengthReward()
    args = grpo_config(tiny_assets, tmp_path, loss_type="dr_grpo", beta=0.0, num_generations_eval=2,
                       per_device_eval_batch_size=12, max_completion_length=6, temperature=3.0)  # fmt: skip
    eval_set = dataset["test"].select(range(6))
    trainer = GRPOTrainer(
        str(tiny_assets / "sft"), reward, args, train_dataset=dataset["train"], eval_dataset=eval_set
    )
    assert trainer.eval_dataset is eval_set  # the dataset passed, as transformers keeps it
    metrics = trainer.evaluate()
    lengths = torch.tensor([len(ids) for ids in reward.completion_ids], dtype=torch.float64)
    assert len(lengths) == 12 and lengths.max() <= 6
    pairs = lengths.reshape(6, 2)
    advantages = ((pairs - pairs.mean(1, keepdim=True)) / (pairs.std(1, keepdim=True) + 1e-4)).reshape(-1)
    expected = -(advantages * lengths).sum() / (12 * 6)
    assert metrics["eval_loss"] == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    assert expected.abs() > 1e-3  # the case tests something: the pairs' lengths differ

    greedy = grpo_config(tiny_assets, tmp_path, beta=0.0, output_dir=str(tmp_path / "greedy"))
    trainer = GRPOTrainer(
        str(tiny_assets / "sft"), reward, greedy, train_dataset=dataset["train"], eval_dataset=eval_set
    )
    assert trainer.evaluate()["eval_loss"] == 0.0  # one greedy completion per prompt: advantage 0, and no KL term


def test_log_takes_start_time(grpo):
    trainer, *_ = grpo
    trainer.log({"custom/value": 2.5}, start_time=0.0)  # no speed metrics: include_num_input_tokens_seen is off
    assert trainer.state.log_history[-1] == {"step": 3, "custom/value": 2.5}


def test_state_can_be_replaced_as_transformers_trainer_s_attribute(tiny_assets, tmp_path):
    # transformers' Trainer.state is a plain attribute: a test or callback that assigns a new TrainerState sees the
    # run's steps and rows go into it, and the callbacks get it
    from transformers import TrainerState

    recorder = Recorder()
    args = grpo_config(tiny_assets, tmp_path, max_steps=2, logging_steps=1)
    train = load_from_disk(str(tiny_assets / "prompts"))["train"]
    trainer = GRPOTrainer(str(tiny_assets / "sft"), Scored(), args, train_dataset=train, callbacks=[recorder])
    replaced = TrainerState(max_steps=2)
    trainer.state = replaced
    trainer.train()
    assert trainer.state is replaced and replaced.global_step == 2
    assert [row["step"] for row in replaced.log_history] == [1, 2, 2] and "train_loss" in replaced.log_history[-1]
    assert recorder.logs[-1] == (2, {k: v for k, v in replaced.log_history[-1].items() if k != "step"})


class FakeHub:
    """huggingface_hub.HfApi, recording what push_to_hub asks of it."""

    calls = []

    def __init__(self, token=None):
        self.calls.append(("init", {"token": token}))

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))
        return "future" if kwargs["run_as_future"] else "commit"


def test_push_to_hub_passes_blocking_and_upload_keywords(grpo, monkeypatch):
    import huggingface_hub

    trainer, *_ = grpo
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHub)
    FakeHub.calls = []
    result = trainer.push_to_hub(
        "tiny run",
        blocking=False,
        token="hf_x",
        revision="dev",
        private=True,
        ignore_patterns="*.jsonl",
        create_pr=True,
        dataset_name="tiny",  # TRL's scripts pass it, for transformers' model card
    )
    assert result == "future"
    (_, init), (_, created), (_, upload) = FakeHub.calls
    assert init == {"token": "hf_x"} and created["private"] is True and created["exist_ok"] is True
    assert upload["run_as_future"] is True and upload["revision"] == "dev" and upload["create_pr"] is True
    assert upload["commit_message"] == "tiny run" and upload["folder_path"] == trainer.args.output_dir
    assert upload["ignore_patterns"] == ["*.jsonl", ".rlhfkit.lock", ".rlhfkit.mutex"]
    assert created["repo_id"] == upload["repo_id"] == os.path.basename(trainer.args.output_dir)
    FakeHub.calls = []
    assert trainer.push_to_hub() == "commit"
    assert FakeHub.calls[-1][1]["run_as_future"] is False
    assert FakeHub.calls[-1][1]["ignore_patterns"] == [".rlhfkit.lock", ".rlhfkit.mutex"]
    FakeHub.calls = []
    with pytest.raises(ConfigError, match=r"push_to_hub\(repo_type=\.\.\.\): not a keyword"):
        trainer.push_to_hub(repo_type="dataset")
    assert FakeHub.calls == []  # refused before anything is asked of the hub


def test_ppo_train_returns_the_mean_loss_it_logged(tiny_assets, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "tokenizer")
    reward_model, _ = load_reward_model(str(tiny_assets / "reward"), tokenizer, torch.float32, flag="reward")
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    args = PPOConfig(
        output_dir=str(tmp_path / "ppo"),
        report_to=["none"],
        total_episodes=24,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,  # an update of 8 episodes, two micro-batches
        num_mini_batches=1,
        response_length=8,
        num_sample_generations=0,
        save_steps=0,
        logging_steps=1,
        per_device_eval_batch_size=8,
    )
    trainer = PPOTrainer(
        args=args,
        processing_class=tokenizer,
        model=AutoModelForCausalLM.from_pretrained(tiny_assets / "sft"),
        reward_model=reward_model,
        train_dataset=dataset["train"],
        eval_dataset=dataset["test"].select(range(8)),
    )
    output = trainer.train()
    rows = read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))
    losses = [row["loss/total_avg"] for row in rows if "loss/total_avg" in row]  # one row per update
    assert output.global_step == 3 and len(losses) == 3
    assert output.training_loss == pytest.approx(sum(losses) / 3, rel=1e-9, abs=1e-12)
    assert set(trainer.state.log_history[-1]) == SUMMARY | {"step"} and rows[-1] == trainer.state.log_history[-1]
    assert output.metrics["train_steps_per_second"] == pytest.approx(3 / output.metrics["train_runtime"], rel=1e-2)
    metrics = trainer.evaluate(eval_dataset=dataset["train"].select(range(4)), metric_key_prefix="test")
    assert set(metrics) == {"test_scores"} and read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))[-1] == {
        "step": 3,
        "test/scores": metrics["test_scores"],
    }
    assert trainer.processing_class is tokenizer


@pytest.mark.parametrize(
    "argument, value, match",
    [
        ("environment_factory", len, r"environment_factory\(\) raised TypeError.*without arguments"),
        ("rollout_func", 123, r"rollout_func must be a function rollout_func\(prompts, trainer\)"),
    ],
)
def test_agent_arguments_are_checked_before_the_run_starts(tiny_assets, tmp_path, argument, value, match):
    dataset = load_from_disk(str(tiny_assets / "prompts"))["train"]
    with pytest.raises(ConfigError, match=match):
        GRPOTrainer(str(tiny_assets / "sft"), len, grpo_config(tiny_assets, tmp_path), dataset, **{argument: value})
    assert not (tmp_path / "run").exists()  # refused before the run directory


def test_tools_need_documented_functions_and_conversational_prompts(tiny_assets, tmp_path):
    dataset = load_from_disk(str(tiny_assets / "prompts"))["train"]
    with pytest.raises(ConfigError, match="tool 'len'.*Google-style docstring"):  # a builtin has no typed docstring
        GRPOTrainer(str(tiny_assets / "sft"), len, grpo_config(tiny_assets, tmp_path), dataset, tools=[len])

    def double(x: int) -> int:
        """Doubles a number.

        Args:
            x: The number.
        """
        return 2 * x

    with pytest.raises(ConfigError, match="tools=...\\) needs conversational prompts"):  # the tiny task's are text
        GRPOTrainer(str(tiny_assets / "sft"), len, grpo_config(tiny_assets, tmp_path), dataset, tools=[double])


def test_max_tool_calling_iterations_is_a_count_or_unset():
    assert GRPOConfig(max_tool_calling_iterations=None, report_to=["none"]).max_tool_calling_iterations is None
    assert GRPOConfig(max_tool_calling_iterations=3, report_to=["none"]).max_tool_calling_iterations == 3
    with pytest.raises(ConfigError, match="max_tool_calling_iterations=-1"):
        GRPOConfig(max_tool_calling_iterations=-1, report_to=["none"])
