"""Policy-gradient losses: PPO's clipped surrogate objectives for the policy and the value function (and
explained variance), GRPO's per-token loss and the ways its variants reduce it to a scalar.

Inputs outside the mask are replaced with neutral values (log-ratio 0, advantage 0, value = return = 0)
before any arithmetic, so padding holding garbage or inf cannot produce inf/NaN in the loss or its gradient
(torch.where passes NaN gradients through the unselected branch if that branch overflowed).
"""

from typing import NamedTuple

import torch
from torch import Tensor

from rlhfkit.ops.masked import masked_mean, masked_var


class PolicyLossOutput(NamedTuple):
    """loss is (); every other field is (B, T) and 0 (False) outside the mask."""

    loss: Tensor  # masked token mean of per_token_loss; what the optimiser minimises
    per_token_loss: Tensor  # max(-A * ratio, -A * clip(ratio, 1 - c, 1 + c))
    ratio: Tensor  # exp(logprobs - old_logprobs)
    clipped: Tensor  # bool: the clipped term is the larger one (strictly), so the token gets no gradient
    approx_kl: Tensor  # 0.5 * (logprobs - old_logprobs)^2, the k2 estimate of KL(old || new)


def clipped_policy_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, cliprange: float
) -> PolicyLossOutput:
    """PPO-clip policy loss (Schulman et al. 2017, eq. 7), negated for minimisation, as a token mean.

    logprobs: (B, T) float, log-probs of the response tokens under the policy being optimised (with grad).
    old_logprobs: (B, T) float, the same tokens' log-probs at rollout time. advantages: (B, T) float.
    mask: (B, T) bool, True = real response token. cliprange: c in clip(ratio, 1 - c, 1 + c).
    """
    log_ratio = torch.where(mask, logprobs - old_logprobs, 0.0)
    advantages = torch.where(mask, advantages, 0.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped_term = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    per_token_loss = torch.maximum(unclipped, clipped_term)
    return PolicyLossOutput(
        loss=masked_mean(per_token_loss, mask),
        per_token_loss=per_token_loss,
        ratio=torch.where(mask, ratio, 0.0),
        clipped=(clipped_term > unclipped) & mask,
        approx_kl=0.5 * log_ratio.square(),
    )


class ValueLossOutput(NamedTuple):
    """loss is (); every other field is (B, T) and 0 (False) outside the mask."""

    loss: Tensor  # masked token mean of per_token_loss (= 0.5 * mean of the clipped squared error)
    per_token_loss: Tensor  # 0.5 * max((v - R)^2, (clip(v, old - c, old + c) - R)^2)
    clipped: Tensor  # bool: the clipped error is the larger one (strictly)


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, cliprange_value: float
) -> ValueLossOutput:
    """Clipped value loss of OpenAI's PPO implementations (baselines ppo2, lm-human-preferences), as TRL.

    values: (B, T) float, current value predictions (with grad). old_values: (B, T) float, rollout values.
    returns: (B, T) float, GAE returns (targets). mask: (B, T) bool, True = counts.
    cliprange_value: how far the new prediction may move from the old one before the error stops improving.
    The pessimistic max of clipped and unclipped errors means a prediction that jumped past the clip range
    is penalised as if it had not moved closer to the return.
    """
    values = torch.where(mask, values, 0.0)
    old_values = torch.where(mask, old_values, 0.0)
    returns = torch.where(mask, returns, 0.0)
    clipped_values = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    unclipped_error = (values - returns).square()
    clipped_error = (clipped_values - returns).square()
    per_token_loss = 0.5 * torch.maximum(unclipped_error, clipped_error)
    return ValueLossOutput(
        loss=masked_mean(per_token_loss, mask),
        per_token_loss=per_token_loss,
        clipped=(clipped_error > unclipped_error) & mask,
    )


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """1 - Var[returns - values] / Var[returns] over the masked tokens: 1 is a perfect value function, 0 is no
    better than predicting the mean return, negative is worse than that.

    values, returns: (B, T) float. mask: (B, T) bool, True = counts. Returns () float (no grad needed).
    When the returns have no variance to explain (all equal, or fewer than 2 tokens) the ratio is undefined; we return
    0 instead of NaN, so logged curves and health rules stay finite (masked_var gives exactly 0 for equal values).
    """
    var_returns = masked_var(returns, mask)
    var_error = masked_var(returns - values, mask)
    no_variance = var_returns == 0
    return torch.where(no_variance, 0.0, 1.0 - var_error / torch.where(no_variance, 1.0, var_returns))


LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")  # aggregate_token_loss; GRPOConfig.loss_type accepts these


class GRPOLossOutput(NamedTuple):
    """per-token fields are (B, T) and 0 (False) outside the mask."""

    per_token_loss: Tensor  # -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) + beta * kl
    ratio: Tensor  # exp(logprobs - old_logprobs)
    low_clipped: Tensor  # bool: r < 1 - eps_low and A < 0 (the clipped branch is active at the lower bound)
    high_clipped: Tensor  # bool: r > 1 + eps_high and A > 0
    kl: Tensor  # k3 estimate of KL(policy || reference) per token; zeros when beta == 0


def grpo_per_token_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    epsilon_low: float,
    epsilon_high: float,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
) -> GRPOLossOutput:
    """Per-token GRPO loss (Shao et al. 2024, eq. 3) with DAPO's asymmetric clipping (Yu et al. 2025).

    logprobs: (B, T) float, completion-token log-probs under the policy being optimised (with grad).
    old_logprobs: (B, T), the same at generation time (equal to logprobs.detach() when each batch is used once).
    advantages: (B,) float, one advantage per completion, shared by its tokens. mask: (B, T) bool, True = counts.
    ref_logprobs: (B, T) reference log-probs, needed when beta > 0; the KL term is the k3 estimator
    exp(ref - logp) - (ref - logp) - 1, which is >= 0 and has a gradient pulling logp towards ref.
    """
    log_ratio = torch.where(mask, logprobs - old_logprobs, 0.0)
    ratio = torch.exp(log_ratio)
    a = torch.where(mask, advantages[:, None].to(ratio.dtype), 0.0)
    clipped_ratio = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    per_token_loss = -torch.minimum(ratio * a, clipped_ratio * a)
    kl = torch.zeros_like(per_token_loss)
    if beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs ref_logprobs")
        d = torch.where(mask, ref_logprobs - logprobs, 0.0)
        kl = torch.expm1(d) - d
        per_token_loss = per_token_loss + beta * kl
    return GRPOLossOutput(
        per_token_loss=torch.where(mask, per_token_loss, 0.0),
        ratio=torch.where(mask, ratio, 0.0),
        low_clipped=(ratio < 1.0 - epsilon_low) & (a < 0) & mask,
        high_clipped=(ratio > 1.0 + epsilon_high) & (a > 0) & mask,
        kl=torch.where(mask, kl, 0.0),
    )


def aggregate_token_loss(
    per_token_loss: Tensor,
    mask: Tensor,
    loss_type: str,
    max_completion_length: int | None = None,
    num_items: float | Tensor | None = None,
) -> Tensor:
    """Reduce a (B, T) per-token loss to the scalar a micro-batch backpropagates, per GRPO variant.

    "grpo":    mean over completions of each completion's token mean (DeepSeekMath); long completions get less
               weight per token, which Liu et al. 2025 ("Understanding R1-Zero-Like Training") show biases length.
    "bnpo":    token mean over the micro-batch.
    "dr_grpo": token sum / (B * max_completion_length) (Dr. GRPO): a constant normaliser, no length bias.
    "dapo":    token sum / num_items (DAPO, Yu et al. 2025), num_items = the loss tokens of the whole optimizer
               step (all micro-batches, all processes) divided by the number of processes, which average their
               gradients: every token of the step weighs the same.
    mask: (B, T) bool, True = counts. Returns ().
    """
    summed = torch.where(mask, per_token_loss, 0.0)
    if loss_type == "grpo":
        return (summed.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return summed.sum() / mask.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type 'dr_grpo' needs max_completion_length")
        return summed.sum() / (per_token_loss.shape[0] * max_completion_length)
    if loss_type == "dapo":
        if num_items is None:
            raise ValueError("loss_type 'dapo' needs num_items (tokens of the optimizer step)")
        return summed.sum() / max(float(num_items), 1.0)
    raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {LOSS_TYPES}")
