"""The policy and the value model PPO trains, behind one forward."""

from __future__ import annotations

import torch
from torch import nn

from rlhfkit.models import TokenStats, completion_token_stats, no_split_modules, token_values


class PolicyAndValue(nn.Module):
    """Policy and value model behind one forward, so one DDP wrapper synchronises both gradients (and one DeepSpeed
    or FSDP engine shards both: its layers are the two models' transformer layers)."""

    def __init__(self, policy: nn.Module, value_model: nn.Module, padding_free: bool = False):
        super().__init__()
        self.padding_free = padding_free  # the policy's forward packs the batch (the value model's stays padded)
        self.policy = policy
        self.value_model = value_model
        self._no_split_modules = no_split_modules(policy) + no_split_modules(value_model)
        self.config = policy.config  # what DeepSpeed's "auto" bucket sizes read (hidden_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_width: int,
        completion_ids: torch.Tensor,
        temperature: float,
        entropy: bool = False,
    ) -> tuple[TokenStats, torch.Tensor]:
        """The completion tokens' (B, T) log-probs (and detached entropies, when asked) at `temperature`, and (B, L)
        values at every position."""
        stats = completion_token_stats(
            self.policy, input_ids, attention_mask, prompt_width, completion_ids, temperature, entropy,
            padding_free=self.padding_free,
        )  # fmt: skip
        return stats, token_values(self.value_model, input_ids, attention_mask)
