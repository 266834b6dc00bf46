"""Scores from reward models (and, for the built-in task, its checker)."""

from __future__ import annotations

import torch
from torch import nn

from rlhfkit import ops
from rlhfkit.models import token_values


@torch.inference_mode()
def reward_model_scores(
    reward_model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Reward-model score (B,) read at the last real token of each sequence.

    input_ids, attention_mask: (B, L); attention_mask bool, True = real token. With a left-padded query and a
    right-padded response, the last real token is the response's terminator (or its last token if truncated).
    """
    values = token_values(reward_model, input_ids, attention_mask)
    last = ops.last_true_index(attention_mask)
    return values.gather(1, last.clamp(min=0)[:, None]).squeeze(1)


def apply_eos_trick(
    scores: torch.Tensor,
    terminated: torch.Tensor,
    missing_eos_penalty: float | None,
    non_eos_penalty: bool,
    penalty_reward_value: float,
) -> torch.Tensor:
    """Penalise responses that never produced the stop token.

    non_eos_penalty replaces their score by penalty_reward_value (the N+ implementation details / CleanRL);
    missing_eos_penalty subtracts a constant (TRL's current option). Both may be combined: replace, then subtract.
    """
    scores = scores.clone()
    if non_eos_penalty:
        scores[~terminated] = penalty_reward_value
    if missing_eos_penalty is not None:
        scores[~terminated] -= missing_eos_penalty
    return scores
