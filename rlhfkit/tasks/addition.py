"""Two-digit addition: "37+45=" -> "82"."""

from __future__ import annotations

import random

from .base import Task, generic_corruption, positional_credit

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


def check(prompt: str, completion: str) -> bool:
    """True iff the completion, stripped of surrounding whitespace, is exactly the sum's decimal digits."""
    return completion.strip() == answer(prompt)


def correctness(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """1.0 for a correct completion, else 0.0."""
    return [float(check(p, c)) for p, c in zip(prompts, completions, strict=True)]


def partial_credit(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """Fraction of positions matching the sum's digits (see `positional_credit`); 1.0 iff correct."""
    return [positional_credit(c, answer(p)) for p, c in zip(prompts, completions, strict=True)]


def corrupt(prompt: str, answer_text: str, rng: random.Random) -> str:
    """Near misses: off-by-one or off-by-ten sums, plus the generic character edits."""
    if rng.random() < 0.5:
        wrong = str(int(answer_text) + rng.choice([-11, -10, -9, -1, 1, 9, 10, 11]))
        if wrong != answer_text:
            return wrong
    return generic_corruption(answer_text, DIGITS, rng)


TASK = Task(
    name="addition",
    make_example=make_example,
    answer=answer,
    check=check,
    reward_funcs={"correctness": correctness, "partial_credit": partial_credit},
    corrupt=corrupt,
    max_new_tokens=5,
    refs={
        "check": f"{__name__}:check",
        "correctness": f"{__name__}:correctness",
        "partial_credit": f"{__name__}:partial_credit",
    },
)
