"""Reward functions with a flaw, for the labelled run set (``--reward_funcs bench.health.rewards:NAME``, run from the
repository root). Each pays for something other than a correct answer, or pays nothing that varies. They take plain
completions and conversational ones (lists of messages)."""

from __future__ import annotations

from collections import Counter


def _text(completion) -> str:
    """A completion's text: as given, or a conversational completion's (TRL's list of messages) last content."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def checks_only_order(prompts, completions, **kwargs):
    """1 for digits in ascending order, whatever they are: a grader that forgot to check the answer is a
    permutation of the prompt's digits, so "0000" earns as much as the right answer."""
    out = []
    for completion in completions:
        digits = _text(completion).strip()
        out.append(float(bool(digits) and digits.isdigit() and list(digits) == sorted(digits)))
    return out


def pays_for_repeats(prompts, completions, **kwargs):
    """The share of characters equal to the most common one: "1111111" earns 1."""
    out = []
    for completion in completions:
        text = _text(completion).strip()
        out.append(Counter(text).most_common(1)[0][1] / len(text) if text else 0.0)
    return out


def always_one(prompts, completions, **kwargs):
    """Every completion earns 1: a task too easy for the reward to tell completions apart."""
    return [1.0] * len(completions)


def never(prompts, completions, **kwargs):
    """Nothing ever earns anything: a task too hard for the model (or a grader that always fails)."""
    return [0.0] * len(completions)
