"""Shared trainer pieces: the learning-rate schedule and the sample schedule."""

import pytest

from rlhfkit.config import GRPOConfig, warmup_steps
from rlhfkit.trainers.common import is_sample_step, linear_lr, sample_every


def test_linear_decay_without_warmup():
    # lr of step s (1-based) of N: base * (N - s + 1) / N, so the last step still learns and the next would be 0.
    assert [linear_lr(1.0, s, 4) for s in range(1, 5)] == [1.0, 0.75, 0.5, 0.25]


def test_warmup_then_decay():
    assert [linear_lr(1.0, s, 5, warmup=2) for s in range(1, 6)] == pytest.approx([0.5, 1.0, 1.0, 2 / 3, 1 / 3])


def test_warmup_steps_from_ratio_or_count():
    assert warmup_steps(GRPOConfig(warmup_ratio=0.1), 100) == 10
    assert warmup_steps(GRPOConfig(warmup_ratio=0.1, warmup_steps=3), 100) == 3
    assert warmup_steps(GRPOConfig(warmup_ratio=0.5), 1) == 0  # a one-step run has no room to warm up


def test_sample_schedule():
    every = sample_every(25, 10)
    assert every == 2 and [s for s in range(1, 26) if is_sample_step(s, 25, every)][-2:] == [24, 25]
    assert sample_every(25, 0) == 0 and not is_sample_step(5, 25, 0)
