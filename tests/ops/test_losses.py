import math
import statistics

import pytest
import torch
from torch.testing import assert_close

from rlhfkit import ops


def random_rollout(B=4, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -2.0 * torch.rand(B, T, generator=g, dtype=torch.float64)
    new = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)  # ratios roughly in [0.5, 2]
    advantages = torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = 0
    mask = torch.arange(T) < lengths[:, None]
    return new, old, advantages, mask


# ---- clipped_policy_loss ----


def test_policy_loss_hand_computed():
    # four tokens with ratio r = exp(logp - old), cliprange 0.2, so clip(r) is in [0.8, 1.2]:
    #  A=+1, r=1.5: -A r = -1.5, -A clip = -1.2 -> max -1.2, clipped (no incentive to push r further up)
    #  A=-1, r=1.5: 1.5 vs 1.2 -> 1.5, not clipped (still penalised for having moved the wrong way)
    #  A=+1, r=0.5: -0.5 vs -0.8 -> -0.5, not clipped
    #  A=-1, r=0.5: 0.5 vs 0.8 -> 0.8, clipped
    ratio = torch.tensor([[1.5, 1.5, 0.5, 0.5, 9.0]], dtype=torch.float64)
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, False]])
    out = ops.clipped_policy_loss(ratio.log(), torch.zeros_like(ratio), advantages, mask, cliprange=0.2)
    assert_close(out.per_token_loss, torch.tensor([[-1.2, 1.5, -0.5, 0.8, 0.0]], dtype=torch.float64))
    # mean over the 4 real tokens: (-1.2 + 1.5 - 0.5 + 0.8) / 4 = 0.15
    assert_close(out.loss, torch.tensor(0.15, dtype=torch.float64))
    assert out.clipped.tolist() == [[True, False, False, True, False]]
    assert_close(out.ratio, torch.tensor([[1.5, 1.5, 0.5, 0.5, 0.0]], dtype=torch.float64))
    # approx_kl = 0.5 (ln r)^2
    ln15, ln05 = math.log(1.5), math.log(0.5)
    assert_close(out.approx_kl, 0.5 * torch.tensor([[ln15**2, ln15**2, ln05**2, ln05**2, 0.0]], dtype=torch.float64))


def reference_policy_loss(new, old, advantages, mask, c):
    """Float64 loop over real tokens."""
    losses, clipped = [], []
    for b in range(new.shape[0]):
        for t in range(new.shape[1]):
            if mask[b, t]:
                r, a = math.exp(new[b, t].item() - old[b, t].item()), advantages[b, t].item()
                pg1, pg2 = -a * r, -a * min(max(r, 1 - c), 1 + c)
                losses.append(max(pg1, pg2))
                clipped.append(pg2 > pg1)
    return statistics.fmean(losses), statistics.fmean(clipped)


@pytest.mark.parametrize("seed", range(3))
def test_policy_loss_matches_reference_loop(seed):
    new, old, advantages, mask = random_rollout(seed=seed)
    out = ops.clipped_policy_loss(new, old, advantages, mask, cliprange=0.2)
    ref_loss, ref_clipfrac = reference_policy_loss(new, old, advantages, mask, 0.2)
    assert_close(out.loss, torch.tensor(ref_loss, dtype=torch.float64))
    assert_close(ops.masked_mean(out.clipped.double(), mask), torch.tensor(ref_clipfrac, dtype=torch.float64))
    assert 0 < ref_clipfrac < 1  # the case exercises both branches


def test_policy_loss_at_ratio_one_is_minus_mean_advantage():
    # the first minibatch of the first epoch: new == old, so ratio 1, nothing clipped, no KL
    _, old, advantages, mask = random_rollout(seed=3)
    out = ops.clipped_policy_loss(old.clone(), old, advantages, mask, cliprange=0.2)
    assert_close(out.loss, -ops.masked_mean(advantages, mask))
    assert torch.equal(out.ratio, mask.double())
    assert not out.clipped.any()
    assert torch.equal(out.approx_kl, torch.zeros_like(old))


def test_policy_gradient_is_zero_exactly_on_clipped_tokens():
    new, old, advantages, mask = random_rollout(seed=4)
    new.requires_grad_(True)
    out = ops.clipped_policy_loss(new, old, advantages, mask, cliprange=0.2)
    out.loss.backward()
    # d/d logp of -A r / n is -A r / n where unclipped; clipped and padded tokens get nothing
    ratio = (new - old).exp().detach()
    expected = torch.where(mask & ~out.clipped, -advantages * ratio / mask.sum(), 0.0)
    assert_close(new.grad, expected)


def test_policy_loss_micro_batch_split_pools_to_full_batch():
    new, old, advantages, mask = random_rollout(B=6, seed=5)
    full = ops.clipped_policy_loss(new, old, advantages, mask, cliprange=0.2)
    total, count = 0.0, 0
    for rows in ([0, 1], [2, 3, 4], [5]):
        part = ops.clipped_policy_loss(new[rows], old[rows], advantages[rows], mask[rows], cliprange=0.2)
        total += ops.masked_sum(part.per_token_loss, mask[rows])
        count += mask[rows].sum()
    assert_close(total / count, full.loss)


def test_policy_loss_ignores_garbage_padding_in_value_and_gradient():
    new, old, advantages, mask = random_rollout(seed=6)
    clean = ops.clipped_policy_loss(new, old, advantages, mask, 0.2)
    poisoned_new = new.masked_fill(~mask, 1e4).requires_grad_(True)  # exp(1e4) overflows
    out = ops.clipped_policy_loss(poisoned_new, old, advantages.masked_fill(~mask, math.nan), mask, 0.2)
    out.loss.backward()
    assert_close(out.loss, clean.loss)
    assert torch.isfinite(poisoned_new.grad).all()
    assert torch.equal(poisoned_new.grad[~mask], torch.zeros(int((~mask).sum()), dtype=torch.float64))


# ---- clipped_value_loss ----


def test_value_loss_hand_computed():
    # cliprange_value 0.2, old value 0 for all tokens, so clip(v) is in [-0.2, 0.2]
    #  v=1, R=0: (1-0)^2 = 1 vs (0.2-0)^2 = 0.04 -> 1 -> 0.5 * 1 = 0.5, not clipped
    #  v=1, R=2: (1-2)^2 = 1 vs (0.2-2)^2 = 3.24 -> 3.24 -> 1.62, clipped (moved too far to get credit)
    #  v=0.1, R=2: inside the clip range: both 1.9^2 = 3.61 -> 1.805, not clipped (equal, not larger)
    values = torch.tensor([[1.0, 1.0, 0.1, 50.0]], dtype=torch.float64)
    returns = torch.tensor([[0.0, 2.0, 2.0, -50.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    out = ops.clipped_value_loss(values, torch.zeros_like(values), returns, mask, cliprange_value=0.2)
    assert_close(out.per_token_loss, torch.tensor([[0.5, 1.62, 1.805, 0.0]], dtype=torch.float64))
    # (0.5 + 1.62 + 1.805) / 3 = 3.925 / 3
    assert_close(out.loss, torch.tensor(3.925 / 3, dtype=torch.float64))
    assert out.clipped.tolist() == [[False, True, False, False]]


def test_value_loss_matches_reference_loop():
    g = torch.Generator().manual_seed(7)
    values, old_values, returns = torch.randn(3, 4, 6, generator=g, dtype=torch.float64)
    mask = torch.arange(6) < torch.tensor([0, 3, 6, 5])[:, None]
    losses, clipped = [], []
    for b in range(4):
        for t in range(6):
            if mask[b, t]:
                v, o, r = values[b, t].item(), old_values[b, t].item(), returns[b, t].item()
                v_clipped = min(max(v, o - 0.3), o + 0.3)
                losses.append(0.5 * max((v - r) ** 2, (v_clipped - r) ** 2))
                clipped.append((v_clipped - r) ** 2 > (v - r) ** 2)
    out = ops.clipped_value_loss(values, old_values, returns, mask, cliprange_value=0.3)
    assert_close(out.loss, torch.tensor(statistics.fmean(losses), dtype=torch.float64))
    assert out.clipped[mask].tolist() == clipped
    assert any(clipped) and not all(clipped)


def test_value_loss_without_movement_is_half_squared_error():
    # values == old_values (first minibatch): clipping cannot bind
    g = torch.Generator().manual_seed(8)
    values, returns = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    mask = torch.arange(5) < torch.tensor([2, 5, 4])[:, None]
    out = ops.clipped_value_loss(values, values.clone(), returns, mask, cliprange_value=0.2)
    assert_close(out.loss, 0.5 * ops.masked_mean((values - returns) ** 2, mask))
    assert not out.clipped.any()


# ---- explained_variance ----


def test_explained_variance_hand_computed():
    returns = torch.tensor([[1.0, 2.0, 3.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    # Var[R] over 1, 2, 3 = 1 (n - 1). values 1, 2, 4: errors 0, 0, -1, mean -1/3,
    # squared deviations 1/9 + 1/9 + 4/9 = 6/9, / 2 = 1/3 -> EV = 1 - 1/3 = 2/3
    values = torch.tensor([[1.0, 2.0, 4.0, -7.0]], dtype=torch.float64)
    assert_close(ops.explained_variance(values, returns, mask), torch.tensor(2.0 / 3.0, dtype=torch.float64))
    # a perfect value function explains everything; predicting the mean (2) explains nothing
    assert_close(ops.explained_variance(returns, returns, mask), torch.tensor(1.0, dtype=torch.float64))
    assert_close(ops.explained_variance(torch.full_like(returns, 2.0), returns, mask), torch.tensor(0.0).double())


def test_explained_variance_matches_reference():
    g = torch.Generator().manual_seed(9)
    values, returns = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    mask = torch.arange(8) < torch.tensor([8, 0, 3, 5, 7])[:, None]
    r = returns[mask].tolist()
    err = (returns - values)[mask].tolist()
    expected = 1 - statistics.variance(err) / statistics.variance(r)
    assert_close(ops.explained_variance(values, returns, mask), torch.tensor(expected, dtype=torch.float64))


def test_explained_variance_without_return_variance_is_zero():
    values = torch.randn(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert ops.explained_variance(values, torch.full((2, 3), 0.1), mask).item() == 0.0
    assert ops.explained_variance(values, torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.bool)).item() == 0.0


# ---- GRPO: per-token loss and loss aggregation ----


def reference_grpo_token_loss(logp, old, adv, eps_low, eps_high, ref=None, beta=0.0):
    """Scalar float64 loop: -min(r A, clip(r) A) + beta * k3, one token at a time."""
    r = math.exp(logp - old)
    loss = -min(r * adv, min(max(r, 1 - eps_low), 1 + eps_high) * adv)
    if beta:
        d = ref - logp
        loss += beta * (math.exp(d) - d - 1)
    return loss


def test_grpo_per_token_loss_matches_scalar_reference():
    torch.manual_seed(0)
    B, T = 4, 5
    logp = -torch.rand(B, T, dtype=torch.float64) * 3
    old = logp + 0.4 * torch.randn(B, T, dtype=torch.float64)  # ratios well outside [0.8, 1.28]
    old[0, :2] = logp[0, :2] - 0.5  # ratio e^0.5 = 1.65 with A > 0: clipped at the upper bound
    ref = logp + 0.3 * torch.randn(B, T, dtype=torch.float64)
    adv = torch.tensor([1.5, -0.7, 0.0, -2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    out = ops.grpo_per_token_loss(logp, old, adv, mask, 0.2, 0.28, ref_logprobs=ref, beta=0.04)
    for b in range(B):
        for t in range(T):
            if not mask[b, t]:
                assert out.per_token_loss[b, t] == 0 and not out.low_clipped[b, t] and not out.high_clipped[b, t]
                continue
            args = (logp[b, t].item(), old[b, t].item(), adv[b].item(), 0.2, 0.28, ref[b, t].item(), 0.04)
            assert out.per_token_loss[b, t].item() == pytest.approx(reference_grpo_token_loss(*args), rel=1e-12)
            r = math.exp(logp[b, t] - old[b, t])
            assert bool(out.low_clipped[b, t]) == (r < 0.8 and adv[b] < 0)
            assert bool(out.high_clipped[b, t]) == (r > 1.28 and adv[b] > 0)
    assert out.low_clipped.any() and out.high_clipped.any()  # the case exercises both bounds


def test_grpo_loss_without_old_policy_has_ratio_one_and_no_clipping():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    out = ops.grpo_per_token_loss(logp, logp.detach(), torch.tensor([1.0, -1.0]), mask, 0.2, 0.2)
    assert torch.equal(out.ratio, torch.ones(2, 2)) and not out.low_clipped.any() and not out.high_clipped.any()
    # Value -A per token, gradient -A per token (d/dlogp of -r A at r = 1).
    assert torch.equal(out.per_token_loss, torch.tensor([[-1.0, -1.0], [1.0, 1.0]]))
    out.per_token_loss.sum().backward()
    assert torch.equal(logp.grad, torch.tensor([[-1.0, -1.0], [1.0, 1.0]]))


def test_loss_aggregation_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    # grpo: mean of per-sequence means = ((1 + 2 + 3) / 3 + 4 / 1) / 2 = 3
    assert ops.aggregate_token_loss(loss, mask, "grpo").item() == 3.0
    # bnpo: token mean = (1 + 2 + 3 + 4) / 4 = 2.5
    assert ops.aggregate_token_loss(loss, mask, "bnpo").item() == 2.5
    # dr_grpo: sum / (B * max_completion_length) = 10 / (2 * 5) = 1
    assert ops.aggregate_token_loss(loss, mask, "dr_grpo", max_completion_length=5).item() == 1.0
    # dapo: sum / tokens of the whole step (here 8: this micro-batch holds 4 of them) = 10 / 8
    assert ops.aggregate_token_loss(loss, mask, "dapo", num_items=8).item() == 1.25
    with pytest.raises(ValueError, match="loss_type"):
        ops.aggregate_token_loss(loss, mask, "ppo")


def test_dapo_over_micro_batches_equals_bnpo_over_the_whole_step():
    torch.manual_seed(1)
    loss = torch.randn(6, 7, dtype=torch.float64)
    mask = torch.rand(6, 7) > 0.4
    whole = ops.aggregate_token_loss(loss, mask, "bnpo")
    parts = sum(
        ops.aggregate_token_loss(loss[i : i + 2], mask[i : i + 2], "dapo", num_items=mask.sum()) for i in (0, 2, 4)
    )
    assert_close(parts, whole)
