"""Pairwise judges: given a prompt and two completions, which one is better?

Every judge answers through one interface, `judge(prompts, completions_a, completions_b) -> list[Verdict]`, so
the win-rate arithmetic and the report do not care whether the verdict came from a rule, a reward model or an LLM.
In `rlhfkit eval`, A is the evaluated model and B the baseline.

- `TaskJudge`: the built-in task's checker. Correct beats incorrect; both correct or both wrong is a tie.
- `RewardModelJudge`: a 1-label sequence-classification model scores prompt + completion; the higher score wins.
- `OpenAIJudge`: an OpenAI-compatible chat-completions model answers with the index of the better completion
  (the idea of TRL's `OpenAIPairwiseJudge`), with the order of the two shown completions randomised.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlhfkit.errors import JudgeError
from rlhfkit.tracking.progress import progress_bar


class Outcome(str, Enum):
    A = "a"  # completion A (the evaluated model's) is better
    B = "b"  # completion B (the baseline's) is better
    TIE = "tie"
    MALFORMED = "malformed"  # the judge's answer could not be read; excluded from the win rate, but counted


@dataclass(frozen=True)
class Verdict:
    """One judgement. `raw` is the judge's own answer (kept for malformed ones and for debugging).

    a_shown_first: for judges that see the two completions in some order (LLMs), whether A was shown first;
    None for judges without an order. The report uses it to measure the judge's position bias.
    """

    outcome: Outcome
    raw: str = ""
    a_shown_first: bool | None = None


@runtime_checkable
class PairwiseJudge(Protocol):
    """Anything with a `name` and a `judge` method; one Verdict per prompt, in order."""

    name: str

    def judge(
        self, prompts: Sequence[str], completions_a: Sequence[str], completions_b: Sequence[str]
    ) -> list[Verdict]: ...


def _check_lengths(prompts: Sequence[str], a: Sequence[str], b: Sequence[str]) -> None:
    if not len(prompts) == len(a) == len(b):
        raise ValueError(f"judge needs one completion of each side per prompt: {len(prompts)}, {len(a)}, {len(b)}")


def _by_score(score_a: float, score_b: float, raw: str) -> Verdict:
    if score_a > score_b:
        return Verdict(Outcome.A, raw)
    if score_b > score_a:
        return Verdict(Outcome.B, raw)
    return Verdict(Outcome.TIE, raw)


# --- task -------------------------------------------------------------------------------------------------------


class TaskJudge:
    """The built-in task's checker as a judge: correct beats incorrect, equal correctness ties.

    check(prompt, completion) -> bool is `load_task(dir).check`; it re-derives the answer from the prompt, so it
    only accepts the task's own prompts.
    """

    def __init__(self, check: Callable[[str, str], bool], name: str = "task") -> None:
        self.check = check
        self.name = name

    @classmethod
    def from_dir(cls, task_dir: str | Path) -> TaskJudge:
        """The checker named in `task_dir/task.json` (an assets dir built by `rlhfkit build-tiny`)."""
        from rlhfkit.tasks import load_task
        from rlhfkit.tasks.layout import Assets

        if not Assets(task_dir).is_built():
            raise JudgeError(
                f"--task {str(task_dir)!r} has no task.json: pass a directory built by 'rlhfkit build-tiny', "
                f"or omit --task to use the built-in assets."
            )
        task = load_task(task_dir)
        return cls(task.check, name=f"task:{task.name}")

    def judge(
        self, prompts: Sequence[str], completions_a: Sequence[str], completions_b: Sequence[str]
    ) -> list[Verdict]:
        _check_lengths(prompts, completions_a, completions_b)
        verdicts = []
        for prompt, a, b in zip(prompts, completions_a, completions_b):
            ok_a, ok_b = self._passes(prompt, a), self._passes(prompt, b)
            raw = f"a {'correct' if ok_a else 'wrong'}, b {'correct' if ok_b else 'wrong'}"
            verdicts.append(_by_score(float(ok_a), float(ok_b), raw))
        return verdicts

    def _passes(self, prompt: str, completion: str) -> bool:
        try:
            return bool(self.check(prompt, completion))
        except ValueError as e:
            raise JudgeError(
                f"the {self.name} judge cannot check prompt {prompt!r} ({e}). The task judge only knows the task's "
                f"own prompts: use another --judge (reward-model:PATH, openai:MODEL) for other datasets."
            ) from None


# --- reward model -----------------------------------------------------------------------------------------------


class RewardModelJudge:
    """A reward model (sequence classification, 1 label) as a judge: the higher-scoring completion wins.

    Each pair is tokenized as prompt tokens + completion tokens + EOS, the way the PPO trainer feeds the reward
    model (query ids + response ids, terminator included). Tokenizing the parts separately keeps the boundary
    tokens identical to training for BPE tokenizers. The EOS is always appended: judges see text only, so a
    completion cut off at max_new_tokens is scored as if it had ended (`rlhfkit eval` reports those separately).
    Identical (prompt, completion) pairs are scored once, so identical completions tie exactly, whatever the
    batch layout.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        name: str = "reward-model",
        batch_size: int = 64,
        end_with_eos: bool = True,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = batch_size
        self.end_with_eos = end_with_eos

    @classmethod
    def from_path(cls, path: str | Path, batch_size: int = 64, device: str | torch.device | None = None):
        """Model and tokenizer of a hub id or a save_pretrained directory; a ModelLoadError names the judge."""
        from rlhfkit.data import progress_bars_hidden
        from rlhfkit.models import load_scalar_model, load_tokenizer, native_dtype

        path = str(path)
        tokenizer = load_tokenizer(path, flag="judge reward-model:")
        with progress_bars_hidden():
            model = load_scalar_model(path, native_dtype(), flag="judge reward-model:")
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        return cls(model.to(device), tokenizer, name=f"reward-model:{path}", batch_size=batch_size)

    def encode(self, prompt: str, completion: str) -> list[int]:
        """Token ids the reward model scores for one pair."""
        encode = self.tokenizer
        ids = (
            encode(prompt, add_special_tokens=False)["input_ids"]
            + encode(completion, add_special_tokens=False)["input_ids"]
        )
        if self.end_with_eos and self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    @torch.inference_mode()
    def scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        """Reward-model score of each (prompt, completion) pair, read at its last token."""
        from rlhfkit.rewards import reward_model_scores
        from rlhfkit.sampling import left_pad

        pairs = list(zip(prompts, completions))
        unique = list(dict.fromkeys(pairs))
        device = next(self.model.parameters()).device
        values: list[float] = []
        with progress_bar(len(unique), f"scoring by {self.name}") as advance:
            for start in range(0, len(unique), self.batch_size):
                chunk = unique[start : start + self.batch_size]
                ids, mask = left_pad([self.encode(p, c) for p, c in chunk], self.tokenizer.pad_token_id)
                values += reward_model_scores(self.model, ids.to(device), mask.to(device)).tolist()
                advance(len(chunk))
        score = dict(zip(unique, values))
        return [score[pair] for pair in pairs]

    def judge(
        self, prompts: Sequence[str], completions_a: Sequence[str], completions_b: Sequence[str]
    ) -> list[Verdict]:
        _check_lengths(prompts, completions_a, completions_b)
        scores = self.scores([*prompts, *prompts], [*completions_a, *completions_b])
        n = len(prompts)
        return [_by_score(sa, sb, f"a {sa:.4g}, b {sb:.4g}") for sa, sb in zip(scores[:n], scores[n:])]


# --- OpenAI-compatible LLM ----------------------------------------------------------------------------------------

SYSTEM_PROMPT = """\
You are a careful evaluator. You will see a prompt and two candidate responses to it, labelled 0 and 1. Decide \
which response answers the prompt better: correct, helpful, and following the prompt's instructions. The order \
in which the responses are shown says nothing about their quality, and a longer response is not better for being \
longer. Reply with a single digit, 0 or 1, the label of the better response, and nothing else."""

USER_TEMPLATE = """\
## Prompt
{prompt}

## Response 0
{first}

## Response 1
{second}

Which response is better? Reply with 0 or 1 only."""

# One label, optionally wrapped in punctuation or markdown ("1", "1.", "**0**", "'1'"); anything else is malformed.
_ANSWER = re.compile(r"\W*([01])\W*")


def parse_index(answer: str | None) -> int | None:
    """0 or 1 when `answer` is exactly one label (punctuation around it allowed), else None."""
    match = _ANSWER.fullmatch(answer or "")
    return int(match.group(1)) if match else None


class OpenAIJudge:
    """An LLM behind an OpenAI-compatible chat-completions API, asked for the index of the better completion.

    Position bias: LLM judges favour one position. Each pair is shown in an order drawn from `random.Random(seed)`
    (A first with probability 1/2) and the answer is mapped back, so the bias cancels in expectation and the report
    can measure it (`Verdict.a_shown_first`). Identical completions tie without a request: any answer would only
    reflect position bias. Answers other than one label are MALFORMED verdicts carrying the raw text.

    api_key_env: the environment variable holding the key (servers without authentication, e.g. vLLM, accept any
    value). request_options: extra arguments for `chat.completions.create` (e.g. temperature, max_tokens); none are
    sent by default because models differ in which they accept.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        seed: int = 0,
        max_concurrency: int = 8,
        max_retries: int = 2,
        timeout: float = 60.0,
        request_options: dict | None = None,
        system_prompt: str = SYSTEM_PROMPT,
    ) -> None:
        try:
            import openai
        except ImportError:
            raise JudgeError(
                f"--judge openai:{model} needs the openai package: pip install 'rlhfkit[judges]' (or pip install openai)."
            ) from None
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise JudgeError(
                f"--judge openai:{model} reads its API key from the environment variable {api_key_env}, which is not "
                f"set. Export it (any non-empty value works for servers without authentication), or name another "
                f"variable with --judge_api_key_env."
            )
        self.name = f"openai:{model}"
        self.model = model
        self.api_key_env = api_key_env
        self.seed = seed
        self.max_concurrency = max_concurrency
        self.request_options = dict(request_options or {})
        self.system_prompt = system_prompt
        self.client = openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout)
        self.url = str(self.client.base_url)

    def judge(
        self, prompts: Sequence[str], completions_a: Sequence[str], completions_b: Sequence[str]
    ) -> list[Verdict]:
        _check_lengths(prompts, completions_a, completions_b)
        # Orders are drawn for every pair, asked or not, so a pair's order does not depend on the others' texts.
        rng = random.Random(self.seed)
        a_first = [rng.random() < 0.5 for _ in prompts]
        asked = [i for i, (a, b) in enumerate(zip(completions_a, completions_b)) if a != b]
        with (
            progress_bar(len(asked), f"asking {self.name}") as advance,
            ThreadPoolExecutor(max_workers=max(1, self.max_concurrency)) as pool,
        ):
            futures = [
                pool.submit(self._ask_pair, prompts[i], completions_a[i], completions_b[i], a_first[i]) for i in asked
            ]
            for future in futures:
                future.add_done_callback(lambda _: advance())
            try:
                answers = iter([future.result() for future in futures])
            except JudgeError:
                for future in futures:  # one failure (server down, bad key) would repeat for every pending pair
                    future.cancel()
                raise
        verdicts = []
        for a, b, first in zip(completions_a, completions_b, a_first):
            if a == b:
                verdicts.append(Verdict(Outcome.TIE, "identical completions (judge not asked)"))
            else:
                verdicts.append(self._verdict(next(answers), first))
        return verdicts

    @staticmethod
    def _verdict(answer: str | None, a_first: bool) -> Verdict:
        index = parse_index(answer)
        raw = answer if answer is not None else ""
        if index is None:
            return Verdict(Outcome.MALFORMED, raw, a_first)
        a_won = (index == 0) == a_first
        return Verdict(Outcome.A if a_won else Outcome.B, raw, a_first)

    def _ask_pair(self, prompt: str, a: str, b: str, a_first: bool) -> str | None:
        return self._ask(prompt, a, b) if a_first else self._ask(prompt, b, a)

    def messages(self, prompt: str, first: str, second: str) -> list[dict]:
        user = USER_TEMPLATE.format(prompt=prompt, first=first, second=second)
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user}]

    def _ask(self, prompt: str, first: str, second: str) -> str | None:
        """The judge's reply text (None when it sent no choice or no content)."""
        import openai

        try:
            response = self.client.chat.completions.create(
                model=self.model, messages=self.messages(prompt, first, second), **self.request_options
            )
        except openai.APIConnectionError as e:  # includes timeouts
            raise JudgeError(
                f"could not reach the judge at {self.url} ({e}). Check --judge_base_url and that the server is up."
            ) from None
        except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
            raise JudgeError(
                f"the judge at {self.url} refused the API key from ${self.api_key_env} (HTTP {e.status_code}: "
                f"{_short(e.message)}). Set {self.api_key_env}, or name another variable with --judge_api_key_env."
            ) from None
        except openai.NotFoundError as e:
            raise JudgeError(
                f"the judge at {self.url} answered 404 for model {self.model!r} ({_short(e.message)}). Check the model "
                f"name after 'openai:' and --judge_base_url (OpenAI-compatible servers usually end in /v1)."
            ) from None
        except openai.APIStatusError as e:
            raise JudgeError(f"the judge at {self.url} answered HTTP {e.status_code}: {_short(e.message)}") from None
        except openai.OpenAIError as e:
            raise JudgeError(f"the judge at {self.url} sent a reply that is not a chat completion: {e}") from None
        if not response.choices:
            return None
        return response.choices[0].message.content


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


# --- parsing --judge ----------------------------------------------------------------------------------------------

JUDGE_FORMS = "'task', 'reward-model:PATH' or 'openai:MODEL'"


def make_judge(
    spec: str,
    task_dir: Callable[[], Path],
    *,
    seed: int = 0,
    batch_size: int = 64,
    base_url: str | None = None,
    api_key_env: str = "OPENAI_API_KEY",
) -> PairwiseJudge:
    """The judge a `--judge` value names. `task_dir` is called only for the task judge (it may build assets)."""
    kind, _, arg = spec.partition(":")
    if kind == "task" and not arg:
        return TaskJudge.from_dir(task_dir())
    if kind == "reward-model" and arg:
        return RewardModelJudge.from_path(arg, batch_size=batch_size)
    if kind == "openai" and arg:
        return OpenAIJudge(arg, base_url=base_url, api_key_env=api_key_env, seed=seed)
    raise JudgeError(f"--judge {spec!r} is not a judge: use {JUDGE_FORMS}.")
