"""Under --bf16 every forward after an optimizer step reads the new weights: autocast keeps low-precision copies
of the trained weights for as long as its outermost region lasts (the whole training loop), so they are dropped
after each step. Before, PPO's training forward read the first step's weights from update 2 on."""

import json
import os

import pytest
import torch

from rlhfkit.trainers.build import build_ppo_trainer
from tests.trainers.test_ppo import small_config


@pytest.mark.parametrize("cache_cleared", [True, False], ids=["as-shipped", "without-the-clear"])
def test_bf16_training_forward_agrees_with_the_sampler_after_updates(
    tiny_assets, tmp_path, monkeypatch, cache_cleared
):
    if not cache_cleared:  # the check below must see the bug it guards against
        monkeypatch.setattr(torch, "clear_autocast_cache", lambda: None)
    args = small_config(tiny_assets, tmp_path, bf16=True, learning_rate=3e-3, total_episodes=64, logging_steps=1,
                        num_sample_generations=0)  # fmt: skip
    build_ppo_trainer(args).train()
    with open(os.path.join(args.output_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if "episode" in line]
    gaps = [row["sampling/sampling_logp_difference/mean"] for row in rows]
    stale = max(gaps[1:]) > 0.02  # bf16's own rounding stays near 1e-3 nats/token
    assert stale != cache_cleared, gaps
