import math
import statistics

import pytest
import torch
from torch.testing import assert_close

from rlhfkit import ops


def reference_gae_loop(rewards, values, lengths, gamma, lam):
    """Textbook GAE, one episode at a time: row b is an episode of lengths[b] steps, terminal after the last."""
    B, T = rewards.shape
    advantages = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        running = 0.0
        for t in reversed(range(lengths[b])):
            next_value = values[b, t + 1].item() if t + 1 < lengths[b] else 0.0
            delta = rewards[b, t].item() + gamma * next_value - values[b, t].item()
            running = delta + gamma * lam * running
            advantages[b, t] = running
    return advantages


def random_episodes(B=5, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[1] = 0, T  # one empty response, one that fills the row
    mask = torch.arange(T) < lengths[:, None]
    return rewards, values, mask, lengths.tolist()


# ---- gae ----


def test_gae_hand_computed():
    # one episode of 3 tokens, then a pad whose reward and value must be ignored
    rewards = torch.tensor([[0.0, 0.0, 1.0, 7.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.25, 0.5, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    out = ops.gae(rewards, values, mask, gamma=1.0, lam=0.5)
    # deltas: t2: 1 + 0 (terminal) - 0.5 = 0.5 ; t1: 0 + 0.5 - 0.25 = 0.25 ; t0: 0 + 0.25 - 0.5 = -0.25
    # A2 = 0.5 ; A1 = 0.25 + 0.5 * 0.5 = 0.5 ; A0 = -0.25 + 0.5 * 0.5 = 0
    assert_close(out.advantages, torch.tensor([[0.0, 0.5, 0.5, 0.0]], dtype=torch.float64))
    # returns = A + V: [0.5, 0.75, 1.0], 0 on the pad
    assert_close(out.returns, torch.tensor([[0.5, 0.75, 1.0, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize(("gamma", "lam"), [(0.99, 0.95), (1.0, 0.95), (0.9, 1.0), (1.0, 0.0)])
def test_gae_matches_reference_loop(gamma, lam):
    rewards, values, mask, lengths = random_episodes(seed=1)
    out = ops.gae(rewards, values, mask, gamma=gamma, lam=lam)
    ref = reference_gae_loop(rewards, values, lengths, gamma, lam)
    assert_close(out.advantages, ref)
    assert_close(out.returns, torch.where(mask, ref + values, 0.0))


def test_gae_float32_close_to_float64():
    rewards, values, mask, _ = random_episodes(B=8, T=20, seed=2)
    out64 = ops.gae(rewards, values, mask, gamma=0.99, lam=0.95)
    out32 = ops.gae(rewards.float(), values.float(), mask, gamma=0.99, lam=0.95)
    assert_close(out32.advantages, out64.advantages.float())


def test_gae_with_gamma_lam_one_is_reward_to_go_minus_values():
    rewards, values, mask, _ = random_episodes(seed=3)
    reward_to_go = torch.where(mask, rewards, 0.0).flip(-1).cumsum(-1).flip(-1)
    out = ops.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert_close(out.advantages, torch.where(mask, reward_to_go - values, 0.0))
    assert_close(out.returns, torch.where(mask, reward_to_go, 0.0))


def test_gae_with_lam_zero_is_one_step_td_error():
    rewards, values, mask, _ = random_episodes(seed=4)
    next_values = torch.nn.functional.pad(torch.where(mask, values, 0.0)[:, 1:], (0, 1))
    out = ops.gae(rewards, values, mask, gamma=0.9, lam=0.0)
    assert_close(out.advantages, torch.where(mask, rewards + 0.9 * next_values - values, 0.0))


def test_gae_ignores_padding_content_and_width():
    rewards, values, mask, _ = random_episodes(seed=5)
    out = ops.gae(rewards, values, mask, gamma=0.95, lam=0.9)
    # garbage in the padding changes nothing
    poisoned = ops.gae(rewards.masked_fill(~mask, math.nan), values.masked_fill(~mask, math.inf), mask, 0.95, 0.9)
    assert_close(poisoned, out)
    # extra padded columns change nothing on the real ones, and are 0
    wide = ops.gae(
        torch.nn.functional.pad(rewards, (0, 3), value=5.0),
        torch.nn.functional.pad(values, (0, 3), value=-5.0),
        torch.nn.functional.pad(mask, (0, 3), value=False),
        0.95,
        0.9,
    )
    assert_close(wide.advantages[:, :7], out.advantages)
    assert torch.equal(wide.advantages[:, 7:], torch.zeros(5, 3, dtype=torch.float64))


def test_gae_rows_are_independent_across_micro_batches():
    rewards, values, mask, _ = random_episodes(B=6, seed=6)
    full = ops.gae(rewards, values, mask, 0.99, 0.95)
    parts = [ops.gae(rewards[rows], values[rows], mask[rows], 0.99, 0.95) for rows in ([0, 1, 2], [3], [4, 5])]
    assert_close(torch.cat([p.advantages for p in parts]), full.advantages)


def test_gae_empty_time_dimension():
    empty = torch.zeros(3, 0)
    out = ops.gae(empty, empty, torch.zeros(3, 0, dtype=torch.bool), 0.99, 0.95)
    assert out.advantages.shape == (3, 0) and out.returns.shape == (3, 0)


# ---- gae over multi-turn episodes: masks with holes (tool results between the policy's turns) ----


def reference_gae_over_steps(rewards, values, mask, gamma, lam):
    """Textbook GAE, one episode at a time, over the positions of its mask only: each step's successor is the next
    True position of the row (float64 Python numbers; nothing else of the row is read)."""
    B, T = rewards.shape
    advantages = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        steps = [t for t in range(T) if mask[b, t]]
        running, next_value = 0.0, 0.0
        for t in reversed(steps):
            delta = rewards[b, t].item() + gamma * next_value - values[b, t].item()
            running = delta + gamma * lam * running
            advantages[b, t] = running
            next_value = values[b, t].item()
    return advantages


def episodes_with_holes(B=6, T=12, seed=0):
    """Random masks with holes anywhere (each position a step with probability 0.6): rows of turns and tool results,
    one row without any step, one with every position a step; NaN and inf where the mask is False."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.6
    mask[0], mask[1] = False, True
    assert (mask[2:].cumsum(1) < mask[2:].sum(1, keepdim=True)).logical_and(~mask[2:]).any()  # a hole, not padding
    return rewards.masked_fill(~mask, math.nan), values.masked_fill(~mask, math.inf), mask


def test_gae_skips_a_hole_hand_computed():
    # test_gae_hand_computed's episode with two tool-result tokens after its second step: the same advantages
    rewards = torch.tensor([[0.0, 0.0, 9.0, 9.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.25, 7.0, 7.0, 0.5]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False, False, True]])
    out = ops.gae(rewards, values, mask, gamma=1.0, lam=0.5)
    assert_close(out.advantages, torch.tensor([[0.0, 0.5, 0.0, 0.0, 0.5]], dtype=torch.float64))
    assert_close(out.returns, torch.tensor([[0.5, 0.75, 0.0, 0.0, 1.0]], dtype=torch.float64))


@pytest.mark.parametrize(("gamma", "lam"), [(0.99, 0.95), (1.0, 0.95), (0.9, 1.0), (1.0, 0.0), (0.5, 0.5)])
def test_gae_with_holes_matches_the_loop_over_steps(gamma, lam):
    rewards, values, mask = episodes_with_holes(seed=7)
    out = ops.gae(rewards, values, mask, gamma=gamma, lam=lam)
    ref = reference_gae_over_steps(rewards, values, mask, gamma, lam)
    assert_close(out.advantages, ref, rtol=0, atol=1e-12)
    assert_close(out.returns, torch.where(mask, ref + values, 0.0), rtol=0, atol=1e-12)


def test_gae_with_holes_equals_gae_on_the_compacted_sequence():
    # Each row's steps moved to the left, in order, the rest padding: plain right-padded GAE, scattered back.
    rewards, values, mask = episodes_with_holes(B=8, T=15, seed=8)
    order = torch.sort((~mask).int(), dim=1, stable=True).indices  # each row's step positions first, in order
    lengths = mask.sum(1)
    compact_mask = torch.arange(mask.shape[1]) < lengths[:, None]
    compact = ops.gae(rewards.gather(1, order), values.gather(1, order), compact_mask, 0.97, 0.9)
    out = ops.gae(rewards, values, mask, 0.97, 0.9)
    for name in ("advantages", "returns"):
        scattered = torch.zeros_like(rewards).scatter(1, order, getattr(compact, name))
        assert torch.equal(getattr(out, name), scattered), name


# ---- group_advantages ----


def reference_group_advantages(rewards, G, scale, eps):
    """Loop version with the statistics module (stdev = sample std, n - 1)."""
    values = rewards.tolist()
    batch_std = statistics.stdev(values) if len(values) > 1 else 0.0
    out = []
    for start in range(0, len(values), G):
        group = values[start : start + G]
        mean = statistics.fmean(group)
        std = {"group": statistics.stdev(group) if G > 1 else 0.0, "batch": batch_std}.get(scale)
        out += [(r - mean) / (std + eps) if std is not None else r - mean for r in group]
    return torch.tensor(out, dtype=torch.float64)


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 3.0, 0.0, 4.0], dtype=torch.float64)
    # groups of 2: means [2, 2]; centred [-1, 1, -2, 2]
    assert_close(ops.group_advantages(rewards, 2, scale="none"), torch.tensor([-1.0, 1.0, -2.0, 2.0]).double())
    # group std (n - 1): sqrt((1 + 1) / 1) = sqrt 2 and sqrt((4 + 4) / 1) = 2 sqrt 2
    s, e = math.sqrt(2.0), 1e-4
    expected = torch.tensor([-1 / (s + e), 1 / (s + e), -2 / (2 * s + e), 2 / (2 * s + e)], dtype=torch.float64)
    assert_close(ops.group_advantages(rewards, 2, scale="group"), expected)
    # batch std: mean 2, squared deviations 1 + 1 + 4 + 4 = 10, / 3 -> sqrt(10 / 3)
    b = math.sqrt(10.0 / 3.0)
    expected = torch.tensor([-1 / (b + e), 1 / (b + e), -2 / (b + e), 2 / (b + e)], dtype=torch.float64)
    assert_close(ops.group_advantages(rewards, 2, scale="batch"), expected)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("G", [1, 4])
def test_group_advantages_match_reference_loop(scale, G):
    rewards = torch.randn(12, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    assert_close(ops.group_advantages(rewards, G, scale=scale), reference_group_advantages(rewards, G, scale, 1e-4))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_are_permutation_equivariant(scale):
    g = torch.Generator().manual_seed(8)
    rewards = torch.randn(3, 4, generator=g, dtype=torch.float64)
    out = ops.group_advantages(rewards.flatten(), 4, scale=scale).reshape(3, 4)
    # shuffle completions inside each group and shuffle the groups: outputs move with their rewards
    within = torch.stack([torch.randperm(4, generator=g) for _ in range(3)])
    groups = torch.randperm(3, generator=g)
    shuffled = rewards.gather(1, within)[groups]
    shuffled_out = ops.group_advantages(shuffled.flatten(), 4, scale=scale).reshape(3, 4)
    assert_close(shuffled_out, out.gather(1, within)[groups])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_shift_invariant_and_zero_for_tied_groups(scale):
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.3, 0.7, 0.2], dtype=torch.float64)
    out = ops.group_advantages(rewards, 3, scale=scale)
    assert_close(ops.group_advantages(rewards + 10.0, 3, scale=scale), out)
    # a group whose completions tie carries no learning signal: exactly 0, not eps-amplified rounding noise
    assert torch.equal(out[:3], torch.zeros(3, dtype=torch.float64))
    assert torch.equal(ops.group_advantages(rewards.float(), 3, scale=scale)[:3], torch.zeros(3))


def test_group_advantages_reject_bad_arguments():
    with pytest.raises(ValueError, match="groups of 4"):
        ops.group_advantages(torch.zeros(6), 4, scale="group")
    with pytest.raises(ValueError, match="'std'"):
        ops.group_advantages(torch.zeros(4), 2, scale="std")


# ---- decoupled_group_advantages (GDPO, multi_objective_aggregation="normalize_then_sum") ----


def _stdev_or_nan(values):
    return statistics.stdev(values) if len(values) > 1 else math.nan


def reference_decoupled_advantages(rewards, weights, G, eps=1e-4):
    """Loop version: rewards[k][i] is None where source k does not score completion i."""
    K, B = len(rewards), len(rewards[0])
    totals = []
    for i in range(B):
        start = i - i % G
        total, scored = 0.0, False
        for k in range(K):
            if rewards[k][i] is None:
                continue
            scored = True
            group = [r for r in rewards[k][start : start + G] if r is not None]
            std = _stdev_or_nan(group)
            if not math.isnan(std):  # a source with one value in the group contributes 0 there
                total += weights[k] * (rewards[k][i] - statistics.fmean(group)) / (std + eps)
        totals.append(total if scored else None)
    scored = [t for t in totals if t is not None]
    mean, std = statistics.fmean(scored), _stdev_or_nan(scored)
    out = [0.0 if t is None or math.isnan(std) else (t - mean) / (std + eps) for t in totals]
    return torch.tensor(out, dtype=torch.float64)


def as_tensor(rewards):
    return torch.tensor([[math.nan if r is None else r for r in row] for row in rewards], dtype=torch.float64)


def test_decoupled_advantages_hand_computed():
    # two sources, two groups of 2; source 1 is 10x source 0's scale in the first group
    rewards = torch.tensor([[1.0, 3.0, 0.0, 0.0], [10.0, 30.0, 5.0, 7.0]], dtype=torch.float64)
    weights = torch.tensor([1.0, 0.5], dtype=torch.float64)
    s, e = math.sqrt(2.0), 1e-4
    # per source and group: (r - mean) / (std + eps); the tied source-0 group gives exactly 0
    x = 1 / (s + e) + 0.5 * 10 / (10 * s + e)  # group 1's |R|: both sources count about equally
    y = 0.5 / (s + e)  # group 2's |R|: source 1 alone
    totals = torch.tensor([-x, x, -y, y], dtype=torch.float64)  # batch mean 0
    std = math.sqrt((2 * x * x + 2 * y * y) / 3)
    out = ops.decoupled_group_advantages(rewards, weights, 2)
    assert_close(out, totals / (std + e))


@pytest.mark.parametrize("G", [2, 4])
def test_decoupled_advantages_match_reference_loop(G):
    g = torch.Generator().manual_seed(11)
    values = (torch.randn(3, 12, generator=g, dtype=torch.float64) * torch.tensor([[1.0], [20.0], [0.1]])).tolist()
    values[1][0] = None  # a source that does not apply to a completion
    values[2][4:6] = [None, None]
    values[0][9] = values[1][9] = values[2][9] = None  # no source scores completion 9: advantage 0
    weights = [1.0, 0.5, 2.0]
    out = ops.decoupled_group_advantages(as_tensor(values), torch.tensor(weights, dtype=torch.float64), G)
    expected = reference_decoupled_advantages(values, weights, G)
    assert_close(out, expected)
    assert out[9] == 0.0


def test_decoupled_advantages_ignore_each_sources_scale_and_shift():
    g = torch.Generator().manual_seed(12)
    rewards = torch.randn(2, 8, generator=g, dtype=torch.float64)
    weights = torch.tensor([1.0, 1.0], dtype=torch.float64)
    out = ops.decoupled_group_advantages(rewards, weights, 4)
    rescaled = rewards * torch.tensor([[1000.0], [1.0]], dtype=torch.float64) + 5.0
    # only the eps of each group's std tells the scales apart
    assert_close(ops.decoupled_group_advantages(rescaled, weights, 4), out, atol=1e-3, rtol=1e-3)
    # the sum of normalised rewards differs from normalising the weighted sum (sum_then_normalize)
    summed = ops.group_advantages(rescaled.sum(0), 4, "group")
    assert not torch.allclose(summed, ops.decoupled_group_advantages(rescaled, weights, 4), atol=1e-2)


def test_decoupled_advantages_are_zero_when_nothing_differs():
    rewards = torch.tensor([[0.3] * 4, [1.7] * 4], dtype=torch.float64)
    out = ops.decoupled_group_advantages(rewards, torch.tensor([1.0, 2.0], dtype=torch.float64), 2)
    assert torch.equal(out, torch.zeros(4, dtype=torch.float64))


def test_decoupled_advantages_reject_bad_arguments():
    with pytest.raises(ValueError, match="groups of 4"):
        ops.decoupled_group_advantages(torch.zeros(2, 6), torch.ones(2), 4)
    with pytest.raises(ValueError, match="3 weights for 2 reward sources"):
        ops.decoupled_group_advantages(torch.zeros(2, 4), torch.ones(3), 2)
