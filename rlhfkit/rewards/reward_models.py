"""Reward models scored as reward functions: a sequence-classification model's score at the last real token."""

from __future__ import annotations

import torch
from torch import nn

from rlhfkit import ops
from rlhfkit.data import is_conversational
from rlhfkit.errors import RewardFunctionError
from rlhfkit.models import token_values
from rlhfkit.sampling import embeddable_ids


@torch.inference_mode()
def reward_model_scores(
    reward_model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Reward-model score (B,) read at the last real token of each sequence.

    input_ids, attention_mask: (B, L); attention_mask bool, True = real token. With a left-padded query and a
    right-padded completion, the last real token is the completion's terminator (or its last token if truncated).
    """
    input_ids = embeddable_ids(reward_model, input_ids, attention_mask)  # a [PAD] beyond its embeddings (TRL's ppo.py)
    return ops.last_true_value(token_values(reward_model, input_ids, attention_mask), attention_mask)


class RewardModelFunction:
    """A sequence-classification reward model used as a reward function (score at the last real token).

    When the reward model's tokenizer is the policy's (same vocabulary), the policy's own token ids are scored,
    EOS included, exactly as the reward model saw sequences in training. Otherwise prompt + completion text is
    re-tokenised with the reward model's tokenizer (TRL's behaviour), so any reward model works with any policy.
    Conversations (prompt messages plus the assistant's completion) are rendered with the reward model's own chat
    template, as TRL does: the template the reward model was trained with. policy_tokens: the model reads the
    policy's tokenizer (PPO's reward_model_path, TRL's PPO): it scores the policy's ids always, conversations too.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        name: str,
        same_vocab: bool,
        batch_size: int = 64,
        policy_tokens: bool = False,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.__name__ = name
        self.same_vocab = same_vocab
        self.batch_size = batch_size
        self.policy_tokens = policy_tokens  # always score the policy's ids, conversations too (PPO's reward model)

    @torch.inference_mode()
    def __call__(self, prompts: list, completions: list, sequence_ids=None, **kwargs) -> list[float]:
        device = next(self.model.parameters()).device
        own_tokens = self.policy_tokens or self.same_vocab and not is_conversational(prompts[0])
        if own_tokens and sequence_ids is not None:
            ids, mask = sequence_ids
        else:
            enc = self.tokenizer(
                self._texts(prompts, completions), padding=True, return_tensors="pt", add_special_tokens=False
            )
            ids, mask = enc["input_ids"], enc["attention_mask"].bool()
        scores = [
            reward_model_scores(
                self.model, ids[i : i + self.batch_size].to(device), mask[i : i + self.batch_size].to(device)
            )
            for i in range(0, len(ids), self.batch_size)
        ]
        return torch.cat(scores).double().cpu().tolist()

    def _texts(self, prompts: list, completions: list) -> list[str]:
        if not is_conversational(prompts[0]):
            return [p + c for p, c in zip(prompts, completions, strict=True)]
        if not getattr(self.tokenizer, "chat_template", None):
            raise RewardFunctionError(
                f"reward model {self.__name__!r} scores conversations, but its tokenizer has no chat template to "
                "render them: use a reward model with one (set tokenizer.chat_template), or text prompts."
            )
        return [self.tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
