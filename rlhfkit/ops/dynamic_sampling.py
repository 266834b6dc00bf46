"""DAPO's dynamic sampling (Yu et al. 2025, section 3.2): which groups of successive generation rounds to train on.

A group whose G rewards have no spread gets advantage 0 for every completion and adds no policy gradient. Dynamic
sampling leaves such groups out and generates further rounds of prompts until the batch holds enough groups with
spread (or a cap on the rounds is reached, when the trainer calls :func:`select_groups` for the last time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor


def zero_std_groups(rewards: Tensor, group_size: int) -> Tensor:
    """(B / G,) bool: True for the groups whose rewards have no spread (unbiased std within 1e-8 of 0, torch.isclose's
    default tolerance). rewards: (B,) with the G completions of a group contiguous. The test behind GRPO's
    frac_reward_zero_std and dynamic sampling's choice, so the two agree. A group with a NaN reward counts as spread."""
    std = rewards.reshape(-1, group_size).std(dim=1)
    return torch.isclose(std, torch.zeros_like(std))


class GroupSelection(NamedTuple):
    """The groups of the rounds so far that make the batch (:func:`select_groups`)."""

    kept: list[int]  # indices into the rounds' groups concatenated; share by share, generation order within a share
    enough: bool  # every share holds its quota of groups with spread: no further round is needed
    filled: int  # slots taken by zero-spread groups because a share found too few with spread (0 when enough)
    zero_std_dropped: int  # zero-spread groups generated and left out


def select_groups(rewards: Sequence[Tensor], group_size: int, target: int, num_shares: int = 1) -> GroupSelection:
    """Dynamic sampling's choice of `target` groups among the generation rounds so far.

    rewards: one (B_r,) tensor per round, in generation order: every process's rewards of the round (gathered), the
    G = `group_size` completions of a group contiguous. Each round's groups split into `num_shares` contiguous equal
    shares (the processes) and the batch into as many quotas of target / num_shares groups: share s of the batch is
    made of share s of the rounds, so no completion moves between processes.
    Each share keeps its first quota groups with spread (:func:`zero_std_groups` False) in generation order (round,
    then group); surplus ones are dropped. A share with fewer fills its remaining slots with its first zero-spread
    groups, so the batch is always full (they add no gradient); `enough` says whether any slot had to be filled.
    Returns the kept indices into the rounds' groups concatenated (round r's group g is sum_{q<r} B_q / G + g),
    share by share, each share's in generation order: the batch's groups in order.
    """
    if target < 1 or num_shares < 1 or target % num_shares:
        raise ValueError(f"target {target} must be a positive multiple of num_shares {num_shares}")
    quota = target // num_shares
    kept: list[int] = []
    enough, filled, zero_total = True, 0, 0
    spread_by_share: list[list[int]] = [[] for _ in range(num_shares)]
    zero_by_share: list[list[int]] = [[] for _ in range(num_shares)]
    offset = 0
    for round_rewards in rewards:
        zero = zero_std_groups(round_rewards, group_size).tolist()
        if len(zero) % num_shares:
            raise ValueError(f"a round of {len(zero)} groups does not split into {num_shares} equal shares")
        per_share = len(zero) // num_shares
        for g, is_zero in enumerate(zero):
            (zero_by_share if is_zero else spread_by_share)[g // per_share].append(offset + g)
        zero_total += sum(zero)
        offset += len(zero)
    for spread, zero in zip(spread_by_share, zero_by_share, strict=True):
        if len(spread) + len(zero) < quota:
            raise ValueError(f"the rounds hold {len(spread) + len(zero)} groups of a share; it needs {quota}")
        share = spread[:quota]
        missing = quota - len(share)
        if missing:
            enough, filled = False, filled + missing
            share = sorted(share + zero[:missing])
        kept.extend(share)
    return GroupSelection(kept, enough, filled, zero_total - filled)
