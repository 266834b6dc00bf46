"""Padding token sequences into batches: prompts on the left (generation appends to their right end), completions on
the right. Masks are bool, True = a real token, built from the lengths (never from pad ids, which may equal EOS)."""

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
