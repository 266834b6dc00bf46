import math
import statistics

import pytest
import torch
from torch.testing import assert_close

from rlhfkit import ops
from tests.ops.grpo import grpo_loss


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
    out = grpo_loss(logp, old, adv, mask, 0.2, 0.28, ref_logprobs=ref, beta=0.04)
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
    out = grpo_loss(logp, logp.detach(), torch.tensor([1.0, -1.0]), mask, 0.2, 0.2)
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


# ---- GRPO variants (TRL 1.16): loss types, GSPO, two-sided clipping, bias-corrected KL, token masks ----

CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
EPS_LOW, EPS_HIGH, CISPO_CAP, DELTA = 0.2, 0.28, 1.2, 1.5


def eps_high_for(loss_type):
    # cispo reads epsilon_high as the cap on r itself (ScaleRL's 5; 1.2 here so that it binds in the test)
    return CISPO_CAP if loss_type == "cispo" else EPS_HIGH


def grpo_variant_inputs(seed=0):
    """Float64 (B, T) = (6, 7), completion lengths 7, 3, 0, 5, 1, 6; padding holds inf/NaN garbage.

    Row log-ratio offsets put ratios well away from 1 at both the token and the sequence level: row 0 (A > 0,
    r ~ e^0.5) is high-clipped, row 1 (A < 0, r ~ e^-0.4) low-clipped, row 3 (A < 0, r ~ e^0.6 > delta) is
    capped by delta; row 2 is empty with a NaN advantage.
    """
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 7
    logp = -3 * torch.rand(B, T, generator=g, dtype=torch.float64) - 0.05
    offsets = torch.tensor([0.5, -0.4, 0.0, 0.6, -0.5, -0.3], dtype=torch.float64)
    old = logp - offsets[:, None] - 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.3, -0.8, math.nan, -1.7, 0.6, 0.9], dtype=torch.float64)
    mask = torch.arange(T) < torch.tensor([7, 3, 0, 5, 1, 6])[:, None]
    logp = logp.masked_fill(~mask, math.inf)  # exp(logp - old) and ref - logp would be inf/NaN
    old = old.masked_fill(~mask, -math.inf)
    ref = ref.masked_fill(~mask, math.nan)
    return logp, old, ref, adv, mask


def reference_grpo_variant(
    logp, old, adv, mask, eps_low, eps_high, *, loss_type, level="token", delta=None, ref=None, beta=0.0,
    bias_kl=False, token_mask=None, max_len=None, num_items=None, frozen_coef=None,
):  # fmt: skip
    """Scalar float64 loops over b, t of TRL 1.16's per-token loss and its aggregation, from the formulas.

    frozen_coef: per-token weights to use for cispo / vespo instead of computing them (the stop-gradient: a
    finite difference with the weights frozen is the gradient autograd must give).
    """
    logp, old, adv, mask = logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    ref = ref.tolist() if ref is not None else None
    token_mask = token_mask.tolist() if token_mask is not None else None
    B, T = len(mask), len(mask[0])
    out = {k: [[0.0] * T for _ in range(B)] for k in ("loss", "kl", "ratio", "coef")}
    out.update({k: [[False] * T for _ in range(B)] for k in ("low", "high", "cispo")})
    out["phi"] = [1.0] * B
    for b in range(B):
        tokens = [t for t in range(T) if mask[b][t]]
        a = adv[b]
        seq_log_ratio = sum(logp[b][t] - old[b][t] for t in tokens) / max(len(tokens), 1)
        if loss_type == "vespo":
            log_w = sum(min(max(logp[b][t] - old[b][t], -20.0), 20.0) for t in tokens)
            log_w = min(max(log_w, math.log(1e-8)), 20.0)
            k, lam = (2.0, 3.0) if a >= 0 else (3.0, 2.0)
            out["phi"][b] = math.exp(lam) * math.exp(log_w) ** k * math.exp(-lam * math.exp(log_w))
        for t in tokens:
            lp = logp[b][t]
            r = math.exp(lp - old[b][t] if level == "token" else seq_log_ratio)
            out["ratio"][b][t] = r
            if loss_type in CLIPPED:
                r_capped = r if delta is None else min(r, delta)
                policy = -min(r_capped * a, min(max(r, 1 - eps_low), 1 + eps_high) * a)
                out["low"][b][t] = r_capped < 1 - eps_low and a < 0
                out["high"][b][t] = r_capped > 1 + eps_high and a > 0
            elif loss_type == "sapo":
                tau = 1.0 if a > 0 else 1.05
                policy = -(4 / tau) / (1 + math.exp(-tau * (r - 1))) * a
            else:  # cispo, vespo: a constant weight times the REINFORCE term -A logp
                coef = min(r, eps_high) if loss_type == "cispo" else out["phi"][b]
                coef = frozen_coef[b][t] if frozen_coef is not None else coef
                out["coef"][b][t] = coef
                policy = -coef * a * lp
                out["cispo"][b][t] = loss_type == "cispo" and r > eps_high and a > 0
            if token_mask is not None:
                policy *= token_mask[b][t]
            kl = 0.0
            if beta:
                d = ref[b][t] - lp
                kl = math.exp(d) - d - 1
                if bias_kl:
                    kl *= r
            out["kl"][b][t] = kl
            out["loss"][b][t] = policy + beta * kl
    rows = [[out["loss"][b][t] for t in range(T) if mask[b][t]] for b in range(B)]
    total, n = sum(map(sum, rows)), sum(map(len, rows))
    if loss_type in ("grpo", "sapo"):
        out["aggregated"] = statistics.fmean(sum(row) / max(len(row), 1) for row in rows)
    elif loss_type == "bnpo":
        out["aggregated"] = total / max(n, 1)
    elif loss_type == "dr_grpo":
        out["aggregated"] = total / (B * max_len)
    elif loss_type in ("dapo", "cispo", "vespo"):
        out["aggregated"] = total / max(num_items, 1)
    else:  # luspo
        out["aggregated"] = statistics.fmean(sum(row) for row in rows)
    return out


def run_grpo_variant(logp, old, ref, adv, mask, loss_type, level, delta, beta, bias_kl, token_mask=None):
    out = grpo_loss(
        logp, old, adv, mask, EPS_LOW, eps_high_for(loss_type), ref, beta, loss_type=loss_type,
        importance_sampling_level=level, delta=delta, use_bias_correction_kl=bias_kl, token_mask=token_mask,
    )  # fmt: skip
    loss = ops.aggregate_token_loss(out.per_token_loss, mask, loss_type, max_completion_length=9, num_items=40)
    return out, loss


def as_f64(nested):
    return torch.tensor(nested, dtype=torch.float64)


def finite(*tensors):
    return all(bool(torch.isfinite(t).all()) for t in tensors)


GRPO_FIELDS = ("per_token_loss", "ratio", "low_clipped", "high_clipped", "kl", "cispo_clipped", "phi")


@pytest.mark.parametrize("beta, bias_kl", [(0.0, False), (0.04, False), (0.04, True)])
@pytest.mark.parametrize("delta", [None, DELTA])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ops.losses.LOSS_TYPES)
def test_grpo_variants_match_scalar_reference(loss_type, level, delta, beta, bias_kl):
    logp, old, ref, adv, mask = grpo_variant_inputs()
    out, loss = run_grpo_variant(logp, old, ref, adv, mask, loss_type, level, delta, beta, bias_kl)
    expected = reference_grpo_variant(
        logp, old, adv, mask, EPS_LOW, eps_high_for(loss_type), loss_type=loss_type, level=level, delta=delta,
        ref=ref, beta=beta, bias_kl=bias_kl, max_len=9, num_items=40,
    )  # fmt: skip
    tol = dict(rtol=1e-12, atol=1e-15)
    assert_close(out.per_token_loss, as_f64(expected["loss"]), **tol)
    assert_close(loss, torch.tensor(expected["aggregated"], dtype=torch.float64), **tol)
    assert_close(out.kl, as_f64(expected["kl"]), **tol)
    assert_close(out.ratio, as_f64(expected["ratio"]), **tol)
    assert_close(out.phi, as_f64(expected["phi"]), **tol)
    assert out.low_clipped.tolist() == expected["low"] and out.high_clipped.tolist() == expected["high"]
    assert out.cispo_clipped.tolist() == expected["cispo"]
    assert finite(out.per_token_loss, out.kl, out.ratio, out.phi, loss)
    # the case exercises what it claims to: both clip bounds, delta's cap, the cispo cap, the KL term
    if loss_type in CLIPPED:
        assert out.low_clipped.any() and out.high_clipped.any()
        if delta is not None:
            assert ((out.ratio > DELTA) & (adv[:, None] < 0) & mask).any()
    if loss_type == "cispo":
        assert out.cispo_clipped.any() and not out.cispo_clipped.all()
    if loss_type == "vespo":
        assert (out.phi[mask.any(-1)] < 0.9).any() and (out.phi > 1.1).any()
    assert (out.kl > 0).any() == (beta > 0)


def test_grpo_variant_outputs_for_other_loss_types():
    """Flags of the clipped surrogate stay False for cispo, sapo and vespo (TRL logs no clip ratio for them);
    cispo_clipped is cispo's only; phi is all ones except for vespo."""
    logp, old, ref, adv, mask = grpo_variant_inputs()
    for loss_type in ops.losses.LOSS_TYPES:
        out, _ = run_grpo_variant(logp, old, ref, adv, mask, loss_type, "token", None, 0.0, False)
        assert (out.low_clipped.any() or out.high_clipped.any()) == (loss_type in CLIPPED), loss_type
        assert out.cispo_clipped.any() == (loss_type == "cispo")
        assert torch.equal(out.phi, torch.ones(6, dtype=torch.float64)) == (loss_type != "vespo")
        assert out.per_token_loss.shape == out.kl.shape == out.cispo_clipped.shape == mask.shape


def test_clipped_loss_types_share_the_per_token_loss():
    """grpo, bnpo, dr_grpo, dapo and luspo differ only in aggregation, and the default loss_type is theirs."""
    logp, old, ref, adv, mask = grpo_variant_inputs()
    default = grpo_loss(logp, old, adv, mask, EPS_LOW, EPS_HIGH, ref, 0.04)
    for loss_type in CLIPPED:
        out, _ = run_grpo_variant(logp, old, ref, adv, mask, loss_type, "token", None, 0.04, False)
        for field in GRPO_FIELDS:
            assert torch.equal(getattr(out, field), getattr(default, field)), (loss_type, field)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ops.losses.LOSS_TYPES)
def test_token_mask_gates_the_policy_term_not_the_kl(loss_type, level):
    logp, old, ref, adv, mask = grpo_variant_inputs(seed=1)
    token_mask = torch.rand(mask.shape, generator=torch.Generator().manual_seed(2)) > 0.5
    out, loss = run_grpo_variant(logp, old, ref, adv, mask, loss_type, level, DELTA, 0.04, True, token_mask)
    expected = reference_grpo_variant(
        logp, old, adv, mask, EPS_LOW, eps_high_for(loss_type), loss_type=loss_type, level=level, delta=DELTA,
        ref=ref, beta=0.04, bias_kl=True, token_mask=token_mask.double(), max_len=9, num_items=40,
    )  # fmt: skip
    assert_close(out.per_token_loss, as_f64(expected["loss"]), rtol=1e-12, atol=1e-15)
    assert_close(loss, torch.tensor(expected["aggregated"], dtype=torch.float64), rtol=1e-12, atol=1e-15)
    # masked-off tokens keep exactly their KL term; a float mask (garbage outside the loss mask) does the same
    off = mask & ~token_mask
    assert off.any() and torch.equal(out.per_token_loss[off], 0.04 * out.kl[off])
    float_mask = token_mask.double().masked_fill(~mask, math.nan)
    out_f, _ = run_grpo_variant(logp, old, ref, adv, mask, loss_type, level, DELTA, 0.04, True, float_mask)
    assert torch.equal(out_f.per_token_loss, out.per_token_loss)
    # the flags still describe every token (TRL computes them on the ratios, before the entropy mask)
    unmasked, _ = run_grpo_variant(logp, old, ref, adv, mask, loss_type, level, DELTA, 0.04, True)
    assert torch.equal(out.low_clipped, unmasked.low_clipped) and torch.equal(out.kl, unmasked.kl)


def test_sequence_mask_broadcasts_as_token_mask():
    """A (B, 1) float mask (e.g. a per-completion keep/drop decision) multiplies every token of its row."""
    logp, old, ref, adv, mask = grpo_variant_inputs()
    keep = torch.tensor([[1.0], [0.0], [1.0], [0.0], [1.0], [1.0]], dtype=torch.float64)
    out, _ = run_grpo_variant(logp, old, ref, adv, mask, "dapo", "token", None, 0.0, False, keep)
    full, _ = run_grpo_variant(logp, old, ref, adv, mask, "dapo", "token", None, 0.0, False)
    assert torch.equal(out.per_token_loss, full.per_token_loss * keep)


def central_difference(f, x, mask, h=1e-6):
    """d f / d x[b, t] for the masked positions (float64), by (f(x + h) - f(x - h)) / 2h; 0 elsewhere."""
    grad = torch.zeros_like(x)
    for b, t in mask.nonzero().tolist():
        plus, minus = x.clone(), x.clone()
        plus[b, t] += h
        minus[b, t] -= h
        grad[b, t] = (f(plus) - f(minus)) / (2 * h)
    return grad


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ops.losses.LOSS_TYPES)
def test_grpo_variant_gradients_match_finite_differences(loss_type, level):
    """Autograd through the aggregated loss, two-sided clipping and the bias-corrected KL (whose ratio is not
    detached) against a central difference of the scalar reference. cispo's capped ratio and vespo's phi are
    detached: the reference holds them at their unperturbed values, which is what a stop-gradient means."""
    logp, old, ref, adv, mask = grpo_variant_inputs(seed=3)
    x = logp.clone().requires_grad_(True)
    out, loss = run_grpo_variant(x, old, ref, adv, mask, loss_type, level, DELTA, 0.04, True)
    loss.backward()
    kwargs = dict(
        loss_type=loss_type, level=level, delta=DELTA, ref=ref, beta=0.04, bias_kl=True, max_len=9, num_items=40
    )
    frozen = reference_grpo_variant(logp, old, adv, mask, EPS_LOW, eps_high_for(loss_type), **kwargs)["coef"]

    def f(lp):
        return reference_grpo_variant(
            lp, old, adv, mask, EPS_LOW, eps_high_for(loss_type), frozen_coef=frozen, **kwargs
        )["aggregated"]

    expected = central_difference(f, logp, mask)
    assert finite(x.grad) and torch.equal(x.grad[~mask], torch.zeros(int((~mask).sum()), dtype=torch.float64))
    assert_close(x.grad, expected, rtol=1e-6, atol=1e-9)
    assert (x.grad[mask] != 0).any()


def test_gradients_of_detached_weights_are_the_weighted_reinforce_gradient():
    """cispo: d/dlogp = -min(r, cap) A; vespo: -phi A (before aggregation); no gradient through the weight."""
    logp, old, ref, adv, mask = grpo_variant_inputs(seed=4)
    a = torch.where(mask, adv[:, None], 0.0)
    for loss_type in ("cispo", "vespo"):
        x = logp.clone().requires_grad_(True)
        out, _ = run_grpo_variant(x, old, ref, adv, mask, loss_type, "token", None, 0.0, False)
        out.per_token_loss.sum().backward()
        weight = out.ratio.clamp(max=CISPO_CAP) if loss_type == "cispo" else out.phi[:, None].expand_as(a)
        assert_close(x.grad, torch.where(mask, -weight * a, 0.0), rtol=1e-14, atol=0)


def test_sapo_gate_at_ratio_one_has_the_surrogate_gradient():
    # sigmoid(0) = 1/2, so the value is -(4 / tau) (1/2) A = -2 A / tau and the gradient (4 / tau) tau (1/4) r A
    # = A, the plain surrogate's, whatever the temperature
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    out = grpo_loss(logp, logp.detach(), adv, mask, 0.2, 0.2, loss_type="sapo")
    assert_close(out.per_token_loss, torch.tensor([[-2.0, -2.0], [2 / 1.05, 2 / 1.05]], dtype=torch.float64))
    out.per_token_loss.sum().backward()
    assert_close(logp.grad, torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=torch.float64))


def test_sequence_level_ratio_is_the_exp_of_the_mean_token_log_ratio():
    # GSPO: row 0 has token log-ratios 0.1 and 0.3 (and padding), so both tokens get r = exp(0.2)
    logp = torch.tensor([[0.1, 0.3, 50.0], [-0.2, -0.2, -0.2]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    out = grpo_loss(logp, torch.zeros_like(logp), adv, mask, 0.2, 0.28, importance_sampling_level="sequence")
    r0, r1 = math.exp(0.2), math.exp(-0.2)
    assert_close(out.ratio, torch.tensor([[r0, r0, 0.0], [r1, r1, r1]], dtype=torch.float64))
    # -min(r A, clip(r) A): row 0 unclipped (1.22 < 1.28) -> -r0; row 1 A < 0, r1 = 0.82 inside -> +r1
    assert_close(out.per_token_loss, torch.tensor([[-r0, -r0, 0.0], [r1, r1, r1]], dtype=torch.float64))
    # d/dlogp_t of the token sum of row 0 (2 tokens each -r0): 2 * (-r0) * (1/2) = -r0 on each token
    out.per_token_loss.sum().backward()
    assert_close(logp.grad, torch.tensor([[-r0, -r0, 0.0], [r1, r1, r1]], dtype=torch.float64))


def test_bias_corrected_kl_keeps_the_ratio_in_the_graph():
    """On-policy (r = 1) the corrected KL has the same value, but its gradient gains kl * dr/dlogp = kl (TRL 1.16
    does not detach the ratio)."""
    logp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv = torch.zeros(1, dtype=torch.float64)
    grads = {}
    for bias in (False, True):
        logp.grad = None
        out = grpo_loss(logp, logp.detach(), adv, mask, 0.2, 0.2, ref, 1.0, use_bias_correction_kl=bias)
        out.per_token_loss.sum().backward()
        grads[bias] = logp.grad.clone()
    d = ref - logp.detach()
    kl = torch.expm1(d) - d
    assert_close(out.kl, kl)
    assert_close(grads[False], 1 - torch.exp(d))  # d/dlogp of e^d - d - 1
    assert_close(grads[True], 1 - torch.exp(d) + kl)


def test_delta_caps_the_unclipped_ratio():
    # r = e^1 = 2.72 > delta = 2 with A = -1: -min(2 * -1, 1.28 * -1) = 2 instead of 2.72; gradient 0 there
    logp = torch.tensor([[1.0, 1.0, 0.1]], dtype=torch.float64, requires_grad=True)
    adv_neg, mask = torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool)
    out = grpo_loss(logp, torch.zeros_like(logp), adv_neg, mask, 0.2, 0.28, delta=2.0)
    assert_close(out.per_token_loss, torch.tensor([[2.0, 2.0, math.exp(0.1)]], dtype=torch.float64))
    assert_close(out.ratio, torch.tensor([[math.e, math.e, math.exp(0.1)]], dtype=torch.float64))
    out.per_token_loss.sum().backward()
    assert_close(logp.grad, torch.tensor([[0.0, 0.0, math.exp(0.1)]], dtype=torch.float64))
    assert not out.low_clipped.any() and not out.high_clipped.any()
    # TRL flags the capped ratio min(r, delta): with delta <= 1 + eps_high (GRPOConfig refuses it) a ratio above the
    # clip range with A > 0 is no longer flagged, though its gradient is 0 all the same
    adv_pos = torch.tensor([1.0], dtype=torch.float64)
    out = grpo_loss(logp, torch.zeros_like(logp), adv_pos, mask, 0.2, 0.28, delta=1.1)
    assert out.high_clipped.tolist() == [[False, False, False]]
    assert grpo_loss(logp, torch.zeros_like(logp), adv_pos, mask, 0.2, 0.28).high_clipped[0, 0]


def test_cispo_caps_the_weight_not_the_gradient():
    # ratios e^1 = 2.72 (capped at 1.2, flagged when A > 0) and e^0.1 = 1.105 (kept)
    logp = torch.tensor([[1.0, 0.1], [1.0, 0.1]], dtype=torch.float64)
    adv = torch.tensor([2.0, -2.0], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    out = grpo_loss(logp, torch.zeros_like(logp), adv, mask, 0.2, 1.2, loss_type="cispo")
    w = math.exp(0.1)
    assert_close(out.per_token_loss, torch.tensor([[-2.4, -2 * w * 0.1], [2.4, 2 * w * 0.1]], dtype=torch.float64))
    assert out.cispo_clipped.tolist() == [[True, False], [False, False]]
    # a ratio exactly at the cap is not clipped (strict >)
    out = grpo_loss(logp, logp, adv, mask, 0.2, 1.0, loss_type="cispo")
    assert torch.equal(out.ratio, torch.ones(2, 2, dtype=torch.float64)) and not out.cispo_clipped.any()


def test_vespo_gamma_weights_hand_computed():
    # row 0: token log-ratios ln 2, ln 2, -ln 2 sum to log w = ln 2; A = 0 counts as >= 0 (k = 2, lambda = 3):
    #        phi = e^3 2^2 e^(-3 * 2) = 4 e^-3
    # row 1: A < 0 (k = 3, lambda = 2), log w = ln 0.5: phi = e^2 (1/8) e^(-1) = e / 8
    # row 2: one token of log-ratio 50 is clamped to 20, the sum to 20: phi = e^(3 + 40 - 3 e^20) = 0
    # row 3: empty: w = 1, phi = 1 whatever the advantage
    ln2 = math.log(2)
    log_ratio = torch.tensor(
        [[ln2, ln2, -ln2], [-ln2, 7.0, 0.0], [50.0, 0.0, 0.0], [9.0, 9.0, 9.0]], dtype=torch.float64
    )
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([0.0, -1.0, 1.0, math.nan], dtype=torch.float64)
    phi = ops.vespo_gamma_weights(log_ratio.requires_grad_(True), adv, mask, 2.0, 3.0, 3.0, 2.0)
    assert_close(phi, torch.tensor([4 * math.exp(-3), math.e / 8, 0.0, 1.0], dtype=torch.float64))
    assert not phi.requires_grad
    # the weight peaks at w = k / lambda: 2/3 for A >= 0 and 3/2 for A < 0, with phi(1) = 1
    grid = torch.linspace(-1.5, 1.5, 301, dtype=torch.float64)[:, None]
    for a, peak in ((1.0, 2 / 3), (-1.0, 3 / 2)):
        phis = ops.vespo_gamma_weights(
            grid, torch.full((301,), a, dtype=torch.float64), torch.ones(301, 1).bool(), 2.0, 3.0, 3.0, 2.0
        )
        assert abs(grid[phis.argmax(), 0].exp().item() - peak) < 0.01
        assert_close(phis[150], torch.tensor(1.0, dtype=torch.float64))


def test_extreme_log_probs_stay_finite_in_float32():
    """Log-probs 20 nats apart (ratios e^40) in float32: every loss type, level and the corrected KL stay finite."""
    g = torch.Generator().manual_seed(5)
    logp = (torch.rand(4, 6, generator=g) * 40 - 20).requires_grad_(True)
    old, ref = torch.rand(2, 4, 6, generator=g) * 40 - 20
    mask = torch.arange(6) < torch.tensor([6, 0, 3, 1])[:, None]
    adv = torch.tensor([1.0, -1.0, -2.0, 0.5])
    for loss_type in ops.losses.LOSS_TYPES:
        for level in ("token", "sequence"):
            logp.grad = None
            out, loss = run_grpo_variant(logp, old, ref, adv, mask, loss_type, level, DELTA, 0.04, True)
            loss.backward()
            assert finite(loss, out.per_token_loss, out.kl, out.phi, logp.grad), (loss_type, level)


def test_unknown_options_are_refused():
    x, mask = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss(x, x, torch.zeros(1), mask, 0.2, 0.2, loss_type="ppo")
    with pytest.raises(ValueError, match="importance_sampling_level"):
        grpo_loss(x, x, torch.zeros(1), mask, 0.2, 0.2, importance_sampling_level="batch")
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(x, x, torch.zeros(1), mask, 0.2, 0.2, beta=0.1, loss_type="vespo")
    with pytest.raises(ValueError, match="num_items"):
        ops.aggregate_token_loss(x, mask, "cispo")


def test_new_loss_aggregations_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    # sapo as grpo: ((1 + 2 + 3) / 3 + 4 / 1) / 2 = 3
    assert ops.aggregate_token_loss(loss, mask, "sapo").item() == 3.0
    # luspo: mean over completions of their token sums = (6 + 4) / 2 = 5
    assert ops.aggregate_token_loss(loss, mask, "luspo").item() == 5.0
    # cispo and vespo as dapo: 10 / 8
    assert ops.aggregate_token_loss(loss, mask, "cispo", num_items=8).item() == 1.25
    assert ops.aggregate_token_loss(loss, mask, "vespo", num_items=8).item() == 1.25


@pytest.mark.parametrize("loss_type", ops.losses.LOSS_TYPES)
def test_which_losses_depend_on_the_micro_batch_split(loss_type):
    """Equal micro-batches of 2 completions, each loss / gradient_accumulation_steps (dapo's kind: / step tokens,
    no division): only bnpo differs from the loss of the whole step, because its normaliser is the micro-batch's
    token count; grpo, sapo and luspo average over completions and dr_grpo divides by a constant."""
    logp, old, ref, adv, mask = grpo_variant_inputs(seed=6)
    out, whole = run_grpo_variant(logp, old, ref, adv, mask, loss_type, "token", None, 0.04, False)
    steps, tokens = 3, mask.sum()
    parts = 0.0
    for i in range(0, 6, 2):
        part = ops.aggregate_token_loss(out.per_token_loss[i : i + 2], mask[i : i + 2], loss_type, 9, tokens)
        parts = parts + (part if loss_type in ("dapo", "cispo", "vespo") else part / steps)
    full = ops.aggregate_token_loss(out.per_token_loss, mask, loss_type, 9, tokens)
    if loss_type == "bnpo":
        assert not torch.allclose(parts, full)
    else:
        assert_close(parts, full)


def test_high_entropy_mask_hand_computed():
    # real entropies 0.1 0.5 0.9 | 0.3 0.7, sorted 0.1 0.3 0.5 0.7 0.9; padding holds inf and NaN
    entropies = torch.tensor([[0.1, 0.5, 0.9, math.inf], [0.3, 0.7, math.nan, math.nan]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    # q = 0.5: the median 0.5, kept with >=
    assert ops.high_entropy_mask(entropies, mask, 0.5).tolist() == [
        [False, True, True, False],
        [False, True] + [False] * 2,
    ]
    # q = 0.8 (top 20 %): position 0.8 * 4 = 3.2, between 0.7 and 0.9: 0.74 -> only 0.9
    assert ops.high_entropy_mask(entropies, mask, 0.8).tolist() == [[False, False, True, False], [False] * 4]
    # q = 0 keeps every real token, q = 1 the largest only
    assert torch.equal(ops.high_entropy_mask(entropies, mask, 0.0), mask)
    assert ops.high_entropy_mask(entropies, mask, 1.0).tolist() == [[False, False, True, False], [False] * 4]
    # nothing to pool: no token
    assert not ops.high_entropy_mask(entropies, torch.zeros_like(mask), 0.0).any()
    # pooled from elsewhere (TRL: every process's tokens): the median of 0, 0.2, 0.8 is 0.2
    pooled = torch.tensor([0.0, 0.2, 0.8], dtype=torch.float64)
    assert ops.high_entropy_mask(entropies, mask, 0.5, pooled_entropies=pooled).tolist() == [
        [False, True, True, False],
        [True, True, False, False],
    ]
    # bfloat16 entropies are compared in float32
    assert torch.equal(
        ops.high_entropy_mask(entropies.bfloat16(), mask, 0.5), ops.high_entropy_mask(entropies, mask, 0.5)
    )
