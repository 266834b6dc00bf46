"""Advantage estimators: GAE for PPO with a value head, group-relative advantages for GRPO."""

from typing import NamedTuple

import torch
from torch import Tensor

GROUP_SCALES = ("group", "batch", "none")  # group_advantages; GRPOConfig.scale_rewards accepts these
# How several rewards become one advantage; GRPOConfig.multi_objective_aggregation accepts these (TRL 1.16's names):
# weighted sum, then group_advantages; or each reward normalised in its group first (decoupled_group_advantages).
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


class GAEOutput(NamedTuple):
    """Both (B, T), 0 outside the mask."""

    advantages: Tensor  # GAE(gamma, lam) advantage of each completion token
    returns: Tensor  # advantages + values: the value-function target (lambda-return)


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> GAEOutput:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) over each completion's steps, the positions
    of `mask`.

    rewards: (B, T) float, per-token rewards (e.g. `kl_penalized_rewards(...).rewards`).
    values: (B, T) float, value estimates V(s_t) at generation. mask: (B, T) bool, True = a step of the episode:
    a token the policy sampled. gamma: discount. lam: GAE lambda. With t' the next True position after t in its row:
      delta_t = r_t + gamma * V(s_t') - V(s_t);   A_t = delta_t + gamma * lam * A_t'.
    After the last True of a row the episode is over: V = 0 and A = 0 there, so the last step bootstraps from
    nothing. Positions outside the mask are not steps, wherever they are: their rewards and values are never read
    and the recursion links each step to the next step across them, so a row with holes (a multi-turn episode's
    tool results between the policy's turns) gets exactly the GAE of its steps compacted into one sequence (as
    verl's GAE skips observation tokens). For right-padded completions (the mask a prefix) this is plain GAE.
    Returns GAEOutput(advantages, returns), both 0 outside the mask.
    """
    rewards = torch.where(mask, rewards, 0.0)
    values = torch.where(mask, values, 0.0)
    T = rewards.shape[-1]
    next_value = next_advantage = rewards.new_zeros(rewards.shape[:-1])  # nothing after the last step
    reversed_advantages = []
    # A reverse loop over T: completions are short, and the recursion is the definition, easy to check by eye.
    for t in reversed(range(T)):
        step = mask[..., t]
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        # Outside the mask the carried value and advantage pass through unchanged (no discount): a skipped position.
        next_advantage = torch.where(step, delta + gamma * lam * next_advantage, next_advantage)
        next_value = torch.where(step, values[..., t], next_value)
        reversed_advantages.append(next_advantage)
    advantages = torch.stack(reversed_advantages[::-1], dim=-1) if T > 0 else torch.zeros_like(rewards)
    advantages = torch.where(mask, advantages, 0.0)
    returns = torch.where(mask, advantages + values, 0.0)
    return GAEOutput(advantages=advantages, returns=returns)


def _std(x: Tensor, dim: int | None = None) -> Tensor:
    """Unbiased std (torch.std's default), but 0 instead of NaN when there is a single element."""
    n = x.numel() if dim is None else x.shape[dim]
    if n < 2:
        return torch.zeros_like(x.sum() if dim is None else x.sum(dim, keepdim=True))
    return x.std() if dim is None else x.std(dim, keepdim=True)


def group_advantages(rewards: Tensor, group_size: int, scale: str, eps: float = 1e-4) -> Tensor:
    """GRPO advantages: each completion's reward relative to the other completions of the same prompt.

    rewards: (B,) float with B = num_groups * G; the G completions of one prompt are contiguous
    (rows [g*G, (g+1)*G) form group g). group_size: G.
    scale: "group": A = (r - mean_group) / (std_group + eps), DeepSeekMath's GRPO;
           "batch": A = (r - mean_group) / (std_batch + eps), one std over all B rewards (TRL
                    scale_rewards="batch", as in "Understanding R1-Zero-Like Training" / Dr. GRPO variants);
           "none":  A = r - mean_group (Dr. GRPO: no std division, which up-weights easy/hard prompts).
    std is unbiased (torch.std default, as TRL); with one element it is 0. eps must be > 0 for "group"/"batch"
    so that groups whose completions all got the same reward give A = 0 rather than 0/0.
    Returns (B,).
    """
    if scale not in GROUP_SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; expected one of {GROUP_SCALES}")
    if group_size < 1 or rewards.shape[0] % group_size != 0:
        raise ValueError(f"{rewards.shape[0]} rewards do not split into groups of {group_size}")
    grouped = rewards.reshape(-1, group_size)
    # The group mean is refined with one correction pass (mean of the residuals): identical rewards then centre
    # to exactly 0, instead of to a rounding error of ~1 ulp that the division by (0 + eps) would magnify 1e4-fold.
    mean = grouped.mean(dim=1, keepdim=True)
    mean = mean + (grouped - mean).mean(dim=1, keepdim=True)
    centred = grouped - mean
    if scale == "group":
        centred = centred / (_std(centred, dim=1) + eps)
    elif scale == "batch":
        centred = centred / (_std(rewards) + eps)
    return centred.reshape(rewards.shape)


def _nan_std(x: Tensor, dim: int | None = None) -> Tensor:
    """Unbiased std over the non-NaN values (keepdim along `dim`); NaN with fewer than 2 of them (TRL's nanstd)."""
    mean = torch.nanmean(x, dim=dim, keepdim=dim is not None)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=dim is not None)
    squares = torch.nansum((x - mean).square(), dim=dim, keepdim=dim is not None)
    return torch.where(count > 1, squares / (count - 1).clamp(min=1), torch.nan).sqrt()


def _nan_centred(x: Tensor, dim: int | None = None) -> Tensor:
    """x minus the mean of its non-NaN values, the mean refined by one pass as in group_advantages (identical values
    centre to exactly 0)."""
    keep = dim is not None
    mean = torch.nanmean(x, dim=dim, keepdim=keep)
    mean = mean + torch.nanmean(x - mean, dim=dim, keepdim=keep)
    return x - mean


def decoupled_group_advantages(rewards: Tensor, weights: Tensor, group_size: int, eps: float = 1e-4) -> Tensor:
    """GDPO's advantages (arXiv 2601.05242; TRL 1.16's multi_objective_aggregation="normalize_then_sum"): each reward
    normalised within its group first, so a reward with a large scale or spread cannot drown the others.

    rewards: (K, B) float, reward source k's raw value for completion i, NaN where the source does not apply; the G
    completions of a prompt are contiguous (B = groups x G). weights: (K,) the sources' weights w_k. group_size: G.

      a_ik = (r_ik - mean_group(r_k)) / (std_group(r_k) + eps)   per source, over the group's scored completions
      R_i  = sum_k w_k a_ik                                      over the sources with a value (NaN counts as 0)
      A_i  = (R_i - mean_batch(R)) / (std_batch(R) + eps)        over the whole batch

    The group std always divides (TRL ignores scale_rewards here), and the second normalisation is over the batch,
    not the group. Stds are unbiased, as TRL's nanstd; a source with fewer than 2 values in a group contributes 0
    there. A completion no source scores gets A = 0 (TRL's nan_to_num), and so does every completion of a batch with
    fewer than 2 scored ones. Returns (B,) in the rewards' dtype (float64 recommended: tied rewards then give 0).
    """
    K, B = rewards.shape
    if group_size < 1 or B % group_size != 0:
        raise ValueError(f"{B} rewards do not split into groups of {group_size}")
    if weights.shape != (K,):
        raise ValueError(f"{weights.shape[0] if weights.dim() else 0} weights for {K} reward sources")
    grouped = rewards.reshape(K, -1, group_size)
    normalised = _nan_centred(grouped, dim=-1) / (_nan_std(grouped, dim=-1) + eps)
    weighted = normalised.reshape(K, B) * weights.to(rewards.dtype)[:, None]
    unscored = torch.isnan(rewards).all(0)
    total = torch.where(unscored, torch.nan, torch.nansum(weighted, dim=0))
    advantages = _nan_centred(total) / (_nan_std(total) + eps)
    return torch.nan_to_num(advantages, nan=0.0)
