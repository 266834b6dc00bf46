"""Two-digit addition: "37+45=" -> "82"."""

from __future__ import annotations

import random

from .base import Task, answer_rules, generic_corruption

DIGITS = "0123456789"


def make_example(rng: random.Random) -> tuple[str, str]:
    prompt = f"{rng.randint(10, 99)}+{rng.randint(10, 99)}="
    return prompt, answer(prompt)


def answer(prompt: str) -> str:
    """The decimal sum of the two operands of "a+b="."""
    body = prompt.strip()
    left, plus, right = body.rstrip("=").partition("+")
    if not (plus and body.endswith("=") and left.isdigit() and right.isdigit()):
        raise ValueError(f"not an addition prompt: {prompt!r}")
    return str(int(left) + int(right))


# check: the stripped completion equals answer(prompt) (the sum's decimal digits); rewards as TRL expects.
rules = answer_rules(answer, __name__)
check, correctness, partial_credit = rules


def corrupt(prompt: str, answer_text: str, rng: random.Random) -> str:
    """Near misses: off-by-one or off-by-ten sums, plus the generic character edits."""
    if rng.random() < 0.5:
        wrong = str(int(answer_text) + rng.choice([-11, -10, -9, -1, 1, 9, 10, 11]))
        if wrong != answer_text:
            return wrong
    return generic_corruption(answer_text, DIGITS, rng)


TASK = Task("addition", make_example, answer, check, rules.reward_funcs, corrupt, max_new_tokens=5)
