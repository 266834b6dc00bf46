"""Reward functions behind TRL's calling convention: what call_reward_function accepts, and what it refuses."""

import math

import numpy as np
import pytest
import torch

from rlhfkit.rewards import RewardFunctionError, call_reward_function, weighted_total

PROMPTS = ["p0", "p1", "p2", "p3"]
COMPLETIONS = ["c0", "c1", "c2", "c3"]


def returning(values):
    def reward(prompts, completions, **kwargs):
        return values

    return reward


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
