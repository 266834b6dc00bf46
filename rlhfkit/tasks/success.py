"""Completions of the built-in task's prompts (several per prompt) and the task-success rate built on them, generated
the way the trainers sample (rlhfkit.sampling)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlhfkit.sampling import TextCompletions, complete_texts


def generate_completions(
    model,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int,
    temperature: float | None = None,
    num_samples: int = 1,
    batch_size: int = 64,
    seed: int = 0,
) -> TextCompletions:
    """`num_samples` completions per prompt, prompt-major (index = prompt_index * num_samples + sample): greedy when
    `temperature` is None, else pure sampling at that temperature, seeded (sampling.complete_texts)."""
    if temperature is not None and temperature <= 0:
        raise ValueError(f"temperature must be > 0 or None (greedy), got {temperature}")
    repeated = [prompt for prompt in prompts for _ in range(num_samples)]
    return complete_texts(model, tokenizer, repeated, max_new_tokens, temperature, seed, batch_size)


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
