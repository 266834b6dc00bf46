"""The `Task` record shared by the built-in tasks, and the rule-based reward helpers they reuse.

A task is a prompt generator plus a checker. `check(prompt, completion)` re-derives the answer from the
prompt, so reward functions need no extra dataset columns (TRL passes only prompts and completions).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

RewardFunc = Callable[..., list[float]]


@dataclass(frozen=True)
class Task:
    """One built-in task.

    name: short id ("sort", "reverse", "addition").
    make_example(rng) -> (prompt, answer): draws one example from a `random.Random`.
    answer(prompt) -> str: the unique correct completion text (without EOS).
    check(prompt, completion) -> bool: True iff `completion.strip() == answer(prompt)`; the completion is the decoded
        response with special tokens removed, so anything generated before the EOS counts (trailing junk is wrong).
    reward_funcs: name -> f(prompts, completions, **kwargs) -> list[float] (TRL's convention).
    corrupt(prompt, answer, rng) -> str: one plausible wrong completion (near-miss negatives for the reward model).
    max_new_tokens: a completion length that fits the longest answer plus EOS with a little slack.
    columns(prompt) -> dict: dataset columns beside "prompt" and "answer" that the task's rewards read (the code task's
        "tests"); None: none.
    chat: whether prompts are conversations (``[{"role": "user", "content": ...}]``) that the chat tokenizer's template
        renders (tasks/chat_tokenizer.py); False: text prompts the model reads as written.

    task.json names the checker and the rewards by reference ("module:function", :attr:`refs`), so a task.json
    written by another version, or by hand, is honoured as written (registry.load_task).
    """

    name: str
    make_example: Callable[[random.Random], tuple[str, str]]
    answer: Callable[[str], str]
    check: Callable[[str, str], bool]
    reward_funcs: dict[str, RewardFunc]
    corrupt: Callable[[str, str, random.Random], str]
    max_new_tokens: int
    chat: bool = False
    columns: Callable[[str], dict] | None = None

    @property
    def refs(self) -> dict[str, str]:
        """ "check" and each reward's name -> the "module:function" reference that imports it."""
        return {"check": ref_of(self.check), **{name: ref_of(f) for name, f in self.reward_funcs.items()}}

    def make_prompts(self, n: int, rng: random.Random, exclude: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """`n` distinct prompts not in `exclude` (raises if the space is too small to find them)."""
        out: list[str] = []
        seen = set(exclude)
        for _ in range(100 * n + 1000):
            if len(out) == n:
                return out
            prompt, _ = self.make_example(rng)
            if prompt not in seen:
                seen.add(prompt)
                out.append(prompt)
        raise ValueError(f"task {self.name!r}: could not draw {n} distinct prompts")


def ref_of(function: Callable) -> str:
    """The "module:function" reference of a module-level function (import_ref's inverse)."""
    return f"{function.__module__}:{function.__qualname__}"


def import_ref(ref: str):
    """Import "package.module:attribute" and return the attribute."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ValueError(f"expected 'module:function', got {ref!r}")
    return getattr(importlib.import_module(module_name), attr)


class AnswerRules(NamedTuple):
    """The checker and rule-based rewards every built-in task derives from its `answer(prompt)`."""

    check: Callable[[str, str], bool]
    correctness: RewardFunc
    partial_credit: RewardFunc

    @property
    def reward_funcs(self) -> dict[str, RewardFunc]:
        return {"correctness": self.correctness, "partial_credit": self.partial_credit}


def answer_rules(answer: Callable[[str], str], module: str, reply: Callable | None = None) -> AnswerRules:
    """check: the stripped completion equals the answer; correctness: 1.0/0.0; partial_credit: `positional_credit`.

    reply(completion) -> str | None: the answer text a completion gives (None: it gives none, which is wrong and earns
    no credit); without it the completion is that text (the text tasks). The chat task reads an assistant message's
    content with it.

    The task module binds them to module-level names of the same names, so each carries that module's name
    (`module`) and task.json can reference it as "module:function".
    """
    given = reply or (lambda completion: completion)

    def check(prompt: str, completion: str) -> bool:
        text = given(completion)
        return text is not None and text.strip() == answer(prompt)

    def correctness(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
        return [float(check(p, c)) for p, c in zip(prompts, completions, strict=True)]

    def partial_credit(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
        texts = [given(c) for c in completions]
        return [0.0 if t is None else positional_credit(t, answer(p)) for p, t in zip(prompts, texts, strict=True)]

    rules = AnswerRules(check, correctness, partial_credit)
    for function in rules:
        function.__module__ = module
        function.__qualname__ = function.__name__
    return rules


def positional_credit(completion: str, answer: str) -> float:
    """Shaped reward in [0, 1]: matching characters at the same position / max(len(completion), len(answer)).

    1.0 iff the stripped completion equals the answer; extra or missing characters cost as much as wrong ones.
    """
    text = completion.strip()
    longest = max(len(text), len(answer))
    if longest == 0:
        return 1.0
    return sum(a == b for a, b in zip(text, answer)) / longest


def generic_corruption(answer: str, alphabet: str, rng: random.Random) -> str:
    """A near-miss of `answer`: substitute, swap, drop, insert, truncate or append characters. Never equals `answer`."""
    for _ in range(100):
        kind = rng.randrange(6)
        chars = list(answer)
        i = rng.randrange(len(chars)) if chars else 0
        if kind == 0 and chars:  # one character replaced
            chars[i] = rng.choice(alphabet)
        elif kind == 1 and len(chars) >= 2:  # adjacent swap
            j = min(i, len(chars) - 2)
            chars[j], chars[j + 1] = chars[j + 1], chars[j]
        elif kind == 2 and chars:  # one character dropped
            del chars[i]
        elif kind == 3:  # one character inserted (often a duplicate)
            chars.insert(i, rng.choice([rng.choice(alphabet), chars[i] if chars else "0"]))
        elif kind == 4 and chars:  # truncated
            chars = chars[: rng.randrange(len(chars))]
        else:  # trailing junk
            chars += [rng.choice(alphabet) for _ in range(rng.randint(1, 3))]
        text = "".join(chars)
        if text != answer:
            return text
    return answer + alphabet[0]
