"""GRPO's loss settings, bound once from the config, so that a micro-step passes its batch's tensors only
(ops.grpo_per_token_loss holds the math)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlhfkit import ops
from rlhfkit.config import GRPOConfig
from rlhfkit.ops.losses import GRPOLossOutput


@dataclass(frozen=True)
class GRPOLoss:
    """The per-token loss of GRPO and its variants with the run's settings (TRL 1.16's field names; epsilon_high
    defaults to epsilon in the config)."""

    epsilon: float
    epsilon_high: float
    beta: float
    loss_type: str
    importance_sampling_level: str
    delta: float | None
    use_bias_correction_kl: bool
    sapo_temperature_pos: float
    sapo_temperature_neg: float
    vespo_k_pos: float
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float

    @classmethod
    def from_config(cls, args: GRPOConfig) -> GRPOLoss:
        return cls(**{name: getattr(args, name) for name in cls.__dataclass_fields__})

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        ref_logprobs: Tensor | None,
        token_mask: Tensor | None = None,
    ) -> GRPOLossOutput:
        """ops.grpo_per_token_loss of one micro-batch: (B, T) log-probs with grad, logp_old, (B,) advantages, the
        (B, T) loss mask, the reference's log-probs (None when beta is 0) and the tokens the policy term trains on."""
        return ops.grpo_per_token_loss(
            logprobs, old_logprobs, advantages, mask, self.epsilon, self.epsilon_high, ref_logprobs, self.beta,
            loss_type=self.loss_type, importance_sampling_level=self.importance_sampling_level, delta=self.delta,
            use_bias_correction_kl=self.use_bias_correction_kl, token_mask=token_mask,
            sapo_temperature_pos=self.sapo_temperature_pos, sapo_temperature_neg=self.sapo_temperature_neg,
            vespo_k_pos=self.vespo_k_pos, vespo_lambda_pos=self.vespo_lambda_pos, vespo_k_neg=self.vespo_k_neg,
            vespo_lambda_neg=self.vespo_lambda_neg,
        )  # fmt: skip
