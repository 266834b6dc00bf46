"""Reward functions get TRL 1.16's trainer_state, log_extra and log_metric (trl/trainer/grpo_trainer.py:
_calculate_rewards passes them; _log_completion_extra and _log_metric collect; the completions table and the metrics
flush them), through RewardSources; a reward model scores text padded with a [PAD] its embeddings lack."""

import math

import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerState

from rlhfkit.errors import RewardFunctionError
from rlhfkit.rewards import LoggedMetricsWindow, RewardModelFunction, RewardSources, takes_trainer_kwargs

PROMPTS = ["p0", "p1", "p2"]
COMPLETIONS = ["c", "cc", "ccc"]


def sources(*funcs, weights=None):
    return RewardSources([f.__name__ for f in funcs], list(funcs), weights, "prompt")


def score(rewards, completions=COMPLETIONS, state=None, answers=None):
    n = len(completions)
    ids, mask = torch.arange(2 * n).view(n, 2), torch.ones(n, 2, dtype=torch.bool)
    rows = [{"prompt": f"p{i}", "answer": a} for i, a in enumerate(answers or [f"a{i}" for i in range(n)])]
    prompts = [r["prompt"] for r in rows]
    return rewards.score(rows, prompts, completions, (ids, mask), (ids, mask), trainer_state=state)


def test_a_function_with_kwargs_gets_the_trainer_state_and_both_loggers():
    seen = {}

    def length(prompts, completions, **kwargs):
        seen.update(kwargs)
        kwargs["log_extra"]("length", [len(c) for c in completions])
        kwargs["log_metric"]("length/max", max(len(c) for c in completions))
        return [float(len(c)) for c in completions]

    state = TrainerState(global_step=7)
    rewards = sources(length)
    (out,) = score(rewards, state=state)
    assert out.values.tolist() == [1.0, 2.0, 3.0]
    assert seen["trainer_state"] is state and seen["trainer_state"].global_step == 7
    assert callable(seen["log_extra"]) and callable(seen["log_metric"])
    assert seen["answer"] == ["a0", "a1", "a2"] and seen["completion_ids"] == [[0, 1], [2, 3], [4, 5]]
    assert rewards.take_logged() == ({"length": [1, 2, 3]}, {"length/max": [3.0]})
    assert rewards.take_logged() == ({}, {})  # taken: forgotten


def test_functions_without_kwargs_get_only_what_they_name():
    def strict(prompts, completions, completion_ids, answer):  # today's columns exactly, no **kwargs
        return [0.0] * len(completions)

    def stateful(prompts, completions, completion_ids, answer, trainer_state):
        return [float(trainer_state.global_step)] * len(completions)

    assert takes_trainer_kwargs(strict) == frozenset()
    assert takes_trainer_kwargs(stateful) == {"trainer_state"}
    outputs = score(sources(strict, stateful), state=TrainerState(global_step=3))
    assert [o.values.tolist() for o in outputs] == [[0.0] * 3, [3.0] * 3]


def test_extra_columns_are_collected_per_completion_in_order_across_calls():
    """One value per completion scored since take_logged, in scoring order; None where a call did not log the column
    (TRL pads a column a process did not log with None)."""
    calls = iter([("first", True), ("second", False), ("third", True)])

    def tagged(prompts, completions, answer, **kwargs):
        label, log = next(calls)
        if log:
            kwargs["log_extra"]("answer_seen", list(answer))
        kwargs["log_extra"]("call", [label] * len(completions))
        return [1.0] * len(completions)

    async def later(prompts, completions, **kwargs):  # async functions log too
        kwargs["log_extra"]("async_len", [len(c) for c in completions])
        return [0.5] * len(completions)

    rewards = sources(tagged, later)
    score(rewards, answers=["x0", "x1", "x2"])
    score(rewards, completions=["d", "dd"], answers=["y0", "y1"])
    score(rewards, completions=["e"], answers=["z0"])
    extra, metrics = rewards.take_logged()
    assert extra == {
        "answer_seen": ["x0", "x1", "x2", None, None, "z0"],
        "call": ["first"] * 3 + ["second"] * 2 + ["third"],
        "async_len": [1, 2, 3, 1, 2, 1],
    }
    assert metrics == {}


def test_a_column_with_a_value_per_completion_missing_names_the_function_and_the_column():
    def short(prompts, completions, **kwargs):
        kwargs["log_extra"]("judge", ["only one"])
        return [1.0] * len(completions)

    def twice(prompts, completions, **kwargs):
        kwargs["log_extra"]("judge", list(completions))
        return [1.0] * len(completions)

    with pytest.raises(RewardFunctionError, match=r"'short' logged 1 values of column 'judge' .* for 3 completions"):
        score(sources(short))
    # Two functions filling one column would misalign it (TRL extends it twice): also an error, naming both.
    with pytest.raises(RewardFunctionError, match=r"'short and twice' logged 4 values"):
        score(sources(short, twice))
    with pytest.raises(RewardFunctionError, match="one value per completion"):
        score(sources(_logging_extra("judge", "text")))


def _logging_extra(column, values):
    def bad(prompts, completions, **kwargs):
        kwargs["log_extra"](column, values)
        return [1.0] * len(completions)

    return bad


def test_a_metric_named_like_one_rlhfkit_logs_is_refused():
    def shadow(prompts, completions, **kwargs):
        kwargs["log_metric"]("reward", 1.0)
        return [1.0] * len(completions)

    with pytest.raises(RewardFunctionError, match=r"'reward' is a metric rlhfkit logs itself"):
        score(sources(shadow))

    def evaluated(prompts, completions, **kwargs):
        kwargs["log_metric"]("task_success", 1.0)  # an evaluation would log it as eval/task_success, rlhfkit's own
        return [1.0] * len(completions)

    with pytest.raises(RewardFunctionError, match=r"or eval/task_success is"):
        score(sources(evaluated))

    def own(prompts, completions, **kwargs):
        kwargs["log_metric"]("rewards/own/mean", 1.0)
        return [1.0] * len(completions)

    with pytest.raises(RewardFunctionError, match="rewards/own/mean"):
        score(sources(own))

    def text(prompts, completions, **kwargs):
        kwargs["log_metric"]("mine", "high")
        return [1.0] * len(completions)

    with pytest.raises(RewardFunctionError, match="must be a real number"):
        score(sources(text))


def test_log_metric_is_averaged_as_trl_averages_it():
    """TRL 1.16: each generation's values -> sum / count over the processes (one value per generation), then the
    logging window's generations are averaged, NaN left out."""
    values = iter([[1.0, 3.0], [4.0], [float("nan")], [2.0]])

    def judged(prompts, completions, **kwargs):
        for value in next(values):
            kwargs["log_metric"]("judge/score", value)
        return [1.0] * len(completions)

    rewards, acc, window = sources(judged), Accelerator(cpu=True), LoggedMetricsWindow()
    per_generation = []
    for _ in range(3):
        score(rewards)
        _, metrics = rewards.take_logged()
        per_generation.append(rewards.pool_metrics(metrics, acc))
        window.add(per_generation[-1])
    assert per_generation[:2] == [{"judge/score": 2.0}, {"judge/score": 4.0}]
    assert math.isnan(per_generation[2]["judge/score"])
    assert window.reduce() == {"judge/score": 3.0}  # (2 + 4) / 2, the NaN generation left out; not 8 / 3 pooled
    score(rewards)
    window.add(rewards.pool_metrics(rewards.take_logged()[1], acc))
    assert window.reduce() == {"judge/score": 2.0}  # a fresh window
    only_nan = LoggedMetricsWindow()
    only_nan.add({"judge/score": float("nan")})
    assert only_nan.reduce() == {}  # no finite value: left out of the row (TRL logs None)


def test_no_function_taking_log_metric_needs_no_collective():
    def plain(prompts, completions, completion_ids, answer):
        return [1.0] * len(completions)

    class NoCollectives:  # an accelerator that fails any collective
        num_processes, device = 2, "cpu"

        def reduce(self, *args, **kwargs):
            raise AssertionError("no collective expected")

    rewards = sources(plain)
    score(rewards)
    assert rewards.pool_metrics(rewards.take_logged()[1], NoCollectives()) == {}


def test_a_reward_model_scores_text_padded_with_a_pad_beyond_its_embeddings(tiny_assets):
    """TRL's ppo.py adds [PAD] without resizing: re-tokenized, padded text must score as each text alone does."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "tokenizer")
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    model = AutoModelForSequenceClassification.from_pretrained(tiny_assets / "reward", num_labels=1).eval()
    assert tokenizer.pad_token_id >= model.get_input_embeddings().num_embeddings
    reward = RewardModelFunction(model, tokenizer, "reward", same_vocab=False)
    prompts, completions = ["sort 21=", "sort 4132="], ["12<eos>", "1234"]
    together = reward(prompts, completions)
    alone = [reward([p], [c])[0] for p, c in zip(prompts, completions)]
    assert together == pytest.approx(alone, abs=1e-5)
