"""KL estimators, the adaptive KL coefficient, and the KL-penalised per-token rewards of RLHF PPO."""

import math
from typing import NamedTuple

import torch
from torch import Tensor

from rlhfkit.ops.sequences import last_true_index

KL_ESTIMATORS = ("k1", "k2", "k3")  # kl_per_token; PPOConfig.kl_estimator accepts a subset (as TRL)


def kl_per_token(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(policy || reference) from the log-probs of tokens sampled from the policy.

    logprobs, ref_logprobs: (B, T) float, log pi(y_t) and log pi_ref(y_t) of the same sampled tokens.
    estimator (Schulman, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html), with
    d = ref_logprobs - logprobs:
      "k1": -d                  unbiased, high variance, can be negative per token;
      "k2": d^2 / 2             biased, low variance, >= 0;
      "k3": exp(d) - 1 - d      unbiased, low variance, >= 0.
    Returns (B, T); positions outside the completion are not masked here (callers mask).
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        d = -log_ratio
        # expm1 keeps k3 ~ d^2/2 accurate for small d, where exp(d) - 1 would round away the answer.
        return torch.expm1(d) - d
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")


class AdaptiveKLController:
    """KL coefficient that steers the observed KL towards a target (Ziegler et al. 2019, section 2.2; the
    `AdaptiveKLController` of lm-human-preferences' train_policy.py).

    After each update: err = clip(current_kl / target - 1, -0.2, 0.2); value *= 1 + err * n_steps / horizon.
    The clip bounds how fast the coefficient moves, so one noisy KL measurement cannot swing it.
    init_kl_coef: starting coefficient. target: desired KL (nats per sequence, like `objective/kl`).
    horizon: number of episodes over which a constant error changes the coefficient by about e^err.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        if not target > 0 or not horizon > 0:
            raise ValueError(f"target and horizon must be > 0, got target={target}, horizon={horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        """Adjust `value` after an update that measured `current_kl` over `n_steps` episodes; returns the new value.

        A non-finite KL raises ValueError: silently folding a NaN into the coefficient would corrupt every
        later update.
        """
        current_kl = float(current_kl)
        if not math.isfinite(current_kl):
            raise ValueError(f"current_kl must be finite, got {current_kl}")
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict[str, float]:
        """The coefficient only: target and horizon come from the config, so a resumed run may change them."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class PenalizedRewards(NamedTuple):
    """Per-token rewards of RLHF PPO. Both (B, T), 0 outside the mask."""

    rewards: Tensor  # non_score_reward, plus the score at the last real token of each completion
    non_score_reward: Tensor  # -kl_coef * kl


def kl_penalized_rewards(scores: Tensor, kl: Tensor, mask: Tensor, kl_coef: float) -> PenalizedRewards:
    """Dense KL penalty at every completion token plus the sequence score at the last real token.

    scores: (B,) float, reward-model score per completion. kl: (B, T) float, per-token KL estimate vs the
    reference. mask: (B, T) bool, True = real completion token (a prefix of each row; the EOS counts).
    kl_coef: KL coefficient (beta).
    The score goes on the last real token (the EOS, or the last token of a truncated completion): that is the
    action the score judges, and GAE then credits earlier tokens through the value function. TRL puts it on
    the first pad after the EOS instead (an off-by-one inherited from the original code, TRL issue #3750),
    which gives the score to a position whose action is never trained on.
    A row whose mask is all False (an empty completion) has no token to carry its score and gets none.
    """
    non_score_reward = torch.where(mask, -kl_coef * kl, 0.0)
    if mask.shape[-1] == 0:  # T == 0: no completion tokens anywhere
        return PenalizedRewards(rewards=non_score_reward.clone(), non_score_reward=non_score_reward)
    last = last_true_index(mask)
    has_token = last >= 0
    score_at_end = torch.where(has_token, scores.to(non_score_reward.dtype), 0.0)
    rewards = non_score_reward.scatter_add(-1, last.clamp(min=0).unsqueeze(-1), score_at_end.unsqueeze(-1))
    return PenalizedRewards(rewards=rewards, non_score_reward=non_score_reward)
