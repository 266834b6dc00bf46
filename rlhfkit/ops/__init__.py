"""Pure tensor math for RLHF: masked statistics, log-probs, KL, advantages, losses, entropy regularisation,
sequence helpers.

Every function takes tensors and scalars (no config objects), imports only torch, and does no I/O.
Shapes: B sequences, T completion tokens, V vocabulary, G group size. Masks are bool, True = counts.
"""

from rlhfkit.ops.advantages import GAEOutput, decoupled_group_advantages, gae, group_advantages
from rlhfkit.ops.dynamic_sampling import GroupSelection, select_groups, zero_std_groups
from rlhfkit.ops.entropy import (
    adaptive_entropy_coef,
    applied_entropy_coef,
    entropy_bonus,
    entropy_token_mask,
    entropy_window_sums,
    window_entropy,
)
from rlhfkit.ops.importance import (
    IS_CORRECTION_MODES,
    OffPolicyCorrection,
    off_policy_correction,
    off_policy_sequence_mask,
)
from rlhfkit.ops.kl import AdaptiveKLController, PenalizedRewards, kl_penalized_rewards, kl_per_token
from rlhfkit.ops.logprobs import entropy_from_logits, logprobs_from_hidden, logprobs_from_linear, logprobs_from_logits
from rlhfkit.ops.losses import (
    GRPOLossOutput,
    PolicyLossOutput,
    ValueLossOutput,
    aggregate_token_loss,
    clipped_policy_loss,
    clipped_value_loss,
    explained_variance,
    grpo_per_token_loss,
    high_entropy_mask,
    vespo_gamma_weights,
)
from rlhfkit.ops.masked import masked_mean, masked_sum, masked_var, masked_whiten
from rlhfkit.ops.sequences import (
    apply_eos_trick,
    first_true_index,
    last_true_index,
    last_true_value,
    mask_from_lengths,
    truncate_after_stop_token,
)

__all__ = [
    "apply_eos_trick",
    "AdaptiveKLController",
    "IS_CORRECTION_MODES",
    "GRPOLossOutput",
    "GAEOutput",
    "GroupSelection",
    "OffPolicyCorrection",
    "PenalizedRewards",
    "PolicyLossOutput",
    "ValueLossOutput",
    "adaptive_entropy_coef",
    "aggregate_token_loss",
    "applied_entropy_coef",
    "clipped_policy_loss",
    "clipped_value_loss",
    "decoupled_group_advantages",
    "entropy_bonus",
    "entropy_from_logits",
    "entropy_token_mask",
    "entropy_window_sums",
    "explained_variance",
    "first_true_index",
    "gae",
    "grpo_per_token_loss",
    "group_advantages",
    "high_entropy_mask",
    "kl_penalized_rewards",
    "kl_per_token",
    "last_true_index",
    "last_true_value",
    "logprobs_from_hidden",
    "logprobs_from_linear",
    "logprobs_from_logits",
    "mask_from_lengths",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "off_policy_correction",
    "off_policy_sequence_mask",
    "select_groups",
    "truncate_after_stop_token",
    "vespo_gamma_weights",
    "window_entropy",
    "zero_std_groups",
]
