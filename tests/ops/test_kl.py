import math

import pytest
import torch
from torch.testing import assert_close

from rlhfkit import ops

# ---- kl_per_token ----


def test_estimators_hand_computed():
    # logp = ln 0.5, ref = ln 0.25: logp - ref = ln 2
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    ln2 = math.log(2.0)
    assert_close(ops.kl_per_token(logp, ref, "k1"), torch.tensor([[ln2]], dtype=torch.float64))
    assert_close(ops.kl_per_token(logp, ref, "k2"), torch.tensor([[0.5 * ln2**2]], dtype=torch.float64))
    # k3: d = ref - logp = -ln 2; exp(-ln 2) - 1 - (-ln 2) = 0.5 - 1 + ln 2
    assert_close(ops.kl_per_token(logp, ref, "k3"), torch.tensor([[ln2 - 0.5]], dtype=torch.float64))


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_estimators_match_python_formulas(estimator):
    g = torch.Generator().manual_seed(0)
    logp, ref = -3 * torch.rand(2, 2, 5, generator=g, dtype=torch.float64)
    formulas = {
        "k1": lambda a, r: a - r,
        "k2": lambda a, r: 0.5 * (a - r) ** 2,
        "k3": lambda a, r: math.exp(r - a) - 1 - (r - a),
    }
    expected = torch.tensor(
        [[formulas[estimator](logp[b, t].item(), ref[b, t].item()) for t in range(5)] for b in range(2)],
        dtype=torch.float64,
    )
    assert_close(ops.kl_per_token(logp, ref, estimator), expected)


def test_k1_and_k3_are_unbiased_for_kl_policy_to_reference():
    # Tokens sampled from the policy p: E_p[k1] = E_p[k3] = KL(p || q). Getting the sign of d wrong in k3
    # would estimate a different quantity (E_p[q/p - 1 - log q/p] with p, q swapped is not KL(p||q)).
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    exact_kl = (p * (p / q).log()).sum()
    tokens = torch.multinomial(p, 200_000, replacement=True, generator=g)
    logp, ref = p.log()[tokens].unsqueeze(0), q.log()[tokens].unsqueeze(0)
    for estimator in ("k1", "k3"):
        samples = ops.kl_per_token(logp, ref, estimator)
        standard_error = samples.std() / math.sqrt(samples.numel())
        # a Monte Carlo estimate: allow 5 standard errors (fails by chance with probability ~6e-7)
        assert abs(samples.mean() - exact_kl) < 5 * standard_error, estimator


def test_unknown_estimator_raises():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="k4"):
        ops.kl_per_token(x, x, "k4")


# ---- AdaptiveKLController ----


def test_adaptive_controller_hand_computed():
    ctl = ops.AdaptiveKLController(init_kl_coef=0.1, target=6.0, horizon=10_000)
    # KL 12: err = clip(12/6 - 1, +-0.2) = 0.2; mult = 1 + 0.2 * 512 / 10000 = 1.01024
    assert ctl.update(12.0, n_steps=512) == pytest.approx(0.1 * 1.01024, rel=1e-12)
    # KL 6.6: err = 0.1; mult = 1 + 0.1 * 512 / 10000 = 1.00512
    assert ctl.update(torch.tensor(6.6, dtype=torch.float64), n_steps=512) == pytest.approx(
        0.1 * 1.01024 * 1.00512, rel=1e-12
    )
    # KL 0: err = clip(-1) = -0.2; mult = 1 - 0.2 * 64 / 10000 = 0.99872
    assert ctl.update(0.0, n_steps=64) == pytest.approx(0.1 * 1.01024 * 1.00512 * 0.99872, rel=1e-12)
    assert ctl.value == pytest.approx(0.1 * 1.01024 * 1.00512 * 0.99872, rel=1e-12)


def test_adaptive_controller_on_target_is_constant_and_state_round_trips():
    ctl = ops.AdaptiveKLController(0.05, target=3.0, horizon=100)
    assert ctl.update(3.0, n_steps=50) == 0.05
    ctl.update(100.0, n_steps=50)  # err 0.2: 0.05 * 1.1
    resumed = ops.AdaptiveKLController(0.05, target=3.0, horizon=100)
    resumed.load_state_dict(ctl.state_dict())
    assert resumed.value == ctl.value == pytest.approx(0.055)
    assert resumed.update(1.0, 10) == ctl.update(1.0, 10)


def test_adaptive_controller_rejects_bad_input():
    with pytest.raises(ValueError):
        ops.AdaptiveKLController(0.1, target=0.0, horizon=10)
    ctl = ops.AdaptiveKLController(0.1, target=1.0, horizon=10)
    with pytest.raises(ValueError, match="finite"):
        ctl.update(float("nan"), 1)
    assert ctl.value == 0.1


# ---- kl_penalized_rewards ----


def reference_penalized_rewards(scores, kl, mask, kl_coef):
    """Loop version: -kl_coef * kl on real tokens, plus the score on the last real token."""
    B, T = kl.shape
    non_score = torch.zeros(B, T, dtype=torch.float64)
    rewards = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        last = None
        for t in range(T):
            if mask[b, t]:
                non_score[b, t] = -kl_coef * kl[b, t].item()
                last = t
        rewards[b] = non_score[b]
        if last is not None:
            rewards[b, last] += scores[b].item()
    return rewards, non_score


def test_penalized_rewards_hand_computed():
    scores = torch.tensor([2.0, -1.0, 5.0])
    kl = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.5, 9.0, 9.0, 9.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, True, False], [True, False, False, False], [False] * 4])
    out = ops.kl_penalized_rewards(scores, kl, mask, kl_coef=0.5)
    # row 0: -0.5 * [0.1, 0.2, 0.3] = [-0.05, -0.1, -0.15], score 2 on t=2 (the EOS), nothing on the pad
    # row 1: -0.5 * 0.5 = -0.25, score -1 on t=0
    # row 2: empty response, no token to carry the score
    assert_close(out.non_score_reward, torch.tensor([[-0.05, -0.1, -0.15, 0], [-0.25, 0, 0, 0], [0, 0, 0, 0.0]]))
    assert_close(out.rewards, torch.tensor([[-0.05, -0.1, 1.85, 0], [-1.25, 0, 0, 0], [0, 0, 0, 0.0]]))


def test_penalized_rewards_match_reference_loop():
    g = torch.Generator().manual_seed(2)
    B, T = 6, 5
    scores, kl = torch.randn(B, generator=g, dtype=torch.float64), torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.arange(T) < torch.tensor([0, 1, 3, 5, 2, 4])[:, None]
    out = ops.kl_penalized_rewards(scores, kl.masked_fill(~mask, math.inf), mask, kl_coef=0.2)
    ref_rewards, ref_non_score = reference_penalized_rewards(scores, kl, mask, 0.2)
    assert_close(out.rewards, ref_rewards)
    assert_close(out.non_score_reward, ref_non_score)
    # invariance: each non-empty response's rewards sum to score - kl_coef * sum of its kl
    non_empty = mask.any(-1)
    assert_close(out.rewards.sum(-1)[non_empty], (scores - 0.2 * ops.masked_sum(kl, mask, dim=-1))[non_empty])
