"""Completions of a model saved on disk, for judging: greedy by default, seeded sampling on request."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from rlhfkit.errors import EvalError
from rlhfkit.sampling import complete_texts
from rlhfkit.tracking.progress import progress_bar


class Generations(NamedTuple):
    """One completion per prompt, in prompt order.

    texts: the completion up to (not including) its terminator, special tokens removed: what a judge reads.
    truncated: True where no terminator came within max_new_tokens (the text was cut off).
    """

    texts: list[str]
    truncated: list[bool]


def load_generator(path: str | Path, flag: str):
    """(model, tokenizer) of a causal LM, a hub id or a save_pretrained directory that holds both; a name that
    cannot be loaded is a ModelLoadError naming `--{flag}`."""
    from rlhfkit.data import progress_bars_hidden
    from rlhfkit.models import load_policy, load_tokenizer, native_dtype

    tokenizer = load_tokenizer(str(path), flag=flag)
    with progress_bars_hidden():  # two models load per evaluation: the bars would bury the report
        model = load_policy(str(path), native_dtype(), flag=flag)
    return model, tokenizer


def generate_texts(
    model_path: str | Path,
    prompts: Sequence[str],
    max_new_tokens: int,
    temperature: float | None = None,
    seed: int = 0,
    batch_size: int = 64,
    flag: str = "model",
    device: str | torch.device | None = None,
) -> Generations:
    """Generate one completion per prompt with the model (and tokenizer) saved at `model_path`.

    Greedy when `temperature` is None, else pure sampling (top_k=0, top_p=1) under `torch.manual_seed(seed)` in a
    forked RNG, as the trainers sample (sampling.complete_texts): prompts tokenized without special tokens and
    left-padded, every EOS id of the tokenizer and the generation config ending a completion. So a policy is
    evaluated on exactly the inputs it was trained on.
    """
    if temperature is not None and temperature <= 0:
        raise EvalError(f"--temperature must be > 0 to sample (or 0 for greedy), got {temperature}.")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model, tokenizer = load_generator(model_path, flag)
    model.to(device).eval()
    with progress_bar(len(prompts), f"completions of the {flag}") as advance:
        out = complete_texts(model, tokenizer, prompts, max_new_tokens, temperature, seed, batch_size, advance)
    return Generations(out.texts, [not terminated for terminated in out.terminated])
