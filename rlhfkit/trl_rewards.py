"""TRL's built-in reward functions, written for rlhfkit: what ``--reward_funcs`` gives for TRL's names.

TRL_REWARDS maps the names TRL's ``trl grpo`` script accepts to rlhfkit's versions. Each returns what TRL 1.16's
function of that name returns for the same inputs. Completions come in either form a trainer hands them out: text
(text prompts) or a one-message list [{"role": "assistant", "content": text}] (conversations). TRL's versions only
read the second form.

accuracy_reward and reasoning_accuracy_reward compare answers with the math_verify package (``pip install
math-verify``). rlhfkit does not depend on it: naming either reward without it installed is a ConfigError.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from rlhfkit.errors import ConfigError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# The bare name get_soft_overlong_punishment gets the lengths TRL's GRPO script uses for it.
SCRIPT_MAX_COMPLETION_LEN = 1280
SCRIPT_SOFT_PUNISH_CACHE = 256

MATH_VERIFY_NAMES = ("accuracy_reward", "reasoning_accuracy_reward")


def completion_text(completion: str | Sequence[Mapping]) -> str:
    """The text of one completion: a string as it is; for a conversational completion, its first message's
    content."""
    if isinstance(completion, str):
        return completion
    first = completion[0] if isinstance(completion, Sequence) and completion else None
    if isinstance(first, Mapping) and isinstance(first.get("content"), str):
        return first["content"]
    raise TypeError(
        f"a completion must be text or [{{'role': 'assistant', 'content': text}}], not {completion!r:.100} "
        f"({type(completion).__name__})"
    )


# ------------------------------------------------------------------------------------------------
# think_format_reward
# ------------------------------------------------------------------------------------------------


def think_format_reward(completions: list, **kwargs) -> list[float]:
    """1.0 for a completion that starts with "<think>" and closes that block with a later "</think>", and never opens
    a second "<think>"; 0.0 otherwise. Anything may follow the "</think>", the block may be empty.

    completions: text, or [{"role": "assistant", "content": text}] per completion. TRL's version reads
    completion[0]["content"] only, so it fails on the text completions of text prompts; this one takes both.
    """
    return [1.0 if _think_formatted(completion_text(c)) else 0.0 for c in completions]


def _think_formatted(text: str) -> bool:
    if not text.startswith(THINK_OPEN):
        return False
    after = text[len(THINK_OPEN) :]
    # "</think>" does not contain "<think>", so the two tests do not interfere.
    return THINK_OPEN not in after and THINK_CLOSE in after


# ------------------------------------------------------------------------------------------------
# get_soft_overlong_punishment (DAPO's soft length penalty)
# ------------------------------------------------------------------------------------------------


class SoftOverlongPunishment:
    """DAPO's soft overlong punishment (Eq. 13 of https://huggingface.co/papers/2503.14476), by completion length in
    tokens: 0 up to max_completion_len - soft_punish_cache tokens, then falling linearly to -1 at max_completion_len,
    and -1 beyond. It penalises length near the limit but never rewards brevity.

    A class rather than a closure so it pickles. Its __name__ is TRL's, so the metrics keep TRL's keys
    (rewards/soft_overlong_punishment_reward/mean).
    """

    __name__ = "soft_overlong_punishment_reward"

    def __init__(self, max_completion_len: int, soft_punish_cache: int):
        if max_completion_len < 0 or soft_punish_cache < 0:
            raise ValueError(
                f"get_soft_overlong_punishment needs max_completion_len >= 0 and soft_punish_cache >= 0, got "
                f"{max_completion_len} and {soft_punish_cache}."
            )
        self.max_completion_len = max_completion_len
        self.soft_punish_cache = soft_punish_cache

    def __call__(self, completion_ids: list[list[int]], **kwargs) -> list[float]:
        return [self.penalty(len(ids)) for ids in completion_ids]

    def penalty(self, length: int) -> float:
        """The punishment of one completion of `length` tokens: in [-1, 0]."""
        if length > self.max_completion_len:
            return -1.0
        free = self.max_completion_len - self.soft_punish_cache  # lengths up to here go unpunished
        if length <= free:
            return 0.0
        return (free - length) / self.soft_punish_cache  # cache > 0 here: free < length <= max

    def __repr__(self) -> str:
        lengths = f"max_completion_len={self.max_completion_len}, soft_punish_cache={self.soft_punish_cache}"
        return f"SoftOverlongPunishment({lengths})"


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> SoftOverlongPunishment:
    """A reward function f(completion_ids, **kwargs) -> list[float] giving DAPO's soft overlong punishment
    (SoftOverlongPunishment); soft_punish_cache 0 gives 0 up to max_completion_len tokens and -1 beyond."""
    return SoftOverlongPunishment(max_completion_len, soft_punish_cache)


# ------------------------------------------------------------------------------------------------
# accuracy_reward, reasoning_accuracy_reward (math_verify)
# ------------------------------------------------------------------------------------------------


def require_math_verify(what: str) -> None:
    """Raise a ConfigError saying how to install math_verify unless it can be imported; `what` names what needs it."""
    try:
        import latex2sympy2_extended  # noqa: F401  (math_verify's own dependency, which the rewards import too)
        import math_verify  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"{what} needs the math_verify package, which cannot be imported ({e}). Install it with "
            "`pip install math-verify`; rlhfkit does not install it for you."
        ) from None


def accuracy_reward(completions: list, solution: list[str] | None = None, **kwargs) -> list[float | None]:
    """1.0 where the completion's answer equals the dataset's `solution` as mathematics (math_verify), else 0.0;
    None (not applicable) where the solution itself cannot be parsed.

    The answer is the first LaTeX expression found, \\boxed{} first; units are stripped. completions: text, or
    [{"role": "assistant", "content": text}] per completion (TRL's version takes the second form only).
    """
    _check_solution("accuracy_reward", solution)
    return _verify_answers("accuracy_reward", [completion_text(c) for c in completions], solution)


def reasoning_accuracy_reward(
    completions: list, solution: list[str] | None = None, reasoning_delimiters: list[str] | None = None, **kwargs
) -> list[float | None]:
    """accuracy_reward on the final answer only: the text after the last occurrence of the first of
    `reasoning_delimiters` (default ["</think>"]) that the completion contains. A completion containing none of them
    has not finished reasoning and gets 0.0, whatever its solution."""
    _check_solution("reasoning_accuracy_reward", solution)
    delimiters = ["</think>"] if reasoning_delimiters is None else reasoning_delimiters
    answers = []
    for completion in completions:
        text = completion_text(completion)
        found = next((d for d in delimiters if d in text), None)
        answers.append(None if found is None else text.rsplit(found, 1)[-1])
    return _verify_answers("reasoning_accuracy_reward", answers, solution)


def _check_solution(name: str, solution) -> None:
    if solution is None:
        raise ValueError(
            f"{name} compares each completion with the dataset's 'solution' column, and the dataset has none: add "
            "one (the reference answer of each prompt, in LaTeX or plain math)."
        )


def _verify_answers(name: str, answers: list[str | None], solutions: list[str]) -> list[float | None]:
    """math_verify's verdict per answer: 1.0 / 0.0, None where the solution does not parse; 0.0 for an answer of None
    (no final answer to check)."""
    require_math_verify(name)
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    # math_verify enforces its timeouts with signal.alarm, which only the main thread may use.
    main_thread = threading.current_thread() is threading.main_thread()
    parse_timeout, verify_timeout = (10, 5) if main_thread else (None, None)
    if not main_thread:  # math_verify warns at every call that its timeouts are off
        for logger in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(logger).setLevel(logging.ERROR)
    # The answer must be well-formed LaTeX, found behind \boxed{} or an answer phrase (no bare expressions).
    answer_config = [
        LatexExtractionConfig(
            normalization_config=NormalizationConfig(units=True),
            boxed_match_priority=0,
            try_extract_without_anchor=False,
        )
    ]
    rewards: list[float | None] = []
    for answer, solution in zip(answers, solutions, strict=True):
        if answer is None:
            rewards.append(0.0)
            continue
        gold = parse(solution, parsing_timeout=parse_timeout)
        if not gold:
            rewards.append(None)
            continue
        extracted = parse(
            answer, extraction_config=answer_config, extraction_mode="first_match", parsing_timeout=parse_timeout
        )
        rewards.append(float(verify(gold, extracted, timeout_seconds=verify_timeout)))
    return rewards


# ------------------------------------------------------------------------------------------------
# Names
# ------------------------------------------------------------------------------------------------

TRL_REWARDS: dict[str, Callable[[], Callable]] = {
    "think_format_reward": lambda: think_format_reward,
    "get_soft_overlong_punishment": lambda: get_soft_overlong_punishment(
        SCRIPT_MAX_COMPLETION_LEN, SCRIPT_SOFT_PUNISH_CACHE
    ),
    "accuracy_reward": lambda: accuracy_reward,
    "reasoning_accuracy_reward": lambda: reasoning_accuracy_reward,
}


def trl_reward_function(name: str) -> Callable:
    """The reward function TRL's GRPO script gives for a built-in `name` (a key of TRL_REWARDS). The math_verify
    rewards raise a ConfigError naming the package when it is missing."""
    if name in MATH_VERIFY_NAMES:
        require_math_verify(f"--reward_funcs {name!r}")
    return TRL_REWARDS[name]()
