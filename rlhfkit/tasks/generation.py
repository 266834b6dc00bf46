"""Batched generation with Hugging Face `generate`, and the task-success evaluation built on it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from transformers import GenerationConfig


class Completions(NamedTuple):
    """Decoded responses, one per (prompt, sample), prompt-major: index = prompt_index * num_samples + sample.

    texts: response text up to (not including) the first EOS, special tokens removed.
    ended: True where the response contained an EOS (False = cut off at max_new_tokens).
    token_ids: response token ids up to and including the first EOS (no padding).
    """

    texts: list[str]
    ended: list[bool]
    token_ids: list[list[int]]


@torch.no_grad()
def generate_completions(
    model,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int,
    temperature: float | None = None,
    num_samples: int = 1,
    batch_size: int = 64,
    seed: int = 0,
) -> Completions:
    """Generate `num_samples` responses per prompt; greedy when `temperature` is None, else pure sampling
    (top_k=0, top_p=1) at that temperature. Prompts are left-padded; generation stops at the tokenizer's EOS.

    The global torch RNG is forked and seeded with `seed`, so results are reproducible and the caller's RNG state
    is untouched.
    """
    if temperature is not None and temperature <= 0:
        raise ValueError(f"temperature must be > 0 or None (greedy), got {temperature}")
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=temperature is not None,
        temperature=temperature if temperature is not None else 1.0,
        top_k=0 if temperature is not None else None,
        top_p=1.0,
        num_return_sequences=num_samples,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
    )
    was_training = model.training
    model.eval()
    texts: list[str] = []
    ended: list[bool] = []
    token_ids: list[list[int]] = []
    device = next(model.parameters()).device
    prompt_batch = max(1, batch_size // num_samples)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(prompts), prompt_batch):
            batch = tokenizer(
                list(prompts[start : start + prompt_batch]), return_tensors="pt", padding=True, padding_side="left"
            ).to(device)
            out = model.generate(**batch, generation_config=config)
            for row in out[:, batch["input_ids"].shape[1] :].tolist():
                stop = row.index(eos_id) if eos_id in row else len(row)
                ids = row[: stop + 1] if stop < len(row) else row
                token_ids.append(ids)
                ended.append(stop < len(row))
                texts.append(tokenizer.decode(row[:stop], skip_special_tokens=True))
    model.train(was_training)
    return Completions(texts, ended, token_ids)


def evaluate_success(
    model,
    tokenizer,
    prompts: Sequence[str],
    check: Callable[[str, str], bool],
    max_new_tokens: int,
    temperature: float | None = None,
    batch_size: int = 64,
    seed: int = 0,
) -> float:
    """Fraction of `prompts` whose generated completion passes `check(prompt, completion)`.

    Greedy when `temperature` is None (the eval/task_success definition), else one sample per prompt.
    """
    if len(prompts) == 0:
        raise ValueError("evaluate_success needs at least one prompt")
    comps = generate_completions(model, tokenizer, prompts, max_new_tokens, temperature, 1, batch_size, seed)
    return sum(check(p, c) for p, c in zip(prompts, comps.texts, strict=True)) / len(prompts)
