"""--reward_weights follow the order in which each trainer weighs its rewards: `trl grpo`'s (reward models first, then
the functions) for GRPO, functions then the reward model for PPO; a count that does not match names them in it."""

import pytest

from rlhfkit.config import ConfigError, GRPOConfig, PPOConfig
from rlhfkit.config.parse import parse_config


def test_grpo_weighs_the_reward_models_first_as_trl_grpo():
    argv = ["--reward_model_name_or_path", "X", "--reward_funcs", "f", "--reward_weights", "1.0", "0.5"]
    config, _ = parse_config(GRPOConfig, argv, "rlhfkit grpo")
    assert config.weighted_rewards() == ["X", "f"] and config.reward_weights == [1.0, 0.5]  # X gets 1.0
    both = GRPOConfig(reward_model_path=["A"], reward_model_name_or_path="B", reward_funcs=["f", "g"])
    assert both.weighted_rewards() == ["A", "B", "f", "g"]
    with pytest.raises(
        ConfigError, match=r"in the order reward_model_path, then reward_funcs \(as trl grpo\) \(X, f\)"
    ):
        GRPOConfig(reward_model_name_or_path="X", reward_funcs=["f"], reward_weights=[1.0])


def test_ppo_weighs_the_functions_then_the_reward_model():
    assert PPOConfig(reward_model_path="R", reward_funcs=["f"]).weighted_rewards() == ["f", "R"]
    with pytest.raises(ConfigError, match=r"in the order reward_funcs, then reward_model_path \(f, R\)"):
        PPOConfig(reward_model_path="R", reward_funcs=["f"], reward_weights=[1.0, 2.0, 3.0])
