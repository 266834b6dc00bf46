"""Index and mask helpers for right-padded completion batches, and the EOS trick on their scores."""

from collections.abc import Sequence

import torch
from torch import Tensor


def first_true_index(bools: Tensor) -> Tensor:
    """Index of the first True in each row.

    bools: (B, T) bool. Returns (B,) long; T for a row with no True (so `index < T` means "found", and
    `arange(T) <= index` keeps everything up to and including the first hit).
    """
    T = bools.shape[-1]
    if T == 0:
        return torch.zeros(bools.shape[:-1], dtype=torch.long, device=bools.device)
    positions = torch.arange(T, device=bools.device)
    # Positions that are False become T, so the row minimum is the first True, or T when there is none.
    return torch.where(bools, positions, T).amin(dim=-1)


def last_true_index(mask: Tensor) -> Tensor:
    """Index of the last True in each row.

    mask: (B, T) bool. Returns (B,) long; -1 for a row with no True (an empty completion).
    """
    T = mask.shape[-1]
    return T - 1 - first_true_index(mask.flip(-1))


def last_true_value(values: Tensor, mask: Tensor) -> Tensor:
    """Each row's value at its last True: a reward model's score of a sequence, read at its last real token (with a
    left-padded prompt and a right-padded completion, the completion's terminator, or its last token if truncated).

    values: (B, L). mask: (B, L) bool. Returns (B,); a row with no True gives its first value.
    """
    return values.gather(1, last_true_index(mask).clamp(min=0)[:, None]).squeeze(1)


def truncate_after_stop_token(tokens: Tensor, stop_token_id: int | Sequence[int], pad_token_id: int) -> Tensor:
    """Replace everything after the first stop token of each row with padding; the stop token itself is kept.

    tokens: (B, T) long token ids. stop_token_id: one id or several (e.g. EOS and an end-of-turn token); the
    first occurrence of any of them ends the completion. Rows without a stop token are returned unchanged.
    Returns (B, T) long.
    """
    stop_ids = torch.as_tensor(stop_token_id, dtype=tokens.dtype, device=tokens.device).reshape(-1)
    is_stop = torch.isin(tokens, stop_ids)
    positions = torch.arange(tokens.shape[-1], device=tokens.device)
    keep = positions <= first_true_index(is_stop).unsqueeze(-1)
    return torch.where(keep, tokens, pad_token_id)


def mask_from_lengths(lengths: Tensor, T: int) -> Tensor:
    """Mask of the first `lengths[b]` positions of each row.

    lengths: (B,) integer, the number of real tokens per row (clipped to [0, T]). T: row width.
    Returns (B, T) bool, True = real token. Built from lengths rather than by comparing tokens with the pad id,
    because the pad id is often the EOS id, and the EOS that ends a completion must count.
    """
    return torch.arange(T, device=lengths.device) < lengths.unsqueeze(-1)


def apply_eos_trick(
    scores: torch.Tensor,
    terminated: torch.Tensor,
    missing_eos_penalty: float | None,
    non_eos_penalty: bool,
    penalty_reward_value: float,
) -> torch.Tensor:
    """Penalise completions that never produced the stop token.

    non_eos_penalty replaces their score by penalty_reward_value (the N+ implementation details / CleanRL);
    missing_eos_penalty subtracts a constant (TRL's current option). Both may be combined: replace, then subtract.
    """
    scores = scores.clone()
    if non_eos_penalty:
        scores[~terminated] = penalty_reward_value
    if missing_eos_penalty is not None:
        scores[~terminated] -= missing_eos_penalty
    return scores
