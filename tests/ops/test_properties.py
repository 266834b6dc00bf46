"""Property tests over awkward inputs: empty and all-False masks, zero-length and single-token responses,
extreme logits. Where the math has an answer, the ops must give it finitely (no NaN, no inf)."""

import math

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from rlhfkit import ops
from tests.ops.grpo import grpo_loss

SETTINGS = settings(max_examples=50, deadline=None)


def finite(*tensors):
    return all(bool(torch.isfinite(t).all()) for t in tensors)


@st.composite
def masked_batches(draw, n_tensors=1, bound=1e4, max_B=4, max_T=6):
    """(tensors..., mask): float32 (B, T) tensors in [-bound, bound] and a right-padded bool mask (B, T).
    B >= 1, T >= 0; lengths anywhere in [0, T], so all-False rows and whole masks occur."""
    B = draw(st.integers(1, max_B))
    T = draw(st.integers(0, max_T))
    floats = st.floats(-bound, bound, allow_nan=False, width=32)
    tensors = [
        torch.tensor(draw(st.lists(floats, min_size=B * T, max_size=B * T)), dtype=torch.float32).reshape(B, T)
        for _ in range(n_tensors)
    ]
    lengths = torch.tensor(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
    return (*tensors, torch.arange(T) < lengths[:, None])


def empty_mask(B, T):
    return torch.zeros(B, T, dtype=torch.bool)


# ---- masked statistics ----


@SETTINGS
@given(batch=masked_batches())
@example(batch=(torch.zeros(2, 0), empty_mask(2, 0)))
@example(batch=(torch.tensor([[1e4]]), torch.tensor([[True]])))
@example(batch=(torch.tensor([[1e4, -1e4]]), empty_mask(1, 2)))
def test_masked_stats_are_finite_and_zero_outside_mask(batch):
    x, mask = batch
    var = ops.masked_var(x, mask)
    whitened = ops.masked_whiten(x, mask)
    assert finite(ops.masked_sum(x, mask), ops.masked_mean(x, mask), ops.masked_mean(x, mask, dim=-1), var, whitened)
    assert var >= 0
    assert not whitened[~mask].any()
    if mask.sum() < 2:
        assert var == 0
    if not mask.any():
        assert ops.masked_mean(x, mask) == 0 and ops.masked_sum(x, mask) == 0


# ---- log-probs and entropy ----


@st.composite
def logits_batches(draw):
    """(logits (B, T, V) float32 with entries up to +-1e4, tokens (B, T), temperature)."""
    B, T, V = draw(st.integers(1, 3)), draw(st.integers(0, 4)), draw(st.integers(1, 6))
    values = st.one_of(st.sampled_from([-1e4, 1e4, 0.0]), st.floats(-1e4, 1e4, allow_nan=False, width=32))
    logits = torch.tensor(draw(st.lists(values, min_size=B * T * V, max_size=B * T * V)), dtype=torch.float32)
    tokens = torch.tensor(draw(st.lists(st.integers(0, V - 1), min_size=B * T, max_size=B * T)), dtype=torch.long)
    temperature = draw(st.sampled_from([0.3, 1.0, 2.5]))
    return logits.reshape(B, T, V), tokens.reshape(B, T), temperature


@SETTINGS
@given(batch=logits_batches())
@example(batch=(torch.tensor([[[1e4, -1e4, -1e4]]]), torch.tensor([[1]]), 0.3))
@example(batch=(torch.zeros(2, 0, 5), torch.zeros(2, 0, dtype=torch.long), 1.0))
def test_logprobs_and_entropy_are_finite_and_normalised(batch):
    logits, tokens, temperature = batch
    B, T, V = logits.shape
    logprobs = ops.logprobs_from_logits(logits, tokens, temperature)
    entropy = ops.entropy_from_logits(logits, temperature)
    assert logprobs.shape == entropy.shape == (B, T)
    assert finite(logprobs, entropy)
    assert (logprobs <= 0).all()
    # 0 <= H <= ln V; the upper bound up to float32 rounding of a sum of V terms
    assert (entropy >= 0).all() and (entropy <= math.log(V) + 1e-5).all()
    # the log-probs of all V tokens at a position describe a distribution: logsumexp over the vocabulary is 0.
    # log p = z - logsumexp(z) rounds logsumexp(z) at the scale of |z| (here up to 1e4 / 0.3), so the absolute
    # error is about one float32 ulp of max |z|: the tolerance grows with it (2 eps |z|) instead of being fixed.
    every_token = torch.stack(
        [ops.logprobs_from_logits(logits, torch.full_like(tokens, v), temperature) for v in range(V)]
    )
    ulp_scale = (
        2 * torch.finfo(torch.float32).eps * (logits.abs().amax().item() if logits.numel() else 0.0) / temperature
    )
    assert_close(every_token.logsumexp(0), torch.zeros(B, T), atol=1e-5 + ulp_scale, rtol=0)


# ---- KL ----


@SETTINGS
@given(
    logp=st.floats(-40.0, 0.0, width=32),
    offset=st.one_of(st.floats(-40.0, 40.0, width=32), st.floats(-(2**-10), 2**-10, width=32)),
)
@example(logp=-3e-8, offset=1.0)  # ref = 0, d = 3e-8: float32 exp(d) rounds to 1, so exp(d) - 1 - d = -3e-8
def test_k2_and_k3_are_non_negative_and_finite(logp, offset):
    # tiny differences are where exp(d) - 1 - d rounds to a negative number; expm1(d) - d does not
    logprobs = torch.tensor([[logp]])
    ref = torch.tensor([[min(logp + offset, 0.0)]])
    for estimator in ("k1", "k2", "k3"):
        assert finite(ops.kl_per_token(logprobs, ref, estimator))
    assert ops.kl_per_token(logprobs, ref, "k2") >= 0
    assert ops.kl_per_token(logprobs, ref, "k3") >= 0


@SETTINGS
@given(batch=masked_batches(n_tensors=1, bound=100.0), kl_coef=st.floats(0.0, 1.0))
@example(batch=(torch.zeros(3, 0), empty_mask(3, 0)), kl_coef=0.1)
@example(batch=(torch.ones(2, 3), empty_mask(2, 3)), kl_coef=0.1)
def test_penalized_rewards_sum_to_score_minus_penalty(batch, kl_coef):
    kl, mask = batch
    scores = torch.linspace(-2.0, 3.0, kl.shape[0])
    out = ops.kl_penalized_rewards(scores, kl, mask, kl_coef)
    assert finite(out.rewards, out.non_score_reward)
    assert not out.rewards[~mask].any() and not out.non_score_reward[~mask].any()
    has_tokens = mask.any(-1)
    expected = torch.where(has_tokens, scores, 0.0) - kl_coef * ops.masked_sum(kl, mask, dim=-1)
    # float32 sums of up to 6 terms of size up to 100: allow for their rounding
    assert_close(out.rewards.sum(-1), expected, atol=1e-4, rtol=1e-5)


# ---- advantages ----


@SETTINGS
@given(batch=masked_batches(n_tensors=2, bound=1e3), gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0))
@example(batch=(torch.zeros(2, 0), torch.zeros(2, 0), empty_mask(2, 0)), gamma=1.0, lam=1.0)
@example(batch=(torch.ones(1, 1), torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool)), gamma=1.0, lam=1.0)
def test_gae_is_finite_and_zero_outside_mask(batch, gamma, lam):
    rewards, values, mask = batch
    # float64 so that returns = (r - V) + V at the last token is r up to default tolerances (float32 would
    # round at the scale of V, up to 1e3)
    rewards, values = rewards.double(), values.double()
    out = ops.gae(rewards, values, mask, gamma, lam)
    assert out.advantages.shape == out.returns.shape == rewards.shape
    assert finite(out.advantages, out.returns)
    assert not out.advantages[~mask].any() and not out.returns[~mask].any()
    # the last real token has no successor: its advantage is r - V and its return is r
    last = ops.last_true_index(mask)
    rows = torch.nonzero(last >= 0).flatten()
    assert_close(out.returns[rows, last[rows]], rewards[rows, last[rows]])


@SETTINGS
@given(
    num_groups=st.integers(1, 4),
    G=st.integers(1, 5),
    data=st.data(),
    scale=st.sampled_from(["group", "batch", "none"]),
)
def test_group_advantages_are_finite_centred_and_bounded(num_groups, G, data, scale):
    values = st.one_of(st.sampled_from([0.0, 1.0, 1e4]), st.floats(-1e4, 1e4, allow_nan=False, width=32))
    rewards = torch.tensor(data.draw(st.lists(values, min_size=num_groups * G, max_size=num_groups * G)))
    out = ops.group_advantages(rewards, G, scale=scale)
    assert out.shape == rewards.shape and finite(out)
    grouped, adv = rewards.reshape(num_groups, G), out.reshape(num_groups, G)
    # groups whose completions all tie get exactly 0
    tied = (grouped == grouped[:, :1]).all(-1)
    assert not adv[tied].any()
    if scale == "group":
        # a z-score with the unbiased std is at most (G - 1) / sqrt(G) in magnitude
        assert (adv.abs() <= (G - 1) / math.sqrt(G) * (1 + 1e-5) + 1e-6).all()


# ---- losses ----


@SETTINGS
@given(batch=masked_batches(n_tensors=3, bound=20.0), cliprange=st.floats(0.0, 0.5))
@example(batch=(torch.zeros(2, 0), torch.zeros(2, 0), torch.zeros(2, 0), empty_mask(2, 0)), cliprange=0.2)
@example(batch=(torch.full((1, 3), 20.0), torch.zeros(1, 3), torch.ones(1, 3), empty_mask(1, 3)), cliprange=0.2)
def test_losses_are_finite_and_vanish_without_tokens(batch, cliprange):
    new, old, advantages, mask = batch
    new = new.clone().requires_grad_(True)
    policy = ops.clipped_policy_loss(new, old, advantages, mask, cliprange)
    value = ops.clipped_value_loss(new, old, advantages, mask, cliprange)
    (policy.loss + value.loss).backward()
    assert finite(policy.loss, policy.per_token_loss, policy.ratio, policy.approx_kl, value.loss, new.grad)
    assert finite(ops.explained_variance(new.detach(), advantages, mask))
    assert not policy.clipped[~mask].any() and not value.clipped[~mask].any()
    assert not new.grad[~mask].any()
    if not mask.any():
        assert policy.loss == 0 and value.loss == 0 and ops.explained_variance(new.detach(), advantages, mask) == 0


@SETTINGS
@given(
    batch=masked_batches(n_tensors=3, bound=20.0),
    loss_type=st.sampled_from(["grpo", "bnpo", "dr_grpo", "dapo"]),
    beta=st.sampled_from([0.0, 0.04]),
)
@example(
    batch=(torch.zeros(2, 0), torch.zeros(2, 0), torch.zeros(2, 0), empty_mask(2, 0)), loss_type="grpo", beta=0.04
)
def test_grpo_losses_are_finite_and_vanish_without_tokens(batch, loss_type, beta):
    """Log-probs up to 20 nats apart (ratios of e^20, references far off) still give finite losses and gradients."""
    new, old, ref, mask = batch
    new = new.clone().requires_grad_(True)
    advantages = torch.linspace(-2, 2, new.shape[0])
    out = grpo_loss(new, old, advantages, mask, 0.2, 0.28, ref, beta)
    loss = ops.aggregate_token_loss(out.per_token_loss, mask, loss_type, max_completion_length=8, num_items=mask.sum())
    loss.backward()
    assert finite(loss, out.per_token_loss, out.kl, new.grad)
    assert not new.grad[~mask].any() and not (out.low_clipped | out.high_clipped)[~mask].any()
    assert (out.kl >= 0).all()
    if not mask.any():
        assert loss == 0


# ---- sequences ----


@SETTINGS
@given(
    rows=st.integers(1, 4).flatmap(
        lambda T: st.lists(st.lists(st.integers(0, 4), min_size=T, max_size=T), min_size=1, max_size=4)
    ),
    stop_ids=st.lists(st.integers(0, 4), min_size=1, max_size=2),
)
def test_truncation_keeps_prefix_through_first_stop(rows, stop_ids):
    responses = torch.tensor(rows)
    out = ops.truncate_after_stop_token(responses, stop_ids, pad_token_id=9)
    is_stop = torch.isin(responses, torch.tensor(stop_ids))
    first = ops.first_true_index(is_stop)
    lengths = torch.where(first < responses.shape[1], first + 1, responses.shape[1])
    mask = ops.mask_from_lengths(lengths, responses.shape[1])
    assert torch.equal(out[mask], responses[mask])
    assert (out[~mask] == 9).all()
    assert torch.equal(ops.last_true_index(mask), lengths - 1)
