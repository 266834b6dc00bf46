"""Sampling completions from a causal LM, as both trainers, the evaluation and the built-in task's builder do it.

- settings.py: the GenerationConfig of TRL's sampling options, and the tokens that end a completion;
- processors.py: the next token from the logits, as transformers' generate picks it (pure functions);
- decoders.py: the lean decoding loop over a dynamic or static KV cache;
- fallback.py: when the lean loop cannot sample, ``model.generate`` with the same kind of outputs;
- completions.py: generate (one of the two), truncation after the terminator, chunks of prompts and completions;
- padding.py: prompts padded on the left, completions on the right.
"""

from rlhfkit.sampling.completions import (
    Chunk,
    Completions,
    TextCompletions,
    complete,
    complete_texts,
    decode,
    generate,
    truncate_completions,
)
from rlhfkit.sampling.decoders import Generated
from rlhfkit.sampling.padding import cat_padded, embeddable_ids, left_pad, model_pad_id, right_pad
from rlhfkit.sampling.settings import sampling_config, terminator_ids

__all__ = [
    "Chunk",
    "Completions",
    "Generated",
    "TextCompletions",
    "cat_padded",
    "complete",
    "complete_texts",
    "decode",
    "embeddable_ids",
    "generate",
    "left_pad",
    "model_pad_id",
    "right_pad",
    "sampling_config",
    "terminator_ids",
    "truncate_completions",
]
