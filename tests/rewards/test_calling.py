"""Reward functions behind TRL's calling convention: what score_completions accepts (sync and async functions), and
what it refuses."""

import asyncio
import gc
import math

import numpy as np
import pytest
import torch

from rlhfkit.errors import RewardFunctionError
from rlhfkit.rewards.calling import score_completions, weighted_total

PROMPTS = ["p0", "p1", "p2", "p3"]
COMPLETIONS = ["c0", "c1", "c2", "c3"]


def returning(values):
    def reward(prompts, completions, **kwargs):
        return values

    return reward


def call_reward_function(name, fn, prompts=PROMPTS, completions=COMPLETIONS):
    """One reward function's RewardOutput, called as the trainers call it (score_completions with it alone)."""
    return score({name: fn}, prompts, completions)[0]


def test_numbers_of_any_kind_become_float64_and_none_is_not_applicable():
    out = call_reward_function("r", returning([1, np.float32(0.5), torch.tensor(2.0), None]), PROMPTS, COMPLETIONS)
    assert out.values.dtype == torch.float64
    assert out.values[:3].tolist() == [1.0, 0.5, 2.0] and math.isnan(out.values[3])
    assert out.applicable.tolist() == [True, True, True, False]


def test_nan_means_not_applicable_like_none():
    """TRL's convention: its GRPO combines reward functions with nansum / nanmean, so NaN is "does not apply"."""
    nan = call_reward_function("r", returning([1.0, math.nan, np.nan, torch.tensor(math.nan)]), PROMPTS, COMPLETIONS)
    none = call_reward_function("r", returning([1.0, None, None, None]), PROMPTS, COMPLETIONS)
    assert nan.applicable.tolist() == none.applicable.tolist() == [True, False, False, False]
    torch.testing.assert_close(nan.values, none.values, equal_nan=True)
    # Left out of the weighted total exactly as None is: completion 1 is scored by the second function only.
    other = call_reward_function("s", returning([0.0, 3.0, 3.0, 3.0]), PROMPTS, COMPLETIONS)
    assert weighted_total([nan, other], [1.0, 2.0], PROMPTS).tolist() == [1.0, 6.0, 6.0, 6.0]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, np.float64("-inf")])
def test_infinite_rewards_name_the_function_and_the_completion(bad):
    with pytest.raises(RewardFunctionError, match=r"'grader' returned -?inf for completion 2; rewards must be finite"):
        call_reward_function("grader", returning([0.0, 1.0, bad, 0.0]), PROMPTS, COMPLETIONS)


def test_a_value_that_is_not_a_number_names_the_completion():
    with pytest.raises(RewardFunctionError, match=r"'grader' returned 'good' \(str\) for completion 1"):
        call_reward_function("grader", returning([0.0, "good", 1.0, 1.0]), PROMPTS, COMPLETIONS)


# ------------------------------------------------------------------------------------------------
# async reward functions (TRL awaits them, the async ones of one call concurrently)
# ------------------------------------------------------------------------------------------------


def score(funcs, prompts=PROMPTS, completions=COMPLETIONS, rows=None):
    """score_completions over `funcs` (name -> function) for 4 completions of 2 tokens each."""
    n = len(completions)
    ids, mask = torch.arange(2 * n).view(n, 2), torch.ones(n, 2, dtype=torch.bool)
    rows = rows or [{"prompt": p, "answer": f"a{i}"} for i, p in enumerate(prompts)]
    return score_completions(
        list(funcs), list(funcs.values()), rows, prompts, completions, (ids, mask), (ids, mask), "prompt"
    )


def meeting():
    """Two async reward functions that can only finish if they run at the same time: each waits for the other."""
    arrived = {}

    async def meet(me, other):
        arrived.setdefault(me, asyncio.Event()).set()
        await asyncio.wait_for(arrived.setdefault(other, asyncio.Event()).wait(), timeout=5)

    async def first(prompts, completions, answer, **kwargs):
        await meet("first", "second")
        return [float(i) for i in range(len(completions))]

    async def second(prompts, completions, completion_ids, **kwargs):
        await meet("second", "first")
        return [None if i % 2 else len(ids) * 10.0 for i, ids in enumerate(completion_ids)]

    return first, second


def test_async_functions_are_awaited_together_and_results_keep_their_order():
    first, second = meeting()
    sync = returning([1.0, None, math.nan, 2.0])
    outputs = score({"first": first, "sync": sync, "second": second})
    assert [o.applicable.tolist() for o in outputs] == [
        [True, True, True, True],
        [True, False, False, True],
        [True, False, True, False],
    ]
    assert outputs[0].values.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert outputs[1].values[[0, 3]].tolist() == [1.0, 2.0]
    assert outputs[2].values[[0, 2]].tolist() == [20.0, 20.0]
    assert all(o.values.dtype == torch.float64 for o in outputs)


def test_async_functions_run_in_a_worker_thread_under_a_running_event_loop():
    first, second = meeting()

    async def caller():  # a notebook, or an async program, calling the trainer: its loop cannot be re-entered
        return score({"first": first, "second": second})

    outputs = asyncio.run(caller())
    assert outputs[0].values.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert outputs[1].applicable.tolist() == [True, False, True, False]


def test_async_callable_objects_and_call_reward_function():
    class Judge:
        __name__ = "judge"

        async def __call__(self, prompts, completions, **kwargs):
            await asyncio.sleep(0)
            return np.array([0.5, np.nan, 1.0, 0.0])

    out = call_reward_function("judge", Judge(), PROMPTS, COMPLETIONS)
    assert out.applicable.tolist() == [True, False, True, True]
    assert score({"judge": Judge()})[0].values[[0, 2, 3]].tolist() == [0.5, 1.0, 0.0]


async def async_returning_three(prompts, completions, **kwargs):
    return [0.0, 1.0, 2.0]


async def async_raising(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    raise RuntimeError("the judge is down")


async def async_returning_text(prompts, completions, **kwargs):
    return ["good"] * len(completions)


@pytest.mark.parametrize(
    "fn, needle",
    [
        (async_returning_three, "'bad' returned 3 values for 4 completions"),
        (async_raising, "'bad' raised RuntimeError: the judge is down"),
        (async_returning_text, r"'bad' returned 'good' (str) for completion 0"),
    ],
)
def test_async_functions_are_checked_like_sync_ones(fn, needle):
    with pytest.raises(RewardFunctionError) as info:
        score({"ok": returning([1.0] * 4), "bad": fn})
    assert needle in str(info.value)
    with pytest.raises(RewardFunctionError) as info:
        call_reward_function("bad", fn, PROMPTS, COMPLETIONS)
    assert needle in str(info.value)


def test_the_first_failing_async_function_in_order_is_reported():
    with pytest.raises(RewardFunctionError, match="'one' raised RuntimeError"):
        score({"one": async_raising, "two": async_returning_three, "three": async_raising})


def test_a_failing_sync_function_leaves_no_unawaited_coroutine(recwarn):
    with pytest.raises(RewardFunctionError, match="'sync' returned 3 values"):
        score({"judge": async_returning_three, "sync": returning([1.0] * 3)})
    gc.collect()
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_columns_named_like_parameters_reach_the_functions():
    """Dataset columns may be called anything, "name" and "fn" included."""

    def reward(prompts, completions, name, fn, **kwargs):
        return [float(n == f) for n, f in zip(name, fn)]

    rows = [{"prompt": p, "name": i, "fn": 1} for i, p in enumerate(PROMPTS)]
    assert score({"r": reward}, rows=rows)[0].values.tolist() == [0.0, 1.0, 0.0, 0.0]
