"""PPO's clipped surrogate objectives for the policy and the value function, and explained variance.

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
