"""Digit sorting: "sort 52913=" -> "12359".

Checking is easier than doing here: a reward model can see "sorted?" and "same digits as the prompt?" locally,
while the policy must produce the whole permutation. That makes it the built-in task for PPO with a learned
reward model (measurements in docs and `task.json`).
"""

from __future__ import annotations

import random

from .base import Task, answer_rules, generic_corruption

PREFIX = "sort "
SUFFIX = "="
DIGITS = "0123456789"
MIN_LEN, MAX_LEN = 4, 6


def make_example(rng: random.Random) -> tuple[str, str]:
    digits = "".join(rng.choice(DIGITS) for _ in range(rng.randint(MIN_LEN, MAX_LEN)))
    prompt = f"{PREFIX}{digits}{SUFFIX}"
    return prompt, answer(prompt)


def answer(prompt: str) -> str:
    """The digits between "sort " and "=", sorted ascending."""
    body = prompt.strip()
    if not (body.startswith(PREFIX) and body.endswith(SUFFIX)):
        raise ValueError(f"not a sort prompt: {prompt!r}")
    return "".join(sorted(body[len(PREFIX) : -len(SUFFIX)]))


# check: the stripped completion equals answer(prompt) (the sorted digits); rewards as TRL expects.
rules = answer_rules(answer, __name__)
check, correctness, partial_credit = rules


def corrupt(prompt: str, answer_text: str, rng: random.Random) -> str:
    """Near misses, including the tempting ones: sorted but with a wrong digit, and the input left unsorted."""
    digits = prompt.strip()[len(PREFIX) : -len(SUFFIX)]
    kind = rng.randrange(4)
    if kind == 0 and digits != answer_text:  # copied the input
        return digits
    if kind == 1:  # sorted, but not a permutation of the input
        wrong = generic_corruption(answer_text, DIGITS, rng)
        wrong = "".join(sorted(wrong)) if wrong and rng.random() < 0.8 else wrong
        if wrong != answer_text:
            return wrong
    return generic_corruption(answer_text, DIGITS, rng)


TASK = Task("sort", make_example, answer, check, rules.reward_funcs, corrupt, max_new_tokens=MAX_LEN + 2)
