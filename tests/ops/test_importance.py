"""ops.importance.off_policy_correction against a float64 loop over tokens and sequences, and hand-computed cases."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlhfkit.ops.importance import IS_CORRECTION_MODES, off_policy_correction


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
