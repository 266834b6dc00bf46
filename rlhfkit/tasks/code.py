"""Tiny programs from a spec: "code: x mul 3 add 1=" -> "f=lambda x: x*3+1", scored by running unit tests.

The prompt names one to three operations (add, sub, mul) with single-digit constants, applied as Python reads the
expression (mul binds tighter). The completion is a Python program that defines f; the dataset's ``tests`` column
holds asserts on f at a few inputs, and the reward is rlhfkit.sandbox's code_reward: the program runs in the sandbox
with the tests and earns the fraction it passes. So an equivalent program ("f=lambda x: 1+x*3") earns full credit, and a
program that is wrong at some inputs earns partial credit.

The checker (task success, the judge) is the usual exact match with the reference program, a stricter measure than the
reward; the reward is what the sandbox measures. Every character of both fits the built-in tokenizer's alphabet.
"""

from __future__ import annotations

import random

from rlhfkit.sandbox.reward import code_reward

from .base import Task, answer_rules, generic_corruption

PREFIX = "code: x"
SUFFIX = "="
PROGRAM_PREFIX = "f=lambda x: x"
OPS = {"add": "+", "sub": "-", "mul": "*"}
CONSTANTS = "123456789"
MIN_OPS, MAX_OPS = 1, 3
TEST_INPUTS = (0, 1, 3, 7)


def make_example(rng: random.Random) -> tuple[str, str]:
    steps = [(rng.choice(list(OPS)), rng.choice(CONSTANTS)) for _ in range(rng.randint(MIN_OPS, MAX_OPS))]
    prompt = PREFIX + "".join(f" {word} {k}" for word, k in steps) + SUFFIX
    return prompt, answer(prompt)


def spec(prompt: str) -> list[tuple[str, int]]:
    """The (operator symbol, constant) pairs a prompt asks for, in order; ValueError for anything else."""
    body = prompt.strip()
    if not (body.startswith(PREFIX) and body.endswith(SUFFIX)):
        raise ValueError(f"not a code prompt: {prompt!r}")
    words = body[len(PREFIX) : -len(SUFFIX)].split()
    if not words or len(words) % 2 or len(words) > 2 * MAX_OPS:
        raise ValueError(f"not a code prompt: {prompt!r}")
    pairs = list(zip(words[::2], words[1::2]))
    if any(word not in OPS or k not in CONSTANTS or len(k) != 1 for word, k in pairs):
        raise ValueError(f"not a code prompt: {prompt!r}")
    return [(OPS[word], int(k)) for word, k in pairs]


def answer(prompt: str) -> str:
    """The reference program: "f=lambda x: x" followed by each operation's symbol and constant."""
    return PROGRAM_PREFIX + "".join(f"{op}{k}" for op, k in spec(prompt))


def value(prompt: str, x: int) -> int:
    """What the prompt's function gives at x, with Python's precedence (mul before add and sub), computed here from the
    spec: the expected values of the tests never come from running code."""
    terms = [x]  # summands; a mul multiplies the last one
    for op, k in spec(prompt):
        if op == "*":
            terms[-1] *= k
        else:
            terms.append(k if op == "+" else -k)
    return sum(terms)


def tests(prompt: str) -> str:
    """The unit tests of a prompt: one assert per input of TEST_INPUTS."""
    return "\n".join(f"assert f({x}) == {value(prompt, x)}" for x in TEST_INPUTS)


def columns(prompt: str) -> dict[str, str]:
    """The dataset columns beside prompt and answer: the tests code_reward runs."""
    return {"tests": tests(prompt)}


# check: the stripped completion equals the reference program (exact match); the reward is code_reward.
rules = answer_rules(answer, __name__)
check = rules.check


def corrupt(prompt: str, answer_text: str, rng: random.Random) -> str:
    """Near misses: a constant or an operator changed, the last operation dropped, or generic character edits."""
    body = answer_text[len(PROGRAM_PREFIX) :]
    kind = rng.randrange(4)
    if kind == 0:
        i = rng.randrange(1, len(body), 2)
        wrong = body[:i] + rng.choice(CONSTANTS.replace(body[i], "")) + body[i + 1 :]
    elif kind == 1:
        i = rng.randrange(0, len(body), 2)
        wrong = body[:i] + rng.choice([s for s in OPS.values() if s != body[i]]) + body[i + 1 :]
    elif kind == 2 and len(body) > 2:
        wrong = body[:-2]
    else:
        return generic_corruption(answer_text, CONSTANTS + "".join(OPS.values()), rng)
    return PROGRAM_PREFIX + wrong


TASK = Task(
    "code",
    make_example,
    answer,
    check,
    {"code_reward": code_reward},
    corrupt,
    max_new_tokens=len(PROGRAM_PREFIX) + 2 * MAX_OPS + 2,
    columns=columns,
)
