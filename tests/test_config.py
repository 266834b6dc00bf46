import pytest

from rlhfkit.config import ConfigError, PPOConfig, ppo_batch_sizes


def test_batch_sizes_follow_trl_algebra():
    args = PPOConfig(
        per_device_train_batch_size=16, gradient_accumulation_steps=4, num_mini_batches=2, total_episodes=1000
    )
    sizes = ppo_batch_sizes(args, world_size=2, dataset_size=10)
    assert sizes.local_batch_size == 64  # 16 x 4 per device
    assert sizes.batch_size == 128  # x 2 devices
    assert sizes.local_mini_batch_size == 32  # 64 / 2 mini-batches
    assert sizes.micro_batches_per_mini_batch == 2  # 32 / 16
    assert sizes.num_total_batches == 8  # ceil(1000 / 128)


def test_total_episodes_defaults_to_epochs_times_dataset():
    args = PPOConfig(per_device_train_batch_size=4, num_train_epochs=2)
    assert ppo_batch_sizes(args, 1, dataset_size=10).num_total_batches == 5  # ceil(20 / 4)


def test_non_dividing_batch_sizes_name_the_flags():
    args = PPOConfig(
        per_device_train_batch_size=6, gradient_accumulation_steps=1, num_mini_batches=4, total_episodes=10
    )
    with pytest.raises(ConfigError, match="num_mini_batches"):
        ppo_batch_sizes(args, 1, 10)
    args = PPOConfig(
        per_device_train_batch_size=8, gradient_accumulation_steps=3, num_mini_batches=2, total_episodes=10
    )
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
        ppo_batch_sizes(args, 1, 10)


def test_older_trl_api_aliases():
    args = PPOConfig(model_name="some/dir", log_with="wandb", project_kwargs={"logging_dir": "/tmp/tb"})
    assert args.model_name_or_path == "some/dir"
    assert args.report_to == ["wandb"]
    assert args.logging_dir == "/tmp/tb"
    assert PPOConfig(report_to="tensorboard").report_to == ["tensorboard"]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"kl_estimator": "k2"}, "kl_estimator"),
        ({"stop_token": "eot"}, "stop_token"),
        ({"temperature": 0.0}, "temperature"),
        ({"num_ppo_epochs": 0}, "num_ppo_epochs"),
    ],
)
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        PPOConfig(**kwargs)
