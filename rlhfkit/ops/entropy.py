"""Entropy regularisation of the GRPO loss, as TRL 1.16's GRPOTrainer applies it: a bonus of coef x the mean
per-token entropy subtracted from the loss, with a fixed coefficient or one moved after every optimizer step towards
a target entropy (the adaptive controller of Skywork-OR1, He et al. 2025, arXiv 2505.22312).

The trainer holds the controller's state (the coefficient and the entropy measured over the last optimizer step);
these functions only compute with it.
"""

import math

import torch
from torch import Tensor

from rlhfkit.ops.masked import masked_mean, masked_sum


def entropy_token_mask(mask: Tensor, token_mask: Tensor | None = None) -> Tensor:
    """The tokens the bonus acts on: the loss's mask, narrowed to token_mask (top_entropy_quantile's high-entropy
    tokens) when given. mask: (B, T) bool; token_mask: (B, T) bool or None. Returns (B, T) bool."""
    return mask if token_mask is None else mask & token_mask.bool()


def entropy_bonus(entropies: Tensor, mask: Tensor, token_mask: Tensor | None = None) -> Tensor:
    """H: the mean per-token entropy over the tokens the policy loss trains on, the term the loss subtracts
    coef x H of (before the division by gradient_accumulation_steps, which the caller does).

    entropies: (B, T) float, the policy's next-token entropy at each completion token (with grad: the bonus's
    gradient raises the entropy). mask: (B, T) bool, True = counts in the loss. token_mask: (B, T) bool or None,
    the high-entropy tokens of top_entropy_quantile. Returns (). An empty mask gives 0 (no tokens, no bonus).
    The mean does not depend on loss_type: the same coefficient means the same bonus for every policy loss.
    """
    return masked_mean(entropies, entropy_token_mask(mask, token_mask))


def entropy_window_sums(entropies: Tensor, mask: Tensor, token_mask: Tensor | None = None) -> Tensor:
    """(entropy sum, token count) of one micro-batch over entropy_token_mask, as a (2,) float64 tensor without
    grad: summed over the micro-batches of an optimizer step and over processes, sum / count is the step's
    token-weighted mean entropy, what the adaptive controller compares with its target."""
    tokens = entropy_token_mask(mask, token_mask)
    return torch.stack([masked_sum(entropies.detach().double(), tokens), tokens.sum().double()])


def window_entropy(sums: Tensor) -> float:
    """The mean entropy of entropy_window_sums (summed): sum / max(count, 1), so 0 when no token counted."""
    total, count = sums.tolist()
    return total / max(count, 1.0)


def applied_entropy_coef(coef: float, last_window_entropy: float, target: float, adaptive: bool) -> float:
    """The coefficient of this optimizer step's bonus: coef itself with a fixed coefficient; with the adaptive
    controller coef when the previous step's entropy was at or below target, else 0 (the bonus only lifts an
    entropy that has fallen). The first step has no previous entropy (last_window_entropy = inf): no bonus."""
    if not adaptive:
        return coef
    return coef if last_window_entropy <= target else 0.0


def adaptive_entropy_coef(
    coef: float, window_entropy: float, target: float, delta: float, coef_min: float, coef_max: float
) -> float:
    """The adaptive controller's step: the coefficient for the next optimizer step, after one that measured
    `window_entropy` (its token-weighted mean over every micro-batch and process).

    coef + delta, at most coef_max, when window_entropy <= target (entropy too low: push harder); coef - delta, at
    least coef_min, otherwise. A non-finite entropy raises ValueError: folding a NaN into the coefficient would
    silently decide every later step.
    """
    if not math.isfinite(window_entropy):
        raise ValueError(f"window_entropy must be finite, got {window_entropy}")
    if window_entropy <= target:
        return min(coef + delta, coef_max)
    return max(coef - delta, coef_min)
