"""Policy-gradient losses: PPO's clipped surrogate objectives for the policy and the value function (and
explained variance), GRPO's per-token loss with TRL 1.16's variants (GSPO, two-sided clipping, CISPO, SAPO, LUSPO,
VESPO, the bias-corrected KL, the high-entropy token mask) and the ways they reduce it to a scalar.

Inputs outside the mask are replaced with neutral values (log-prob and log-ratio 0, advantage 0, value = return = 0)
before any arithmetic, so padding holding garbage or inf cannot produce inf/NaN in the loss or its gradient
(torch.where passes NaN gradients through the unselected branch if that branch overflowed).
"""

import math
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

    logprobs: (B, T) float, log-probs of the completion tokens under the policy being optimised (with grad).
    old_logprobs: (B, T) float, the same tokens' log-probs at generation time. advantages: (B, T) float.
    mask: (B, T) bool, True = real completion token. cliprange: c in clip(ratio, 1 - c, 1 + c).
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

    values: (B, T) float, current value predictions (with grad). old_values: (B, T) float, values at generation.
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


# aggregate_token_loss and grpo_per_token_loss; GRPOConfig.loss_type accepts these
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # per-token loss: PPO's clipped surrogate
STEP_NORMALISED_LOSS_TYPES = ("dapo", "cispo", "vespo")  # aggregate: token sum / the whole step's tokens (num_items)
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")

_VESPO_MIN_LOG_W = math.log(1e-8)  # VESPO's floor on log w (and TRL's): a weight of 1e-8
_VESPO_MAX_LOG_W = 20.0  # cap on each token's log-ratio and on log w: exp(20) is still finite in float32


class GRPOLossOutput(NamedTuple):
    """Per-token fields are (B, T) and 0 (False) outside the mask; phi is (B,).

    With importance_sampling_level="sequence" the per-completion values (ratio, clip flags) are repeated on each of
    the completion's tokens, so a token mean of a flag weighs completions by their length; TRL logs those as means
    over completions instead (any one masked token of the row carries the completion's value).
    """

    per_token_loss: Tensor  # policy term (times token_mask) + beta * kl; see grpo_per_token_loss for each loss_type
    ratio: Tensor  # the importance ratio r: exp(logprobs - old_logprobs), or the completion's GSPO ratio
    low_clipped: Tensor  # bool, clipped loss types only: r < 1 - eps_low and A < 0 (the clipped branch is active)
    high_clipped: Tensor  # bool, clipped loss types only: r > 1 + eps_high and A > 0
    kl: Tensor  # k3 estimate of KL(policy || reference) per token (times r with use_bias_correction_kl); 0 if beta == 0
    cispo_clipped: Tensor  # bool, cispo only: r > epsilon_high and A > 0 (the weight is capped)
    phi: Tensor  # (B,) vespo's gamma weight per completion (detached); ones for the other loss types


def grpo_per_token_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    epsilon_low: float,
    epsilon_high: float,
    ref_logprobs: Tensor | None,
    beta: float,
    *,
    loss_type: str,
    importance_sampling_level: str,
    delta: float | None,
    use_bias_correction_kl: bool,
    sapo_temperature_pos: float,
    sapo_temperature_neg: float,
    vespo_k_pos: float,
    vespo_lambda_pos: float,
    vespo_k_neg: float,
    vespo_lambda_neg: float,
    token_mask: Tensor | None = None,
) -> GRPOLossOutput:
    """Per-token loss of GRPO (Shao et al. 2024, eq. 3) and its variants, as TRL 1.16 computes them.

    logprobs: (B, T) float, completion-token log-probs under the policy being optimised (with grad).
    old_logprobs: (B, T), the same at generation time (equal to logprobs.detach() when each batch is used once).
    advantages: (B,) float, one advantage per completion, shared by its tokens. mask: (B, T) bool, True = counts.
    ref_logprobs: (B, T) reference log-probs, needed when beta > 0; the KL term is the k3 estimator
    exp(ref - logp) - (ref - logp) - 1, which is >= 0 and has a gradient pulling logp towards ref.

    The importance ratio r (importance_sampling_level):
      "token":    r_t = exp(logp_t - old_t), one per token (GRPO).
      "sequence": r = exp(mean over the completion's tokens of (logp_t - old_t)), one per completion, repeated on
                  its tokens (GSPO, Zheng et al. 2025, arXiv 2507.18071); the gradient reaches every token of the
                  completion through r.

    The policy term per token (A = the completion's advantage), by loss_type:
      grpo, bnpo, dr_grpo, dapo, luspo: -min(r' A, clip(r, 1 - epsilon_low, 1 + epsilon_high) A), the clipped
          surrogate (PPO; DAPO's asymmetric bounds, Yu et al. 2025), r' = min(r, delta) when delta is set
          (two-sided clipping, INTELLECT-2 report, arXiv 2505.07291: a large ratio with A < 0 no longer grows
          the loss without bound). These five differ only in aggregate_token_loss.
      cispo: -sg(min(r, epsilon_high)) A logp (MiniMax-M1, arXiv 2506.13585): the capped ratio is a constant
          weight on a REINFORCE term, so a token past the cap still gets a gradient. epsilon_high is the cap
          itself, not 1 + epsilon_high (ScaleRL, arXiv 2510.13786, uses 5); TRL passes its epsilon_high, which
          defaults to epsilon = 0.2, a cap below every ratio near 1.
      sapo: -(4 / tau) sigmoid(tau (r - 1)) A, tau = sapo_temperature_pos if A > 0 else sapo_temperature_neg
          (SAPO, arXiv 2511.20347): a soft gate with the plain surrogate's gradient at r = 1 that fades
          off-policy.
      vespo: -sg(phi(w)) A logp (VESPO, arXiv 2602.10693), w = exp(sum over the completion of
          clamp(logp_t - old_t, -20, 20)), the product of the token ratios (not GSPO's geometric mean), log w
          clamped to [ln 1e-8, 20], and phi(w) = exp(lam + k ln w - lam w) = e^lam w^k e^(-lam w), a
          gamma-shaped weight with phi(1) = 1; (k, lam) = (vespo_k_pos, vespo_lambda_pos) if A >= 0 else
          (vespo_k_neg, vespo_lambda_neg), lam >= 1e-4 (see vespo_gamma_weights). phi ignores
          importance_sampling_level (TRL warns unless "token"), which then only changes the r of the KL term.
      sg = stop-gradient. The values of the cispo and vespo terms are not objectives; only their gradients are.

    token_mask: optional (B, T) bool or float (or anything broadcasting to (B, T), such as a (B, 1) sequence
    mask); multiplies the policy term only, before the KL is added, as TRL applies top_entropy_quantile (see
    high_entropy_mask). delta: None, or the cap on r in the clipped surrogate's unclipped branch.
    use_bias_correction_kl: multiply the k3 term by r (DeepSeek-V3.2, arXiv 2512.02556), so its gradient is an
    unbiased reverse-KL gradient when old != policy; as in TRL, r is not detached (it changes the KL gradient even
    where r == 1) and the returned kl is the product; False keeps the GRPO paper's term. Every setting is an
    argument without a default: the defaults are GRPOConfig's (TRL's).

    Clip flags: low/high_clipped for the clipped loss types are computed on min(r, delta) as TRL does (identical to
    r itself when delta > 1 + epsilon_high, which GRPOConfig enforces) and are all False for cispo, sapo and vespo;
    cispo_clipped is all False except for cispo. phi is all ones except for vespo.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {LOSS_TYPES}")
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"unknown importance_sampling_level {importance_sampling_level!r}; expected one of "
            f"{IMPORTANCE_SAMPLING_LEVELS}"
        )
    log_ratio = torch.where(mask, logprobs - old_logprobs, 0.0)
    if importance_sampling_level == "sequence":
        lengths = mask.sum(-1, keepdim=True).clamp(min=1)
        log_ratio_is = (log_ratio.sum(-1, keepdim=True) / lengths).expand_as(log_ratio)
    else:
        log_ratio_is = log_ratio
    ratio = torch.exp(log_ratio_is)
    a = torch.where(mask, advantages[:, None].to(ratio.dtype), 0.0)
    low_clipped, high_clipped, cispo_clipped = (torch.zeros_like(mask) for _ in range(3))
    phi = torch.ones(ratio.shape[0], dtype=ratio.dtype, device=ratio.device)
    if loss_type in CLIPPED_LOSS_TYPES:
        clipped_ratio = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
        capped_ratio = ratio if delta is None else torch.clamp(ratio, max=delta)
        per_token_loss = -torch.minimum(capped_ratio * a, clipped_ratio * a)
        low_clipped = (capped_ratio < 1.0 - epsilon_low) & (a < 0) & mask
        high_clipped = (capped_ratio > 1.0 + epsilon_high) & (a > 0) & mask
    elif loss_type == "cispo":
        logp = torch.where(mask, logprobs, 0.0)
        per_token_loss = -torch.clamp(ratio, max=epsilon_high).detach() * a * logp
        cispo_clipped = (ratio > epsilon_high) & (a > 0) & mask
    elif loss_type == "sapo":
        tau = torch.full_like(ratio, sapo_temperature_neg).masked_fill(a > 0, sapo_temperature_pos)
        per_token_loss = -(torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau) * a
    else:  # vespo
        phi = vespo_gamma_weights(
            log_ratio, advantages, mask, vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg
        )
        logp = torch.where(mask, logprobs, 0.0)
        per_token_loss = -phi[:, None] * a * logp
    if token_mask is not None:
        if token_mask.dtype == torch.bool:
            per_token_loss = torch.where(token_mask, per_token_loss, 0.0)
        else:
            per_token_loss = per_token_loss * torch.where(mask, token_mask.to(per_token_loss.dtype), 0.0)
    kl = torch.zeros_like(per_token_loss)
    if beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs ref_logprobs")
        d = torch.where(mask, ref_logprobs - logprobs, 0.0)
        kl = torch.expm1(d) - d
        if use_bias_correction_kl:
            kl = kl * ratio
        per_token_loss = per_token_loss + beta * kl
    return GRPOLossOutput(
        per_token_loss=torch.where(mask, per_token_loss, 0.0),
        ratio=torch.where(mask, ratio, 0.0),
        low_clipped=low_clipped,
        high_clipped=high_clipped,
        kl=torch.where(mask, kl, 0.0),
        cispo_clipped=cispo_clipped,
        phi=phi,
    )


def vespo_gamma_weights(
    log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    k_pos: float,
    lambda_pos: float,
    k_neg: float,
    lambda_neg: float,
) -> Tensor:
    """VESPO's per-completion weight phi(w) = e^lam w^k e^(-lam w) (arXiv 2602.10693), in log space; detached.

    log_ratio: (B, T) float, logprobs - old_logprobs per token. advantages: (B,) float. mask: (B, T) bool.
    Returns (B,) in log_ratio's dtype, without grad. log w = sum of the completion's token log-ratios, each clamped
    to [-20, 20], then clamped to [ln 1e-8, 20]; (k, lam) = (k_pos, lambda_pos) if A >= 0 else (k_neg, lambda_neg),
    lam at least 1e-4. phi(1) = 1, phi is largest at w = k / lam and falls to 0 as w -> 0 or w -> inf, so
    completions whose ratio drifted far in either direction get little gradient; a NaN weight becomes 0. An empty
    completion has w = 1, phi = 1.
    """
    log_ratio = torch.where(mask, log_ratio.detach().clamp(-_VESPO_MAX_LOG_W, _VESPO_MAX_LOG_W), 0.0)
    log_w = log_ratio.sum(-1).clamp(_VESPO_MIN_LOG_W, _VESPO_MAX_LOG_W)
    nonnegative = advantages >= 0
    k = torch.full_like(log_w, k_neg).masked_fill(nonnegative, k_pos)
    lam = torch.full_like(log_w, lambda_neg).masked_fill(nonnegative, lambda_pos).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def high_entropy_mask(
    entropies: Tensor, mask: Tensor, threshold_quantile: float, *, pooled_entropies: Tensor | None = None
) -> Tensor:
    """The tokens whose entropy is at least the threshold_quantile-quantile of the pooled entropies (Wang et al.
    2025, "Beyond the 80/20 Rule", arXiv 2506.01939: the policy gradient only on high-entropy "forking" tokens).

    entropies: (B, T) float, per-token entropy of the policy's next-token distribution. mask: (B, T) bool.
    threshold_quantile: q in [0, 1], 1 - top_entropy_quantile: 0.8 keeps the top 20 %, 0 keeps every token, 1
    keeps only the largest entropy (ties included). Returns (B, T) bool, False outside the mask; all False when
    nothing is pooled. The quantile interpolates linearly between order statistics (torch.quantile, which refuses
    more than 2^24 values), in float32 or better. entropies[mask] syncs with the host (TRL's does too).
    pooled_entropies: 1-D values to take the quantile of; default entropies[mask]. TRL pools the masked entropies
    of the micro-batch across all processes (padded gather) and thresholds each process's tokens by that one
    quantile; pass the gathered values here to do the same, or nothing for a per-process quantile.
    """
    dtype = torch.promote_types(entropies.dtype, torch.float32)
    pooled = entropies[mask] if pooled_entropies is None else pooled_entropies.reshape(-1)
    if pooled.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(pooled.to(dtype), threshold_quantile)
    return (entropies.to(dtype) >= threshold) & mask


def aggregate_token_loss(
    per_token_loss: Tensor,
    mask: Tensor,
    loss_type: str,
    max_completion_length: int | None = None,
    num_items: float | Tensor | None = None,
) -> Tensor:
    """Reduce a (B, T) per-token loss to the scalar a micro-batch backpropagates, per GRPO variant.

    "grpo", "sapo":  mean over completions of each completion's token mean (DeepSeekMath); long completions get
               less weight per token, which Liu et al. 2025 ("Understanding R1-Zero-Like Training") show biases length.
    "bnpo":    token mean over the micro-batch.
    "dr_grpo": token sum / (B * max_completion_length) (Dr. GRPO): a constant normaliser, no length bias.
    "dapo", "cispo", "vespo":  token sum / num_items (DAPO, Yu et al. 2025), num_items = the loss tokens of the
               whole optimizer step (all micro-batches, all processes) divided by the number of processes, which
               average their gradients: every token of the step weighs the same.
    "luspo":   mean over completions of each completion's token sum (LUSPO, arXiv 2602.05261): with a
               sequence-level ratio, GSPO's per-completion loss scaled by the completion's length, so long completions
               are not down-weighted.
    mask: (B, T) bool, True = counts. Returns ().
    """
    summed = torch.where(mask, per_token_loss, 0.0)
    if loss_type in ("grpo", "sapo"):
        return (summed.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return summed.sum() / mask.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type 'dr_grpo' needs max_completion_length")
        return summed.sum() / (per_token_loss.shape[0] * max_completion_length)
    if loss_type in STEP_NORMALISED_LOSS_TYPES:
        if num_items is None:
            raise ValueError(f"loss_type {loss_type!r} needs num_items (tokens of the optimizer step)")
        return summed.sum() / max(float(num_items), 1.0)
    if loss_type == "luspo":
        return summed.sum(-1).mean()
    raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {LOSS_TYPES}")
