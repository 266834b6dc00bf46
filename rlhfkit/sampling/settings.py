"""What to sample: transformers' GenerationConfig built from TRL's options, and the tokens that end a completion."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase


def terminator_ids(
    tokenizer: PreTrainedTokenizerBase, model: nn.Module | None = None, stop_token_id: int | None = None
) -> list[int]:
    """Every token id that ends a completion: all EOS ids of the tokenizer and generation config, plus the stop token.

    Models such as Phi-3.5 declare several EOS ids; counting only tokenizer.eos_token_id miscounts
    terminated completions (TRL PR #7039).
    """
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_config = getattr(model, "generation_config", None)
    eos = getattr(gen_config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, Iterable):
        ids.update(int(i) for i in eos)
    if stop_token_id is not None:
        ids.add(int(stop_token_id))
    return sorted(ids)


def sampling_config(
    max_new_tokens: int,
    temperature: float | None,
    pad_token_id: int,
    stop_ids: list[int],
    top_p: float = 1.0,
    top_k: int = 0,
    *,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    generation_kwargs: dict[str, Any] | None = None,
) -> GenerationConfig:
    """Sampling at `temperature` (the full distribution unless top_p < 1, top_k > 0 or min_p is set), or greedy
    when None; TRL's GRPOConfig options, with transformers' meanings.

    - min_p: drop the tokens whose probability is below min_p times the most likely token's (after temperature,
      top_k and top_p). Sampling only, as in transformers (ignored when greedy).
    - repetition_penalty: divide the positive raw logits (multiply the negative ones) of every token already in
      the sequence, prompt and completion, before temperature (CTRL's penalty; transformers' generate decides
      whether a prompt's left padding counts, and both of rlhfkit's decoding paths follow it). Greedy decoding
      applies it too. 1.0: none.
    - generation_kwargs: extra GenerationConfig fields, overriding the ones above (as TRL does). The lean
      decoding loop implements the options above; any other active option (num_beams, no_repeat_ngram_size,
      bad_words_ids, ...) sends generation to ``model.generate``, with a notice said once. An unknown field name
      is a ValueError.

    The log-probs used in the losses are those of the temperature-scaled full distribution, without the
    repetition penalty or any truncation; with these options (or top_p/top_k) the sampler draws from another one
    (as TRL does), so keep them at their defaults for exact on-policy ratios.
    """
    fields: dict[str, Any] = dict(max_new_tokens=max_new_tokens, pad_token_id=pad_token_id, eos_token_id=stop_ids)
    if repetition_penalty != 1.0:
        fields["repetition_penalty"] = repetition_penalty
    if temperature is None:
        fields["do_sample"] = False
    else:
        fields.update(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
        if min_p is not None:
            fields["min_p"] = min_p
    if generation_kwargs:
        unknown = sorted(set(generation_kwargs) - generation_config_fields())
        if unknown:
            raise ValueError(
                f"generation_kwargs: unknown GenerationConfig field(s) {', '.join(map(repr, unknown))} "
                f"(transformers {_transformers_version()})."
            )
        fields.update(generation_kwargs)
    penalty = fields.get("repetition_penalty")
    if penalty is not None:
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not penalty > 0:
            raise ValueError(f"repetition_penalty={penalty!r}: must be a number > 0 (1.0: no penalty).")
        fields["repetition_penalty"] = float(penalty)  # transformers' processor takes floats only
    if fields.get("min_p") is not None and not 0 <= fields["min_p"] <= 1:
        raise ValueError(f"min_p={fields['min_p']!r}: must be a number in [0, 1].")
    if fields.get("num_return_sequences") not in (None, 1):
        raise ValueError(
            f"generation_kwargs: num_return_sequences={fields['num_return_sequences']!r}: rlhfkit draws one "
            "completion per prompt row; repeat the prompts instead (as GRPO's num_generations does)."
        )
    return GenerationConfig(**fields)


@functools.cache
def generation_config_fields() -> frozenset[str]:
    return frozenset(name for name in GenerationConfig().to_dict() if not name.startswith("_")) - {
        "transformers_version"
    }


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def temperature_of(config: GenerationConfig) -> float:
    """The temperature the log-probs are taken at (1 where the config leaves it unset)."""
    return 1.0 if config.temperature is None else config.temperature


def has_repetition_penalty(config: GenerationConfig) -> bool:
    return config.repetition_penalty is not None and config.repetition_penalty != 1.0


def stop_ids(config: GenerationConfig) -> list[int]:
    """The token ids that end a completion under `config` (its eos_token_id: one id, a list, or none)."""
    ids = config.eos_token_id
    if ids is None:
        return []
    return [int(ids)] if isinstance(ids, int) else [int(i) for i in ids]
