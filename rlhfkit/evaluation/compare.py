"""Model vs baseline: held-out prompts, completions from both, verdicts from one or more judges, win rates.

The Python entry point behind `rlhfkit eval`:
    compare_judges(model_path, baseline_path, [judge, ...], prompts, ...) -> Comparison   (generate once, judge many)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from rlhfkit.errors import EvalError

from .completions import Generations, generate_texts
from .judges import PairwiseJudge, Verdict
from .winrate import WinRate, tally


def load_eval_prompts(
    dataset: str | Path, split: str = "test", text_field: str = "prompt", num_examples: int | None = None
) -> list[str]:
    """The first `num_examples` prompts (all when None) of `split` of a dataset (a hub id or local files, as
    rlhfkit.data.load_splits reads them; a dataset saved as a single split is used whole).

    The first rows, not a random sample, as TRL's judge_tldr.py takes them: the same flags always evaluate the same
    prompts.
    """
    from datasets import Dataset

    from rlhfkit.data import load_splits

    path = str(dataset)
    data = load_splits(path, flag="dataset")
    if not isinstance(data, Dataset):
        if split not in data:
            raise EvalError(f"--dataset_test_split {split!r} is not in {path!r} (splits: {', '.join(data)}).")
        data = data[split]
    return _prompt_column(data, path, text_field, num_examples)


def _prompt_column(data, path: str, text_field: str, num_examples: int | None) -> list[str]:
    if text_field not in data.column_names:
        raise EvalError(
            f"--dataset {path!r} has no {text_field!r} column (columns: {', '.join(data.column_names)}). "
            f"Pass --dataset_text_field NAME."
        )
    if len(data) == 0:
        raise EvalError(f"--dataset {path!r}: the split is empty; it needs at least one prompt.")
    rows = data.select(range(min(len(data), num_examples or len(data))))
    prompts = list(rows[text_field])
    if not all(isinstance(p, str) for p in prompts):
        raise EvalError(
            f"--dataset {path!r}: column {text_field!r} must hold plain-text prompts (conversational, chat-format "
            f"prompts are not supported by rlhfkit eval yet)."
        )
    return prompts


class Comparison(NamedTuple):
    """Everything one evaluation produced, for reports and debugging."""

    prompts: list[str]
    model: Generations
    baseline: Generations
    verdicts: list[list[Verdict]]  # one list per judge, one verdict per prompt (A = model)
    win_rates: list[WinRate]  # one per judge, in the order given


def judge_completions(
    judges: Sequence[PairwiseJudge],
    prompts: Sequence[str],
    model_texts: Sequence[str],
    baseline_texts: Sequence[str],
    confidence: float = 0.95,
) -> tuple[list[list[Verdict]], list[WinRate]]:
    """Verdicts and win rates of each judge on completions already generated (the model's are side A)."""
    verdicts = [judge.judge(prompts, model_texts, baseline_texts) for judge in judges]
    return verdicts, [tally(v, judge.name, confidence) for judge, v in zip(judges, verdicts)]


def compare_judges(
    model_path: str | Path,
    baseline_path: str | Path,
    judges: Sequence[PairwiseJudge],
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    temperature: float | None = None,
    seed: int = 0,
    batch_size: int = 64,
    confidence: float = 0.95,
) -> Comparison:
    """Generate with both models once (same prompts, settings and seed), then ask every judge.

    Greedy when `temperature` is None. Both models use the same seed, so a model compared with itself produces the
    same completions, and every judge ties them: the 50% sanity check.
    """
    if not prompts:
        raise EvalError("no prompts to evaluate on: --num_examples must be at least 1.")
    options = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, batch_size=batch_size)
    model = generate_texts(model_path, prompts, flag="model", **options)
    baseline = generate_texts(baseline_path, prompts, flag="baseline", **options)
    verdicts, win_rates = judge_completions(judges, prompts, model.texts, baseline.texts, confidence)
    return Comparison(list(prompts), model, baseline, verdicts, win_rates)
