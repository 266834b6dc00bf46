"""DAPO dynamic sampling's choice of groups (ops/dynamic_sampling.py): a hand-computed case and a naive reference."""

import random

import pytest
import torch

from rlhfkit import ops
from rlhfkit.ops.dynamic_sampling import select_groups, zero_std_groups


def rounds_of(*groups_per_round):
    """Rewards of successive rounds, each given as a list of groups (lists of G rewards)."""
    return [torch.tensor([r for group in groups for r in group], dtype=torch.float64) for groups in groups_per_round]


def test_zero_std_is_the_frac_reward_zero_std_test():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 2.0, 0.5, 0.5 + 1e-12], dtype=torch.float64)
    assert zero_std_groups(rewards, 2).tolist() == [True, False, False, True]
    std = rewards.view(-1, 2).std(dim=1)  # the test GRPOTrainer used inline before
    assert torch.equal(zero_std_groups(rewards, 2), torch.isclose(std, torch.zeros_like(std)))
    assert ops.zero_std_groups is zero_std_groups


def test_hand_computed_case():
    # G = 2, a batch of 3 groups. Round 0: groups 0, 2 have spread; round 1 (groups 3-5): 4 and 5 have spread.
    rewards = rounds_of([[0, 1], [1, 1], [1, 0]], [[0, 0], [2, 1], [3, 4]])
    selection = select_groups(rewards, 2, 3)
    assert selection.kept == [0, 2, 4]  # the first three with spread; 5 is surplus
    assert (selection.enough, selection.filled, selection.zero_std_dropped) == (True, 0, 2)
    # After the first round alone: two with spread, one slot filled with the first zero-spread group.
    first = select_groups(rewards[:1], 2, 3)
    assert first.kept == [0, 1, 2] and (first.enough, first.filled, first.zero_std_dropped) == (False, 1, 0)


def test_shares_keep_their_own_groups():
    # Two processes, a batch of 4 groups (2 each), G = 2. Round 0: process 0 has groups 0, 1; process 1 has 2, 3.
    rewards = rounds_of([[1, 1], [0, 1], [1, 0], [0, 1]], [[0, 1], [1, 1], [5, 5], [1, 2]])
    selection = select_groups(rewards, 2, 4, num_shares=2)
    # Process 0: 1 (round 0), 4 (round 1); process 1: 2, 3 (round 0); 7 is surplus, 5 and 6 are dropped.
    assert selection.kept == [1, 4, 2, 3]
    assert (selection.enough, selection.filled, selection.zero_std_dropped) == (True, 0, 3)


def test_cap_fills_with_the_first_zero_spread_groups_in_generation_order():
    rewards = rounds_of([[1, 1], [2, 2], [0, 1]], [[3, 3], [4, 4], [5, 5]])
    selection = select_groups(rewards, 2, 3)
    assert selection.kept == [0, 1, 2] and selection.filled == 2 and not selection.enough
    assert selection.zero_std_dropped == 3


def naive(rewards, group_size, target, num_shares):
    """Every group with its (share, round, position), sorted; each share takes spread groups first, then zero ones."""
    groups = []
    offset = 0
    for r, round_rewards in enumerate(rewards):
        grouped = round_rewards.view(-1, group_size).tolist()
        per_share = len(grouped) // num_shares
        for g, values in enumerate(grouped):
            mean = sum(values) / len(values)
            var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
            groups.append((g // per_share, r, g, offset + g, var**0.5 <= 1e-8))
        offset += len(grouped)
    kept, filled = [], 0
    quota = target // num_shares
    for share in range(num_shares):
        mine = sorted(x for x in groups if x[0] == share)
        spread = [x for x in mine if not x[4]][:quota]
        zero = [x for x in mine if x[4]][: quota - len(spread)]
        filled += len(zero)
        kept += [x[3] for x in sorted(spread + zero, key=lambda x: x[3])]
    zeros = sum(x[4] for x in groups)
    return kept, filled == 0, filled, zeros - filled


@pytest.mark.parametrize("seed", range(30))
def test_matches_a_naive_reference(seed):
    rng = random.Random(seed)
    group_size, num_shares = rng.choice([2, 3, 4]), rng.choice([1, 2, 4])
    target = num_shares * rng.randint(1, 3)
    rewards = []
    for _ in range(rng.randint(1, 4)):
        groups = [[float(rng.choice([0, 1]))] * group_size for _ in range(target)]
        for group in groups:  # some groups get spread
            if rng.random() < 0.4:
                group[rng.randrange(group_size)] += rng.choice([0.5, 1.0, 1e-12])
        rewards.append(torch.tensor([v for g in groups for v in g], dtype=torch.float64))
        assert tuple(select_groups(rewards, group_size, target, num_shares)) == naive(
            rewards, group_size, target, num_shares
        )


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of num_shares"):
        select_groups(rounds_of([[0, 1], [1, 0], [0, 0]]), 2, 3, num_shares=2)
    with pytest.raises(ValueError, match="needs 2"):
        select_groups(rounds_of([[0, 1]]), 2, 2)
