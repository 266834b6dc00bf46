"""Completions of a model saved on disk, for judging: greedy by default, seeded sampling on request."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch

from .errors import EvalError


class Generations(NamedTuple):
    """One completion per prompt, in prompt order.

    texts: the response up to (not including) its terminator, special tokens removed: what a judge reads.
    truncated: True where no terminator came within max_new_tokens (the text was cut off).
    """

    texts: list[str]
    truncated: list[bool]


@contextmanager
def quiet_loading():
    """Hide transformers' per-file "Loading weights" bars: two models load per evaluation, and the bars would bury
    the report. Restored afterwards."""
    import transformers.utils.logging as tf_logging

    was_enabled = tf_logging.is_progress_bar_enabled()
    tf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            tf_logging.enable_progress_bar()


def load_generator(path: str | Path, flag: str):
    """(model, tokenizer) of a causal LM, a hub id or a save_pretrained directory that holds both; a name that
    cannot be loaded is a ModelLoadError naming `--{flag}`."""
    from rlhfkit.models import load_policy, load_tokenizer, native_dtype

    tokenizer = load_tokenizer(str(path), flag=flag)
    with quiet_loading():
        model = load_policy(str(path), native_dtype(), flag=flag)
    return model, tokenizer


@torch.inference_mode()
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
    forked RNG, as the trainers sample. Prompts are tokenized without special tokens and left-padded, as the
    trainers do, so a policy is evaluated on exactly the inputs it was trained on. Every EOS id of the tokenizer
    and the generation config ends a response (`terminator_ids`).
    """
    from rlhfkit.data import left_pad
    from rlhfkit.rollout import decode, generate, sampling_config, terminator_ids, truncate_responses

    if temperature is not None and temperature <= 0:
        raise EvalError(f"--temperature must be > 0 to sample (or 0 for greedy), got {temperature}.")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model, tokenizer = load_generator(model_path, flag)
    model.to(device).eval()
    stop_ids = terminator_ids(tokenizer, model)
    config = sampling_config(max_new_tokens, temperature, tokenizer.pad_token_id, stop_ids)
    encoded = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    texts: list[str] = []
    truncated: list[bool] = []
    cuda_devices = [] if device.type == "cpu" else [device.index if device.index is not None else 0]
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(seed)
        for start in range(0, len(encoded), batch_size):
            ids, mask = left_pad(encoded[start : start + batch_size], tokenizer.pad_token_id)
            raw = generate(model, ids.to(device), mask.to(device), config).tokens.cpu()
            responses = truncate_responses(raw, stop_ids, tokenizer.pad_token_id)
            text_mask = responses.mask & ~torch.isin(responses.ids, torch.tensor(stop_ids))  # drop the terminator
            texts += decode(tokenizer, responses.ids, text_mask)
            truncated += (~responses.terminated).tolist()
    return Generations(texts, truncated)
