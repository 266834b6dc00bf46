"""Reward functions for the GRPO tests, importable as ``tests.trainers.grpo_rewards:NAME`` (module:function).

`recorded_length` records what it is called with (one JSON line per call, per process) into the file named by
$RLHFKIT_TEST_RECORD, so tests can recompute the logged metrics from the raw rewards independently.
"""

import json
import os


def recorded_length(prompts, completions, completion_ids, **kwargs):
    """Reward = completion length in characters / 10; records the call."""
    rewards = [len(c) / 10 for c in completions]
    path = os.environ.get("RLHFKIT_TEST_RECORD")
    if path:
        rank = int(os.environ.get("RANK", "0"))
        with open(f"{path}.rank{rank}", "a") as f:
            call = {
                "prompts": prompts,
                "rewards": rewards,
                "completion_ids": completion_ids,
                "answer": kwargs.get("answer"),
            }
            f.write(json.dumps(call))
            f.write("\n")
    return rewards


def half_none(prompts, completions, **kwargs):
    """1.0 on even completions, None (not applicable) on odd ones."""
    return [1.0 if i % 2 == 0 else None for i in range(len(completions))]


def raises(prompts, completions, **kwargs):
    raise RuntimeError("the grader is down")


def too_short(prompts, completions, **kwargs):
    return [0.0] * (len(completions) - 1)


def not_a_number(prompts, completions, **kwargs):
    return ["good"] * len(completions)


def always_none(prompts, completions, **kwargs):
    return [None] * len(completions)


def overflowing_reward(prompts, completions, **kwargs):
    """A finite reward so large that a group's mean overflows to inf: the advantages and the loss become NaN."""
    return [1e308] * len(completions)
