"""How far the sampler's log-probs are from the trainer's, and the correction of a batch sampled on older weights: the
sampling/* metrics of a fresh batch (log_sampling_mismatch) and the off_policy/* metrics and importance weights of a
batch the generation worker sampled (off_policy_weights), for both trainers' micro-steps (docs/async.md)."""

from __future__ import annotations

import torch

from rlhfkit import ops
from rlhfkit.metrics import registry as M
from rlhfkit.metrics.accumulate import MetricAccumulator


def log_sampling_mismatch(
    metrics: MetricAccumulator, logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, mask: torch.Tensor
) -> None:
    """The sampling/* metrics: how far the training forward's log-probs `logprobs` (B, T) are from the sampler's
    (B, T) on the same weights, over the tokens of `mask` (B, T) bool. Call it only before any optimizer step on
    the generation: afterwards the gap includes the update."""
    gap = (logprobs.detach().double() - sampling_logprobs.double()).masked_fill(~mask, 0.0)
    metrics.add_tensor(M.SAMPLING_LOGP_DIFFERENCE_MEAN, gap.abs(), mask)
    metrics.add_tensor(M.SAMPLING_LOGP_DIFFERENCE_MAX, gap.abs(), mask)
    metrics.add_tensor(M.SAMPLING_MISMATCHED_TOKENS, (gap.abs() > M.MISMATCH_NATS).double(), mask)
    ratio = gap.exp()
    for metric in (M.SAMPLING_IS_RATIO_MEAN, M.SAMPLING_IS_RATIO_MIN, M.SAMPLING_IS_RATIO_MAX):
        metrics.add_tensor(metric, ratio, mask)


@torch.no_grad()
def off_policy_weights(
    metrics, old_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, mask: torch.Tensor, staleness: int, args
) -> torch.Tensor | None:
    """One micro-batch the worker sampled, in either trainer: log how far the trainer's log-probs `old_logprobs`
    (B, T) are from the worker's `sampling_logprobs` (B, T) over `mask` (off_policy/*), and return the per-token
    weights (B, T) of TRL 1.16's importance-sampling correction (ops.off_policy_correction with the
    vllm_importance_sampling_* settings) for a stale batch, or None: a batch sampled on the current weights is not
    reweighted, as in the synchronous trainer, nor is any with vllm_importance_sampling_correction off."""
    d = (old_logprobs.double() - sampling_logprobs.double()).masked_fill(~mask, 0.0)
    metrics.add_tensor(M.OFF_POLICY_MISMATCH_KL, d.exp() - 1 - d, mask)
    if staleness == 0 or not args.vllm_importance_sampling_correction:
        return None
    correction = ops.off_policy_correction(
        old_logprobs,
        sampling_logprobs,
        mask,
        args.vllm_importance_sampling_mode,
        args.vllm_importance_sampling_clip_min,
        args.vllm_importance_sampling_clip_max,
    )
    metrics.add_tensor(M.OFF_POLICY_IS_WEIGHT_MEAN, correction.weights.double(), mask)
    metrics.add_tensor(M.OFF_POLICY_TRUNCATED_FRAC, correction.truncated.double(), mask)
    metrics.add_tensor(M.OFF_POLICY_MASKED_FRAC, correction.masked.double(), mask)
    return correction.weights
