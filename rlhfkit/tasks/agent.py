"""The built-in agent task: long multiplication with a `calculator` tool ("1234*567" -> "699678").

A product of a 3-4 digit and a 2-3 digit number is beyond what the tiny model computes in its head (its direct answers
are mostly wrong), but copying the calculator's result is easy: the task is solved well only by calling the tool and
answering with what it returned. Prompts are conversations (``[{"role": "user", "content": "1234*567"}]``); an
episode is the policy's turns and the tool results after the prompt, and the answer is the content of its last
message (TRL's form: ``completions[i][-1]["content"]``).

The calculator parses its expression, never evaluates it: exactly ``INTEGER OP INTEGER`` with OP one of + - *, each
integer at most MAX_OPERAND_DIGITS digits; anything else (names, calls, attributes, parentheses, more operators,
longer numbers) raises ValueError, which the trainers' ToolBox turns into an ``{'error': ...}`` tool message.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .base import Task, generic_corruption
from .chat_tokenizer import END, PAD, START

CHAT_SPECIAL_TOKENS = (START, END, PAD)

DIGITS = "0123456789"
# Operand lengths (digits): the first factor has 3-4, the second 2-3.
FIRST_DIGITS, SECOND_DIGITS = (3, 4), (2, 3)
MAX_OPERAND_DIGITS = 12
_EXPRESSION = re.compile(rf"\s*([0-9]{{1,{MAX_OPERAND_DIGITS}}})\s*([-+*])\s*([0-9]{{1,{MAX_OPERAND_DIGITS}}})\s*")
_OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
MAX_EXPRESSION_CHARS = 64


def calculator(expression: str) -> str:
    """
    Computes a sum, difference or product of two whole numbers.

    Args:
        expression: Two non-negative integers of at most 12 digits joined by one of +, - or *, such as "1234*567".

    Returns:
        The exact result as decimal digits (with a leading minus sign when negative).
    """
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression must be a string of at most {MAX_EXPRESSION_CHARS} characters")
    match = _EXPRESSION.fullmatch(expression)
    if match is None:
        raise ValueError(
            f"expected INTEGER OP INTEGER with OP one of + - * and integers of at most {MAX_OPERAND_DIGITS} digits"
        )
    a, op, b = match.groups()
    return str(_OPERATIONS[op](int(a), int(b)))


def make_example(rng: random.Random) -> tuple[str, str]:
    """(user message, answer): a FIRST_DIGITS-digit number times a SECOND_DIGITS-digit number, no leading zeros."""
    a = _number(rng, rng.randint(*FIRST_DIGITS))
    b = _number(rng, rng.randint(*SECOND_DIGITS))
    prompt = f"{a}*{b}"
    return prompt, answer(prompt)


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def question(prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """The user's message: `prompt` itself when text, else the last user message's content of the conversation."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise ValueError(f"not an agent-task prompt (no user message): {prompt!r}")
    return users[-1]


def answer(prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """The product the user asked for, as digits (re-derived from the prompt with the calculator's own parser)."""
    text = question(prompt).strip()
    a, sep, b = text.partition("*")
    if not (sep and a.isdigit() and b.isdigit() and a.isascii() and b.isascii()):
        raise ValueError(f"not an agent-task prompt: {text!r}")
    return calculator(text)


def final_answer(completion: str | Sequence[Mapping[str, Any]]) -> str | None:
    """The episode's answer: the content of its last message when that is an assistant message without tool calls
    (TRL's completions: the messages after the prompt); for an episode's decoded text (as the trainers' task_success
    reads it, special tokens kept or not), its last line without the chat template's special tokens, where the
    template puts the last turn. None when the episode ended on a tool call or a tool result (no answer given)."""
    if isinstance(completion, str):
        for token in CHAT_SPECIAL_TOKENS:
            completion = completion.replace(token, "")
        return completion.strip().rpartition("\n")[2]
    if not completion:
        return None
    last = completion[-1]
    if not isinstance(last, Mapping) or last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    content = last.get("content")
    return content if isinstance(content, str) else None


def check(prompt: str | Sequence[Mapping[str, Any]], completion: str | Sequence[Mapping[str, Any]]) -> bool:
    """True iff the episode's final answer (final_answer), stripped, is the product (answer)."""
    given = final_answer(completion)
    return given is not None and given.strip() == answer(prompt)


def correctness(prompts: list, completions: list, **kwargs) -> list[float]:
    """1.0 where the episode's final answer is the product, else 0.0 (TRL's reward-function form)."""
    return [float(check(p, c)) for p, c in zip(prompts, completions, strict=True)]


def tool_calls(completion: str | Sequence[Mapping[str, Any]]) -> int:
    """Tool calls the policy made in one episode (its messages): the calls of its assistant turns."""
    if isinstance(completion, str):
        return completion.count("<tool_call>")
    return sum(len(m.get("tool_calls") or []) for m in completion if m.get("role") == "assistant")


def corrupt(prompt: str, answer_text: str, rng: random.Random) -> str:
    """A near miss of the product (what a direct answer from memory looks like)."""
    return generic_corruption(answer_text, DIGITS, rng)


@dataclass(frozen=True)
class AgentTask(Task):
    """A built-in task whose episodes may call `tools` (typed functions with Google-style docstrings, TRL 1.16's
    ``tools=``); prompts are conversations. max_tool_calling_iterations: rounds of tool results an episode gets."""

    tools: tuple = ()
    max_tool_calling_iterations: int = 1


# The episode budget: a call turn (~14 tokens), the tool result with the next assistant header (~30) and the answer
# (<= 8), with slack for a second call.
TASK = AgentTask(
    "agent",
    make_example,
    answer,
    check,
    {"correctness": correctness},
    corrupt,
    max_new_tokens=96,
    chat=True,
    tools=(calculator,),
    max_tool_calling_iterations=2,
)
