import math
import statistics

import pytest
import torch
from torch.testing import assert_close

from rlhfkit import ops


def random_batch(B=4, T=7, seed=0, dtype=torch.float64):
    """Random values and a right-padded mask with one empty row and one full row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, generator=g, dtype=dtype)
    lengths = torch.randint(1, T, (B,), generator=g)
    lengths[0], lengths[-1] = 0, T
    mask = torch.arange(T) < lengths[:, None]
    return x, mask


def selected_values(x, mask):
    """The masked values as a plain Python list, read with explicit loops."""
    return [x[b, t].item() for b in range(x.shape[0]) for t in range(x.shape[1]) if mask[b, t]]


# ---- hand-computed cases ----


def test_masked_sum_mean_hand_computed():
    x = torch.tensor([[1.0, 2.0, 30.0], [4.0, 50.0, 60.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # selected: 1, 2, 4 -> sum 7, mean 7/3; per row: [1+2, 4] = [3, 4], means [1.5, 4]
    assert_close(ops.masked_sum(x, mask), torch.tensor(7.0))
    assert_close(ops.masked_mean(x, mask), torch.tensor(7.0 / 3.0))
    assert_close(ops.masked_sum(x, mask, dim=-1), torch.tensor([3.0, 4.0]))
    assert_close(ops.masked_mean(x, mask, dim=1), torch.tensor([1.5, 4.0]))
    # per column: [1+4, 2, 0] / [2, 1, 0 -> 1]
    assert_close(ops.masked_mean(x, mask, dim=0), torch.tensor([2.5, 2.0, 0.0]))


def test_masked_var_hand_computed():
    x = torch.tensor([[1.0, 2.0, 99.0], [4.0, -7.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # selected 1, 2, 4: mean 7/3, squared deviations (4/3)^2 + (1/3)^2 + (5/3)^2 = 42/9 = 14/3
    # unbiased: (14/3) / 2 = 7/3; biased: (14/3) / 3 = 14/9
    assert_close(ops.masked_var(x, mask), torch.tensor(7.0 / 3.0))
    assert_close(ops.masked_var(x, mask, unbiased=False), torch.tensor(14.0 / 9.0))


def test_masked_whiten_hand_computed():
    x = torch.tensor([[1.0, 3.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    # mean 2, unbiased var ((-1)^2 + 1^2) / 1 = 2 -> (x - 2) / sqrt(2 + 1e-8)
    scale = 1.0 / math.sqrt(2.0 + 1e-8)
    expected = torch.tensor([[-scale, scale, 0.0]], dtype=torch.float64)
    assert_close(ops.masked_whiten(x, mask), expected)
    # keep_mean adds the mean (2) back inside the mask only
    assert_close(ops.masked_whiten(x, mask, keep_mean=True), torch.tensor([[2 - scale, 2 + scale, 0.0]]).double())


# ---- empty and tiny masks ----


def test_empty_mask_gives_zero_not_nan():
    x = torch.randn(3, 4)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    assert ops.masked_sum(x, mask).item() == 0.0
    assert ops.masked_mean(x, mask).item() == 0.0
    assert ops.masked_var(x, mask).item() == 0.0
    assert torch.equal(ops.masked_mean(x, mask, dim=-1), torch.zeros(3))
    assert torch.equal(ops.masked_whiten(x, mask), torch.zeros(3, 4))


@pytest.mark.parametrize("unbiased", [True, False])
def test_single_element_variance_is_zero(unbiased):
    x = torch.tensor([[5.0, 1.0], [2.0, 3.0]])
    mask = torch.tensor([[False, True], [False, False]])
    assert ops.masked_var(x, mask, unbiased=unbiased).item() == 0.0
    # whitening one value: centred to 0, then divided by sqrt(1e-8), still 0
    assert torch.equal(ops.masked_whiten(x, mask), torch.zeros(2, 2))


def test_identical_values_have_exactly_zero_variance():
    # 0.1 is not representable; a one-pass mean of 0.1s can be off by an ulp, which whitening would magnify
    x = torch.full((5, 13), 0.1)
    mask = torch.ones(5, 13, dtype=torch.bool)
    assert ops.masked_var(x, mask).item() == 0.0
    assert torch.equal(ops.masked_whiten(x, mask), torch.zeros(5, 13))


def test_garbage_outside_mask_does_not_leak():
    x, mask = random_batch()
    poisoned = x.masked_fill(~mask, float("nan"))
    poisoned[0, 0] = float("inf")  # row 0 has an empty mask
    assert_close(ops.masked_sum(poisoned, mask), ops.masked_sum(x, mask))
    assert_close(ops.masked_mean(poisoned, mask, dim=-1), ops.masked_mean(x, mask, dim=-1))
    assert_close(ops.masked_var(poisoned, mask), ops.masked_var(x, mask))
    assert_close(ops.masked_whiten(poisoned, mask), ops.masked_whiten(x, mask))


# ---- against independent float64 references ----


@pytest.mark.parametrize("seed", range(3))
def test_masked_stats_match_python_reference(seed):
    x, mask = random_batch(B=5, T=9, seed=seed)
    values = selected_values(x, mask)
    assert_close(ops.masked_sum(x, mask), torch.tensor(math.fsum(values), dtype=torch.float64))
    assert_close(ops.masked_mean(x, mask), torch.tensor(statistics.fmean(values), dtype=torch.float64))
    assert_close(ops.masked_var(x, mask), torch.tensor(statistics.variance(values), dtype=torch.float64))
    assert_close(
        ops.masked_var(x, mask, unbiased=False), torch.tensor(statistics.pvariance(values), dtype=torch.float64)
    )
    row_means = [statistics.fmean(selected_values(x[b : b + 1], mask[b : b + 1]) or [0.0]) for b in range(5)]
    assert_close(ops.masked_mean(x, mask, dim=-1), torch.tensor(row_means, dtype=torch.float64))


@pytest.mark.parametrize("keep_mean", [False, True])
def test_masked_whiten_matches_python_reference(keep_mean):
    x, mask = random_batch(B=4, T=6, seed=3)
    values = selected_values(x, mask)
    mean, std = statistics.fmean(values), math.sqrt(statistics.variance(values) + 1e-8)
    expected = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            if mask[b, t]:
                expected[b, t] = (x[b, t].item() - mean) / std + (mean if keep_mean else 0.0)
    assert_close(ops.masked_whiten(x, mask, keep_mean=keep_mean), expected)


def test_float32_stats_close_to_float64():
    x, mask = random_batch(B=8, T=33, seed=4)
    assert_close(ops.masked_var(x.float(), mask), ops.masked_var(x, mask).float())
    assert_close(ops.masked_whiten(x.float(), mask), ops.masked_whiten(x, mask).float())


# ---- invariances ----


def test_pooled_sums_over_micro_batches_equal_full_batch():
    # Token-weighted means must pool sums and counts across micro-batches, not average the per-batch means.
    x, mask = random_batch(B=6, T=5, seed=5)
    total, count = 0.0, 0
    for rows in torch.split(torch.arange(6), [1, 3, 2]):
        total += ops.masked_sum(x[rows], mask[rows]).item()
        count += mask[rows].sum().item()
    assert_close(torch.tensor(total / count, dtype=torch.float64), ops.masked_mean(x, mask))


def test_whiten_output_has_zero_mean_unit_variance():
    x, mask = random_batch(B=4, T=10, seed=6)
    x = 3.0 + 5.0 * x
    w = ops.masked_whiten(x, mask)
    assert_close(ops.masked_mean(w, mask), torch.tensor(0.0, dtype=torch.float64))
    # unit variance up to the 1e-8 in the denominator: var / (var + 1e-8)
    var = ops.masked_var(x, mask)
    assert_close(ops.masked_var(w, mask), var / (var + 1e-8))
    kept = ops.masked_whiten(x, mask, keep_mean=True)
    assert_close(ops.masked_mean(kept, mask), ops.masked_mean(x, mask))


def test_masked_whiten_is_shift_invariant():
    x, mask = random_batch(B=3, T=8, seed=7)
    assert_close(ops.masked_whiten(x + 42.0, mask), ops.masked_whiten(x, mask))
