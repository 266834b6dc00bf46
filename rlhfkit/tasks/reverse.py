"""String reversal: "rev kqzt=" -> "tzqk"."""

from __future__ import annotations

import random
import string

from .base import Task, answer_rules, generic_corruption

PREFIX = "rev "
SUFFIX = "="
LETTERS = string.ascii_lowercase
MIN_LEN, MAX_LEN = 3, 6


def make_example(rng: random.Random) -> tuple[str, str]:
    letters = "".join(rng.choice(LETTERS) for _ in range(rng.randint(MIN_LEN, MAX_LEN)))
    prompt = f"{PREFIX}{letters}{SUFFIX}"
    return prompt, answer(prompt)


def answer(prompt: str) -> str:
    """The letters between "rev " and "=", reversed."""
    body = prompt.strip()
    if not (body.startswith(PREFIX) and body.endswith(SUFFIX)):
        raise ValueError(f"not a reverse prompt: {prompt!r}")
    return body[len(PREFIX) : -len(SUFFIX)][::-1]


# check: the stripped completion equals answer(prompt) (the reversed letters); rewards as TRL expects.
rules = answer_rules(answer, __name__)
check, correctness, partial_credit = rules


def corrupt(prompt: str, answer_text: str, rng: random.Random) -> str:
    """Near misses, including the input copied unreversed."""
    letters = prompt.strip()[len(PREFIX) : -len(SUFFIX)]
    if rng.random() < 0.2 and letters != answer_text:
        return letters
    return generic_corruption(answer_text, LETTERS, rng)


TASK = Task("reverse", make_example, answer, check, rules.reward_funcs, corrupt, max_new_tokens=MAX_LEN + 2)
