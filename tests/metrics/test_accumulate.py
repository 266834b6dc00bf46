"""MetricAccumulator: pooled means and variances equal those of the whole batch, however it is split
over micro-batches or processes; checked against float64 loops and torch.var, and on a real
2-process gloo group."""

import json
import math

import numpy as np
import pytest
import torch

from rlhfkit.metrics import registry
from rlhfkit.metrics import registry as M
from rlhfkit.metrics.accumulate import MetricAccumulator, Reduced
from rlhfkit.metrics.registry import Metric


def masked_batch(seed: int, rows: int, cols: int = 7):
    """Ratio-like values around 1 and a ragged response mask with one empty row."""
    g = torch.Generator().manual_seed(seed)
    x = 1.0 + 0.1 * torch.randn(rows, cols, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    lengths[0] = 0
    mask = torch.arange(cols)[None, :] < lengths[:, None]
    x[~mask] = float("nan")  # padding must never leak into a statistic
    return x, mask


def reference_masked_values(x, mask) -> list[float]:
    return [float(x[i, j]) for i in range(x.shape[0]) for j in range(x.shape[1]) if mask[i, j]]


def reference_mean(values: list[float]) -> float:
    total = 0.0
    for v in values:
        total += v
    return total / len(values)


def reference_var(values: list[float]) -> float:
    mean = reference_mean(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def test_micro_batches_pool_to_the_whole_batch_token_mean():
    x, mask = masked_batch(0, rows=12)
    acc = MetricAccumulator()
    for lo, hi in [(0, 1), (1, 6), (6, 12)]:  # unequal micro-batches, the first with no tokens
        acc.add_tensor(M.VAL_RATIO, x[lo:hi], mask[lo:hi])
    got = acc.reduce().scalars[M.VAL_RATIO.name]

    values = reference_masked_values(x, mask)
    assert got == pytest.approx(reference_mean(values), rel=1e-12)
    # Averaging the per-micro-batch means would weight 1 token like 30: a different (wrong) number.
    means = [reference_mean(reference_masked_values(x[lo:hi], mask[lo:hi])) for lo, hi in [(1, 6), (6, 12)]]
    assert got != pytest.approx(sum(means) / 2, rel=1e-9)


def test_add_with_sums_and_counts_equals_add_tensor():
    x, mask = masked_batch(1, rows=8)
    a, b = MetricAccumulator(), MetricAccumulator()
    for lo, hi in [(0, 3), (3, 8)]:
        a.add_tensor(M.POLICY_APPROXKL_AVG, x[lo:hi], mask[lo:hi])
        b.add(M.POLICY_APPROXKL_AVG, torch.where(mask[lo:hi], x[lo:hi], 0).sum(), mask[lo:hi].sum())
    assert a.reduce().scalars == b.reduce().scalars


def test_pooled_variance_and_std_equal_torch_var_of_the_concatenation():
    x, mask = masked_batch(2, rows=10)
    acc = MetricAccumulator()
    for lo, hi in [(0, 4), (4, 5), (5, 10)]:
        acc.add_tensor(M.VAL_RATIO_VAR, x[lo:hi], mask[lo:hi])
        acc.add_tensor(M.TOKENS_RESPONSES_LEN_STD, mask[lo:hi].sum(1).double())
    scalars = acc.reduce().scalars

    torch.testing.assert_close(torch.tensor(scalars[M.VAL_RATIO_VAR.name], dtype=torch.float64), x[mask].var())
    torch.testing.assert_close(
        torch.tensor(scalars[M.TOKENS_RESPONSES_LEN_STD.name], dtype=torch.float64), mask.sum(1).double().std()
    )
    assert scalars[M.VAL_RATIO_VAR.name] == pytest.approx(reference_var(reference_masked_values(x, mask)))


def test_add_moments_pools_like_add_tensor():
    values = torch.tensor([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0], dtype=torch.float64)
    acc = MetricAccumulator()
    for part in (values[:3], values[3:]):
        acc.add_moments(M.RETURNS_VAR, part.sum(), (part**2).sum(), part.numel())
    # Hand-computed: mean 5, sum of squared deviations 32, unbiased variance 32 / 7.
    assert acc.reduce().scalars[M.RETURNS_VAR.name] == pytest.approx(32 / 7)


def test_sum_and_histogram():
    acc = MetricAccumulator()
    acc.add(M.VAL_NUM_EOS_TOKENS, torch.tensor([True, False, True]).sum())
    acc.add(M.VAL_NUM_EOS_TOKENS, 4)
    acc.add_values(M.ENV_REWARD_DIST, torch.tensor([[1.0, 2.0]]))
    acc.add_values(M.ENV_REWARD_DIST, np.array([3.0]))
    reduced = acc.reduce()
    assert reduced.scalars == {M.VAL_NUM_EOS_TOKENS.name: 6.0}
    np.testing.assert_array_equal(reduced.histograms[M.ENV_REWARD_DIST.name], [1.0, 2.0, 3.0])


def test_empty_pools_give_zero_not_nan():
    acc = MetricAccumulator()
    acc.add(M.VAL_CLIPFRAC_AVG, 0.0, 0)
    acc.add_moments(M.VAL_VAR, 3.0, 9.0, 1)  # a single value has no spread
    acc.add_tensor(M.POLICY_ENTROPY_AVG, torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    assert acc.reduce().scalars == {M.POLICY_ENTROPY_AVG.name: 0.0, M.VAL_CLIPFRAC_AVG.name: 0.0, M.VAL_VAR.name: 0.0}


def test_reduce_clears_and_orders_like_the_registry():
    acc = MetricAccumulator()
    acc.add(M.VAL_RATIO, 2.0, 2)
    acc.add(M.OBJECTIVE_KL, 3.0, 1)
    first = acc.reduce()
    assert list(first.scalars) == [M.OBJECTIVE_KL.name, M.VAL_RATIO.name]
    assert acc.reduce() == Reduced({}, {})


def test_only_registered_metrics_with_the_right_method_are_accepted():
    acc = MetricAccumulator()
    with pytest.raises(KeyError, match="made/up"):
        acc.add(Metric("made/up", "m", "f", "u", "mean"), 1.0)
    with pytest.raises(TypeError):
        acc.add("objective/kl", 1.0)
    with pytest.raises(ValueError, match="add_moments"):
        acc.add(M.VAL_RATIO_VAR, 1.0)
    with pytest.raises(ValueError, match="not pooled"):
        acc.add_tensor(M.LR, torch.ones(1))  # a "last" metric goes into the logged row directly


@pytest.fixture
def extreme_metrics():
    """The registry's min and max metrics (GRPO's clip ratios)."""
    return M.CLIP_RATIO_LOW_MIN, M.CLIP_RATIO_HIGH_MAX


CORRECTNESS_MEAN = registry.expand(M.REWARDS_FUNC_MEAN, "correctness")


def test_template_expansions_are_accepted_only_when_declared():
    with pytest.raises(KeyError, match="extra_metrics"):
        MetricAccumulator().add(CORRECTNESS_MEAN, 1.0)
    with pytest.raises(KeyError):
        MetricAccumulator().add(M.REWARDS_FUNC_MEAN, 1.0)  # the template itself is not a metric
    acc = MetricAccumulator(extra_metrics=[CORRECTNESS_MEAN])
    acc.add_tensor(CORRECTNESS_MEAN, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    assert acc.reduce().scalars == {"rewards/correctness/mean": 0.75}


def test_min_and_max(extreme_metrics):
    low, high = extreme_metrics
    acc = MetricAccumulator()
    acc.add_extreme(low, torch.tensor([3.0, -1.0]))
    acc.add_extreme(low, 0.5)
    acc.add_tensor(high, torch.tensor([1.0, 9.0, 4.0]), torch.tensor([True, False, True]))
    acc.add_extreme(high, torch.zeros(0))  # nothing to fold in
    assert acc.reduce().scalars == {low.name: -1.0, high.name: 4.0}


def test_an_extreme_of_nothing_is_zero_like_an_empty_mean():
    """The shortest terminated completion of a window where none terminated: 0, as TRL logs it, and not missing."""
    acc = MetricAccumulator()
    acc.add_tensor(M.COMPLETIONS_MIN_TERMINATED_LENGTH, torch.tensor([5.0, 3.0]), torch.tensor([False, False]))
    acc.add_tensor(M.COMPLETIONS_MEAN_TERMINATED_LENGTH, torch.tensor([5.0, 3.0]), torch.tensor([False, False]))
    assert acc.reduce().scalars == {
        M.COMPLETIONS_MEAN_TERMINATED_LENGTH.name: 0.0,
        M.COMPLETIONS_MIN_TERMINATED_LENGTH.name: 0.0,
    }
    acc.add_extreme(M.COMPLETIONS_MIN_TERMINATED_LENGTH, torch.zeros(0))
    acc.add_extreme(M.COMPLETIONS_MIN_TERMINATED_LENGTH, 7.0)  # a later step of the window has one
    assert acc.reduce().scalars == {M.COMPLETIONS_MIN_TERMINATED_LENGTH.name: 7.0}


# ------------------------------------------------------------------------------------------------
# Two real processes (gloo, CPU) through accelerate's debug launcher
# ------------------------------------------------------------------------------------------------


def feed(acc: MetricAccumulator, rank: int, low: Metric, high: Metric) -> None:
    """What process `rank` adds: different batch sizes per process, some metrics on one process only."""
    x, mask = masked_batch(10 + rank, rows=3 + 4 * rank)
    half = x.shape[0] // 2
    for sl in (slice(0, half), slice(half, None)):  # two micro-batches
        acc.add_tensor(M.VAL_RATIO, x[sl], mask[sl])
        acc.add_tensor(M.VAL_RATIO_VAR, x[sl], mask[sl])
        acc.add_tensor(M.POLICY_RATIO_DIST, x[sl], mask[sl])
    scores = torch.arange(3 + 4 * rank, dtype=torch.float64) * (rank + 1)
    acc.add_tensor(M.OBJECTIVE_SCORES_STD, scores)
    acc.add(M.VAL_NUM_EOS_TOKENS, 2 + rank)
    acc.add_extreme(low, scores.min() - rank)
    acc.add_extreme(high, scores.max())
    acc.add_tensor(CORRECTNESS_MEAN, torch.ones(rank + 1))  # 1 value on process 0, 2 on process 1
    # Terminated lengths: only process 1 has any for the min; no process has any for the max.
    acc.add_extreme(M.COMPLETIONS_MIN_TERMINATED_LENGTH, torch.tensor([4.0, 2.0]) if rank else torch.zeros(0))
    acc.add_extreme(M.COMPLETIONS_MAX_TERMINATED_LENGTH, torch.zeros(0))
    if rank == 1:
        acc.add(M.OBJECTIVE_KL, 5.0, 2)
        acc.add_values(M.ENV_REWARD_DIST, scores)


def _child(out_dir: str, low: Metric, high: Metric) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # forked from pytest: forget any state the parent built
    accelerator = Accelerator(cpu=True)
    acc = MetricAccumulator(extra_metrics=[CORRECTNESS_MEAN])
    feed(acc, accelerator.process_index, low, high)
    reduced = acc.reduce(accelerator)
    record = {
        "num_processes": accelerator.num_processes,
        "scalars": reduced.scalars,
        "histograms": {k: v.tolist() for k, v in reduced.histograms.items()},
    }
    with open(f"{out_dir}/rank{accelerator.process_index}.json", "w") as f:
        json.dump(record, f)


def test_two_process_reduce_is_exact(tmp_path, extreme_metrics):
    from accelerate import debug_launcher

    low, high = extreme_metrics
    debug_launcher(_child, args=(str(tmp_path), low, high), num_processes=2)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["num_processes"] for r in results] == [2, 2]

    # Reference: both processes' data in one accumulator, and independent float64 formulas.
    single = MetricAccumulator(extra_metrics=[CORRECTNESS_MEAN])
    feed(single, 0, low, high)
    feed(single, 1, low, high)
    expected = single.reduce()
    x0, m0 = masked_batch(10, rows=3)
    x1, m1 = masked_batch(11, rows=7)
    ratios = torch.cat([x0[m0], x1[m1]])
    scores = torch.cat([torch.arange(3.0, dtype=torch.float64), 2 * torch.arange(7.0, dtype=torch.float64)])

    for result in results:  # every process gets the same numbers
        scalars = result["scalars"]
        assert scalars == pytest.approx(expected.scalars, rel=1e-12)
        assert scalars[M.VAL_RATIO.name] == pytest.approx(ratios.mean().item(), rel=1e-12)
        torch.testing.assert_close(torch.tensor(scalars[M.VAL_RATIO_VAR.name], dtype=torch.float64), ratios.var())
        torch.testing.assert_close(
            torch.tensor(scalars[M.OBJECTIVE_SCORES_STD.name], dtype=torch.float64), scores.std()
        )
        assert scalars[M.VAL_NUM_EOS_TOKENS.name] == 5
        assert scalars[M.OBJECTIVE_KL.name] == 2.5  # added on process 1 only
        assert scalars["rewards/correctness/mean"] == 1.0
        assert scalars[low.name] == -1.0 and scalars[high.name] == 12.0
        assert scalars[M.COMPLETIONS_MIN_TERMINATED_LENGTH.name] == 2.0
        assert scalars[M.COMPLETIONS_MAX_TERMINATED_LENGTH.name] == 0.0
        hists = result["histograms"]
        assert set(hists) == {M.POLICY_RATIO_DIST.name, M.ENV_REWARD_DIST.name}
        np.testing.assert_allclose(hists[M.POLICY_RATIO_DIST.name], ratios.numpy(), rtol=0, atol=0)
        np.testing.assert_array_equal(hists[M.ENV_REWARD_DIST.name], 2 * np.arange(7.0))
        assert not any(math.isnan(v) for v in scalars.values())


def test_state_dict_round_trip_continues_a_window():
    """A window split by a checkpoint reduces to the same numbers as one that was not."""
    x, mask = masked_batch(3, rows=5)

    def first_half(acc):
        acc.add_tensor(M.VAL_RATIO, x[:2], mask[:2])
        acc.add_tensor(M.VAL_RATIO_VAR, x[:2], mask[:2])
        acc.add_extreme(M.CLIP_RATIO_HIGH_MAX, 0.25)
        acc.add_values(M.POLICY_RATIO_DIST, x[:2][mask[:2]])

    def second_half(acc):
        acc.add_tensor(M.VAL_RATIO, x[2:], mask[2:])
        acc.add_tensor(M.VAL_RATIO_VAR, x[2:], mask[2:])
        acc.add_extreme(M.CLIP_RATIO_HIGH_MAX, 0.75)
        acc.add_values(M.POLICY_RATIO_DIST, x[2:][mask[2:]])

    whole = MetricAccumulator()
    first_half(whole)
    second_half(whole)
    saved = MetricAccumulator()
    first_half(saved)
    state = saved.state_dict()
    resumed = MetricAccumulator()
    resumed.load_state_dict(state)
    second_half(resumed)
    expected, got = whole.reduce(), resumed.reduce()
    assert got.scalars == expected.scalars
    np.testing.assert_array_equal(
        got.histograms[M.POLICY_RATIO_DIST.name], expected.histograms[M.POLICY_RATIO_DIST.name]
    )
