"""--logging_steps / --eval_steps / --save_steps below 1 are a share of the run's steps (as transformers reads them),
and PPO's --max_steps counts PPO updates."""

import math

import pytest

from rlhfkit.config import ConfigError, GRPOConfig, PPOConfig, ppo_batch_sizes
from rlhfkit.config.parse import parse_config
from rlhfkit.trainers.schedule import Schedule, interval


def test_a_share_is_ceil_of_share_times_steps_as_in_transformers():
    assert interval(0.1, 95) == 10 == math.ceil(0.1 * 95)
    assert interval(0.25, 10) == 3 and interval(0.5, 1) == 1
    assert interval(10, 95) == 10 and interval(0, 95) == 0


def test_the_schedule_reads_shares_of_its_run():
    args = GRPOConfig(
        logging_steps=0.25, save_steps=0.5, eval_strategy="steps", eval_steps=0.1, num_sample_generations=0
    )
    schedule = Schedule(args, num_steps=20)
    assert [s for s in range(1, 21) if schedule.is_log_step(s)] == [5, 10, 15, 20]
    assert [s for s in range(1, 21) if schedule.is_save_step(s)] == [10]  # the last step's is saved at the end
    assert [s for s in range(1, 21) if schedule.is_eval_step(s)] == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    counts = Schedule(PPOConfig(logging_steps=3, save_steps=0), num_steps=7)
    assert [s for s in range(1, 8) if counts.is_log_step(s)] == [3, 6]  # step 7's window: the summary row
    assert not any(counts.is_save_step(s) for s in range(1, 8))


def test_the_flags_take_a_count_or_a_share():
    config, _ = parse_config(PPOConfig, ["--logging_steps", "0.05", "--save_steps", "100", "--eval_steps", "0.2"], "x")
    assert (config.logging_steps, config.save_steps, config.eval_steps) == (0.05, 100, 0.2)
    assert isinstance(config.save_steps, int)  # a whole number stays a count
    assert GRPOConfig(logging_steps=10.0).logging_steps == 10 and isinstance(GRPOConfig().logging_steps, int)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"logging_steps": 1.5}, "logging_steps=1.5: must be an integer >= 1, or a number in (0, 1)"),
        ({"logging_steps": 0}, "logging_steps=0: must be an integer >= 1, or a number in (0, 1)"),
        ({"eval_steps": -0.5}, "eval_steps=-0.5: must be an integer >= 1, or a number in (0, 1)"),
        ({"save_steps": math.nan}, "save_steps=nan: must be an integer >= 0, or a number in (0, 1)"),
        ({"save_steps": True}, "save_steps=True: must be an integer >= 0"),
    ],
)
def test_other_values_are_refused(kwargs, message):
    with pytest.raises(ConfigError) as info:
        GRPOConfig(**kwargs)
    assert message in str(info.value)


def test_ppo_max_steps_counts_ppo_updates():
    args = PPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=7)
    sizes = ppo_batch_sizes(args, world_size=2, dataset_size=10)
    assert sizes.num_total_batches == 7 and sizes.batch_size == 16  # 7 updates of 16 rollouts: 112 episodes
    default = ppo_batch_sizes(PPOConfig(per_device_train_batch_size=4), world_size=1, dataset_size=10)
    assert default.num_total_batches == 8  # ceil(3 epochs x 10 / 4)
    config, explicit = parse_config(PPOConfig, ["--max_steps", "5"], "rlhfkit ppo")
    assert config.max_steps == 5 and "max_steps" in explicit


def test_ppo_max_steps_and_total_episodes_together_are_refused():
    with pytest.raises(ConfigError, match=r"max_steps=5 and total_episodes=100: .* Pass only one of --max_steps"):
        PPOConfig(max_steps=5, total_episodes=100)
    with pytest.raises(ConfigError, match="max_steps=0: must be an integer >= 1, or -1"):
        PPOConfig(max_steps=0)
