"""String reversal asked in a conversation: the reverse task (tasks/reverse.py) with TRL's conversational format.

A prompt is one user message, ``[{"role": "user", "content": "rev kqzt="}]``, which the trainers render with the chat
tokenizer's template (tasks/chat_tokenizer.py, no tools) and its generation prompt; the answer is the assistant's
turn, ``"tzqk"``, ended by the end-of-turn token (the EOS). Reward functions get TRL's conversational completions,
``[{"role": "assistant", "content": "tzqk"}]``; the checker also reads a completion as decoded text (what the
trainers' task_success and the quickstart's judge pass it), and a prompt as the rendered conversation (what the
judge generates from).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from . import reverse
from .agent import CHAT_SPECIAL_TOKENS, final_answer
from .agent import question as user_message
from .base import Task, answer_rules
from .chat_tokenizer import END, START

USER_TURN = f"{START}user\n"  # where the chat template begins a user turn


def question(prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """The user's request ("rev kqzt="): the last user message's content of a conversation; of a conversation as the
    chat template renders it, its last user turn; plain text as it is."""
    if isinstance(prompt, str) and USER_TURN in prompt:
        return prompt.rpartition(USER_TURN)[2].partition(END)[0]
    return user_message(prompt)


def answer(prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """The reversed letters of the user's request (reverse.answer on it)."""
    return reverse.answer(question(prompt))


def reply(completion: str | Sequence[Mapping[str, Any]]) -> str | None:
    """The answer a completion gives: the content of its last message when that is the assistant's (TRL's
    conversational completion, agent.final_answer); decoded text with the chat template's special tokens removed (the
    whole text: one turn, so anything else in it is part of the answer). None for messages that end otherwise."""
    if isinstance(completion, str):
        for token in CHAT_SPECIAL_TOKENS:
            completion = completion.replace(token, "")
        return completion
    return final_answer(completion)


# check: the stripped reply equals answer(prompt); correctness 0/1 and positional partial_credit, as TRL calls them.
rules = answer_rules(answer, __name__, reply)
check, correctness, partial_credit = rules


def corrupt(prompt: str | Sequence[Mapping[str, Any]], answer_text: str, rng: random.Random) -> str:
    """reverse.corrupt's near misses of the user's request."""
    return reverse.corrupt(question(prompt), answer_text, rng)


TASK = Task(
    "reverse-chat",
    reverse.make_example,  # the user message's content and its answer
    answer,
    check,
    rules.reward_funcs,
    corrupt,
    max_new_tokens=reverse.TASK.max_new_tokens,
    chat=True,
)
