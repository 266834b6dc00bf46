"""Padding token sequences into batches: prompts on the left (generation appends to their right end), completions on
the right. Masks are bool, True = a real token, built from the lengths (never from pad ids, which may equal EOS).

A pad id need not be one the model can embed: TRL's examples/scripts/ppo/ppo.py adds a ``[PAD]`` token to the
tokenizer without resizing the model's embeddings. Padding reaches the forwards (masked out, but embedded all the
same), so the ids a model is fed are padded with :func:`model_pad_id`, and :func:`embeddable_ids` makes ids padded by
someone else safe to feed."""

from __future__ import annotations

import torch
from torch import nn


def left_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) token ids and bool mask of `sequences`, padded on the left to the longest."""
    return _pad(sequences, pad_token_id, left=True)


def right_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) token ids and bool mask of `sequences`, padded on the right to the longest."""
    return _pad(sequences, pad_token_id, left=False)


def _pad(sequences: list[list[int]], pad_token_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for i, seq in enumerate(sequences):
        if seq:
            where = slice(width - len(seq), width) if left else slice(0, len(seq))
            ids[i, where] = torch.tensor(seq, dtype=torch.long)
            mask[i, where] = True
    return ids, mask


def cat_padded(tensors: list[torch.Tensor], value: int | bool | float, left: bool = False) -> torch.Tensor:
    """(B_i, T_i) tensors concatenated along the batch, each padded with `value` to the widest: on the right (rows
    that start together: completions), or on the left (rows that end together: left-padded prompts)."""
    width = max(t.shape[1] for t in tensors)
    return torch.cat(
        [
            nn.functional.pad(t, (width - t.shape[1], 0) if left else (0, width - t.shape[1]), value=value)
            for t in tensors
        ]
    )


def embedding_rows(model: nn.Module) -> int | None:
    """How many token ids `model` can embed (its input embedding's rows), None when it cannot tell."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        embedding = get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        embedding = None
    rows = getattr(embedding, "num_embeddings", None)
    if rows is None:
        rows = getattr(getattr(model, "config", None), "vocab_size", None)
    return rows if isinstance(rows, int) else None


def model_pad_id(model: nn.Module, pad_token_id: int | None) -> int | None:
    """The id to pad `model`'s inputs with: `pad_token_id` when the model can embed it, else 0 (as TRL fills the
    padding of its forwards' inputs). The padding is masked out, so which real token stands in changes nothing."""
    rows = embedding_rows(model)
    if pad_token_id is None or rows is None or 0 <= pad_token_id < rows:
        return pad_token_id
    return 0


def embeddable_ids(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`input_ids` with each padded position (attention_mask False) that `model` cannot embed replaced by 0; real
    tokens are left as they are (an id the model cannot embed there is a real error). No host sync."""
    rows = embedding_rows(model)
    if rows is None:
        return input_ids
    return input_ids.masked_fill(~attention_mask.bool() & (input_ids >= rows), 0)
