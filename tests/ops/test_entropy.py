"""Entropy regularisation (ops/entropy.py): the bonus, the adaptive controller and the entropy's gradient, against
hand-computed cases and float64 loops."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlhfkit import ops

# ---- entropy_bonus ----


def test_bonus_hand_computed():
    entropies = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # the loss's tokens: (1 + 2 + 4) / 3
    assert_close(ops.entropy_bonus(entropies, mask), torch.tensor(7 / 3, dtype=torch.float64))
    # narrowed to the high-entropy tokens: (2, 3 is padding) and (4): (2 + 4) / 2
    high = torch.tensor([[False, True, True], [True, True, False]])
    assert_close(ops.entropy_bonus(entropies, mask, high), torch.tensor(3.0, dtype=torch.float64))
    # no token: no bonus, not NaN
    empty = torch.zeros_like(mask)
    assert ops.entropy_bonus(entropies, empty).item() == 0.0
    # padding holding inf or NaN does not leak into the bonus or its gradient
    poisoned = entropies.clone().masked_fill(~mask, math.nan).requires_grad_()
    bonus = ops.entropy_bonus(poisoned, mask)
    bonus.backward()
    assert_close(bonus.detach(), torch.tensor(7 / 3, dtype=torch.float64))
    assert_close(poisoned.grad, mask.double() / 3)


def reference_bonus(entropies, mask, token_mask):
    """Mean of the entropies where both masks are set, in Python floats."""
    chosen = [
        entropies[b][t]
        for b in range(len(entropies))
        for t in range(len(entropies[b]))
        if mask[b][t] and token_mask[b][t]
    ]
    return math.fsum(chosen) / len(chosen) if chosen else 0.0


@pytest.mark.parametrize("seed", range(4))
def test_bonus_and_window_sums_match_reference_loop(seed):
    g = torch.Generator().manual_seed(seed)
    entropies = 3.0 * torch.rand(5, 7, generator=g, dtype=torch.float64)
    mask = torch.arange(7) < torch.randint(0, 8, (5,), generator=g)[:, None]
    token_mask = torch.rand(5, 7, generator=g) < 0.6
    expected = reference_bonus(entropies.tolist(), mask.tolist(), token_mask.tolist())
    assert ops.entropy_bonus(entropies, mask, token_mask).item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    full = torch.ones_like(mask)
    expected_full = reference_bonus(entropies.tolist(), mask.tolist(), full.tolist())
    assert ops.entropy_bonus(entropies, mask).item() == pytest.approx(expected_full, rel=1e-12, abs=1e-12)
    total, count = ops.entropy_window_sums(entropies, mask, token_mask).tolist()
    assert count == int((mask & token_mask).sum())
    assert total / max(count, 1) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_bonus_gradient_is_the_token_share():
    entropies = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True] * 4, [True, True, False, False], [False] * 4])
    token_mask = torch.tensor([[True, False, True, False], [True] * 4, [True] * 4])
    ops.entropy_bonus(entropies, mask, token_mask).backward()
    chosen = (mask & token_mask).double()
    assert_close(entropies.grad, chosen / chosen.sum())


# ---- the window: token-weighted over micro-batches ----


def test_window_entropy_weighs_tokens_not_micro_batches():
    # micro-batch 1: one token of entropy 1; micro-batch 2: three tokens of entropy 3. The step's mean entropy is
    # (1 + 9) / 4 = 2.5, not the mean of the micro-batch means (2).
    first = ops.entropy_window_sums(torch.tensor([[1.0, 7.0]]), torch.tensor([[True, False]]))
    second = ops.entropy_window_sums(torch.tensor([[3.0, 3.0, 3.0]]), torch.tensor([[True, True, True]]))
    assert first.dtype == torch.float64 and not first.requires_grad
    assert ops.window_entropy(first + second) == 2.5
    assert ops.window_entropy(torch.zeros(2, dtype=torch.float64)) == 0.0  # no token at all


# ---- the adaptive controller ----


def test_adaptive_step_hand_computed():
    step = dict(target=0.2, delta=0.005, coef_min=0.0, coef_max=0.02)
    assert ops.adaptive_entropy_coef(0.01, 0.1, **step) == pytest.approx(0.015)  # below the target: up
    assert ops.adaptive_entropy_coef(0.01, 0.2, **step) == pytest.approx(0.015)  # at the target: up
    assert ops.adaptive_entropy_coef(0.01, 0.3, **step) == pytest.approx(0.005)  # above: down
    assert ops.adaptive_entropy_coef(0.018, 0.1, **step) == 0.02  # clamped at coef_max
    assert ops.adaptive_entropy_coef(0.003, 0.3, **step) == 0.0  # clamped at coef_min
    with pytest.raises(ValueError, match="finite"):
        ops.adaptive_entropy_coef(0.01, math.nan, **step)


def test_adaptive_run_hand_computed():
    """A run of steps: each step applies the coefficient only after a step at or below the target (none before the
    first measurement), then the step's entropy moves it."""
    target, delta = 0.2, 0.005
    coef, last = 0.01, math.inf
    applied, coefs = [], []
    for entropy in [0.1, 0.1, 0.1, 0.5, 0.5, 0.5, 0.5]:
        applied.append(ops.applied_entropy_coef(coef, last, target, adaptive=True))
        coef = ops.adaptive_entropy_coef(coef, entropy, target, delta, coef_min=0.0, coef_max=0.02)
        coefs.append(coef)
        last = entropy
    assert coefs == pytest.approx([0.015, 0.02, 0.02, 0.015, 0.01, 0.005, 0.0])
    # step 1: no measurement yet; steps 2-4 follow a low-entropy step; 5-7 follow a high-entropy one
    assert applied == pytest.approx([0.0, 0.015, 0.02, 0.02, 0.0, 0.0, 0.0])


def test_static_coefficient_always_applies():
    for last in (math.inf, 0.0, 5.0):
        assert ops.applied_entropy_coef(0.03, last, 0.2, adaptive=False) == 0.03
        assert ops.applied_entropy_coef(-0.01, last, 0.2, adaptive=False) == -0.01


# ---- the gradient the bonus sends into the logits ----


def reference_entropy_gradient(logits_row, temperature):
    """d H / d logits of H = -sum p log p, p = softmax(logits / temperature): -p_v (log p_v + H) / temperature, in
    Python floats."""
    z = [v / temperature for v in logits_row]
    top = max(z)
    log_norm = top + math.log(math.fsum(math.exp(v - top) for v in z))
    logp = [v - log_norm for v in z]
    entropy = -math.fsum(math.exp(lp) * lp for lp in logp)
    return [-math.exp(lp) * (lp + entropy) / temperature for lp in logp]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_bonus_gradient_through_the_entropy_matches_reference(temperature):
    g = torch.Generator().manual_seed(1)
    logits = (3.0 * torch.randn(2, 3, 9, generator=g, dtype=torch.float64)).requires_grad_()
    mask = torch.tensor([[True, True, False], [True, False, False]])
    coef = 0.05
    loss = -coef * ops.entropy_bonus(ops.entropy_from_logits(logits, temperature), mask)
    loss.backward()
    count = int(mask.sum())
    expected = torch.zeros_like(logits)
    for b in range(2):
        for t in range(3):
            if mask[b, t]:
                grad = reference_entropy_gradient(logits[b, t].tolist(), temperature)
                expected[b, t] = -coef / count * torch.tensor(grad, dtype=torch.float64)
    assert_close(logits.grad, expected, rtol=1e-10, atol=1e-12)
