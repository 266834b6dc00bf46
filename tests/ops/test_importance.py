"""ops.importance: off_policy_correction and off_policy_sequence_mask against float64 loops over tokens and
sequences, and hand-computed cases."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlhfkit.ops.importance import IS_CORRECTION_MODES, off_policy_correction, off_policy_sequence_mask


def naive(old, sampling, mask, mode, clip_min, clip_max):
    """Token by token: the ratio, then the bound applied as the mode says."""
    B, T = old.shape
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    weights = [[1.0] * T for _ in range(B)]
    for b in range(B):
        tokens = [t for t in range(T) if mask[b, t]]
        if mode.startswith("sequence"):
            total = sum(
                0.0 if math.isnan(sampling[b, t].item()) else old[b, t].item() - sampling[b, t].item() for t in tokens
            )
            ratios = {t: math.exp(total) for t in tokens}
        else:
            ratios = {
                t: 1.0 if math.isnan(sampling[b, t].item()) else math.exp(old[b, t].item() - sampling[b, t].item())
                for t in tokens
            }
        for t, r in ratios.items():
            if mode.endswith("truncate"):
                weights[b][t] = min(max(r, low), high)
            else:
                weights[b][t] = 0.0 if (r < low or r > high) else r
    return torch.tensor(weights, dtype=torch.float64)


@pytest.mark.parametrize("mode", IS_CORRECTION_MODES)
@pytest.mark.parametrize("bounds", [(None, 3.0), (0.5, 2.0), (0.8, None)])
def test_matches_a_loop_over_tokens(mode, bounds):
    g = torch.Generator().manual_seed(0)
    B, T = 5, 7
    old = -2.0 * torch.rand(B, T, generator=g, dtype=torch.float64)
    sampling = old + 0.6 * torch.randn(B, T, generator=g, dtype=torch.float64)
    sampling[1, 2] = float("nan")  # the sampler gave no log-prob: ratio 1
    lengths = torch.tensor([0, 7, 3, 5, 1])
    mask = torch.arange(T) < lengths[:, None]
    old[~mask] = float("inf")  # padding holds garbage
    out = off_policy_correction(old, sampling, mask, mode, *bounds)
    assert_close(out.weights, naive(old, sampling, mask, mode, *bounds))
    assert not out.truncated[~mask].any() and not out.masked[~mask].any()
    if mode.endswith("mask"):
        assert torch.equal(out.masked, mask & (out.weights == 0)) and not out.truncated.any()
    else:
        assert not out.masked.any() and torch.equal(out.truncated, mask & (out.weights != out.ratio))


def test_hand_computed_sequence_mask():
    # one sequence of two tokens: log-ratios 0.5 and 0.7 -> sequence ratio e^1.2 = 3.32 > 3: masked (both tokens 0)
    old = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    sampling = torch.tensor([[-0.5, -0.7], [-0.5, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    out = off_policy_correction(old, sampling, mask, "sequence_mask", None, 3.0)
    assert out.weights.tolist() == [[0.0, 0.0], [pytest.approx(math.exp(0.5)), 1.0]]
    assert out.masked.tolist() == [[True, True], [False, False]]
    truncated = off_policy_correction(old, sampling, mask, "sequence_truncate", None, 3.0)
    assert truncated.weights[0].tolist() == [3.0, 3.0] and truncated.truncated.tolist() == [
        [True, True],
        [False, False],
    ]


def test_no_gradient_flows_through_the_weights():
    old = torch.zeros(1, 3, requires_grad=True)
    out = off_policy_correction(
        old, torch.full((1, 3), -0.1), torch.ones(1, 3, dtype=torch.bool), "token_truncate", None, 3.0
    )
    assert not out.weights.requires_grad


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="token_truncate, token_mask"):
        off_policy_correction(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), "clip", None, 3.0
        )


# ---- off_policy_sequence_mask (DeepSeek-V3.2, TRL's off_policy_mask_threshold) ----


def naive_sequence_mask(logprobs, behaviour, advantages, mask, threshold):
    """Completion by completion: the mean over its tokens of behaviour - current (NaN as 0), then the rule."""
    keep = []
    for b in range(logprobs.shape[0]):
        tokens = [t for t in range(logprobs.shape[1]) if mask[b, t]]
        drifts = [behaviour[b, t].item() - logprobs[b, t].item() for t in tokens]
        drift = sum(0.0 if math.isnan(d) else d for d in drifts) / max(len(tokens), 1)
        keep.append(advantages[b].item() >= 0 or drift <= threshold)
    return torch.tensor(keep)


@pytest.mark.parametrize("threshold", [0.0, 0.1, 0.5])
def test_sequence_mask_matches_a_loop(threshold):
    g = torch.Generator().manual_seed(3)
    B, T = 8, 6
    logprobs = -2.0 * torch.rand(B, T, generator=g, dtype=torch.float64)
    behaviour = logprobs + 0.8 * torch.randn(B, T, generator=g, dtype=torch.float64)
    behaviour[2, 1] = float("nan")  # no log-prob from the sampler: no evidence of drift
    advantages = torch.randn(B, generator=g, dtype=torch.float64)
    advantages[0] = 0.0  # a zero advantage is kept, as TRL keeps A >= 0
    lengths = torch.tensor([6, 0, 3, 6, 1, 4, 6, 2])
    mask = torch.arange(T) < lengths[:, None]
    logprobs[~mask] = float("inf")  # padding holds garbage
    out = off_policy_sequence_mask(logprobs, behaviour, advantages, mask, threshold)
    assert out.dtype == torch.bool and out.shape == (B,)
    assert torch.equal(out, naive_sequence_mask(logprobs, behaviour, advantages, mask, threshold))


def test_sequence_mask_hand_computed():
    logprobs = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0], [-1.0, 0.0]])
    # drifts (mean of behaviour - current): 0.6, 0.6, 0.2, and 0.6 over the one real token of the last row
    behaviour = torch.tensor([[-0.2, -0.6], [-0.2, -0.6], [-0.6, -1.0], [-0.4, 5.0]])
    advantages = torch.tensor([-1.0, 1.0, -1.0, -0.5])
    mask = torch.tensor([[True, True], [True, True], [True, True], [True, False]])
    out = off_policy_sequence_mask(logprobs, behaviour, advantages, mask, 0.5)
    # dropped: negative advantage and drift 0.6 > 0.5; kept: positive advantage, or drift 0.2 <= 0.5
    assert out.tolist() == [False, True, True, False]


def test_sequence_mask_carries_no_gradient():
    logprobs = torch.zeros(2, 3, requires_grad=True)
    out = off_policy_sequence_mask(logprobs, torch.ones(2, 3), torch.tensor([-1.0, 1.0]), torch.ones(2, 3).bool(), 0.5)
    assert not out.requires_grad and out.tolist() == [False, True]
