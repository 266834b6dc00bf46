"""String reversal: "rev kqzt=" -> "tzqk"."""

from __future__ import annotations

import random
import string

from .base import Task, generic_corruption, positional_credit

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


def check(prompt: str, completion: str) -> bool:
    """True iff the completion, stripped of surrounding whitespace, is exactly the reversed letters."""
    return completion.strip() == answer(prompt)


def correctness(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """1.0 for a correct completion, else 0.0."""
    return [float(check(p, c)) for p, c in zip(prompts, completions, strict=True)]


def partial_credit(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """Fraction of positions matching the reversed letters (see `positional_credit`); 1.0 iff correct."""
    return [positional_credit(c, answer(p)) for p, c in zip(prompts, completions, strict=True)]


def corrupt(prompt: str, answer_text: str, rng: random.Random) -> str:
    """Near misses, including the input copied unreversed."""
    letters = prompt.strip()[len(PREFIX) : -len(SUFFIX)]
    if rng.random() < 0.2 and letters != answer_text:
        return letters
    return generic_corruption(answer_text, LETTERS, rng)


TASK = Task(
    name="reverse",
    make_example=make_example,
    answer=answer,
    check=check,
    reward_funcs={"correctness": correctness, "partial_credit": partial_credit},
    corrupt=corrupt,
    max_new_tokens=MAX_LEN + 2,
    refs={
        "check": f"{__name__}:check",
        "correctness": f"{__name__}:correctness",
        "partial_credit": f"{__name__}:partial_credit",
    },
)
