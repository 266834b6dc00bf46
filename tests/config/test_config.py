import math
from dataclasses import fields
from pathlib import Path

import pytest

from rlhfkit.config import GRPOConfig, PPOConfig, ppo_batch_sizes
from rlhfkit.config.rules import Rule, field_rule
from rlhfkit.data import PROMPT_OVERFLOW
from rlhfkit.errors import ConfigError
from rlhfkit.health.rules import HEALTH_MODES
from rlhfkit.ops.advantages import GROUP_SCALES
from rlhfkit.ops.kl import KL_ESTIMATORS
from rlhfkit.ops.losses import LOSS_TYPES


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


def test_non_dividing_batch_sizes_fail_when_the_config_is_made():
    with pytest.raises(ConfigError, match="gradient_accumulation_steps must be a multiple of num_mini_batches"):
        PPOConfig(per_device_train_batch_size=6, gradient_accumulation_steps=1, num_mini_batches=4)
    # 8 x 3 = 24 splits into 2 mini-batches of 12, but 12 is no whole number of micro-batches of 8.
    with pytest.raises(ConfigError, match=r"--gradient_accumulation_steps 2, or --num_mini_batches 1\."):
        PPOConfig(per_device_train_batch_size=8, gradient_accumulation_steps=3, num_mini_batches=2)
    args = PPOConfig()
    args.num_mini_batches = 3  # changed after the checks: ppo_batch_sizes still refuses it
    with pytest.raises(ConfigError, match="num_mini_batches"):
        ppo_batch_sizes(args, 1, 10)


def test_older_trl_api_aliases():
    args = PPOConfig(model_name="some/dir", log_with="wandb", project_kwargs={"logging_dir": "/tmp/tb"})
    assert args.model_name_or_path == "some/dir"
    assert args.report_to == ["wandb"]
    assert args.logging_dir == "/tmp/tb"
    assert PPOConfig(report_to="tensorboard").report_to == ["tensorboard"]


@pytest.mark.parametrize(
    "cls, kwargs, message",
    [
        (PPOConfig, {"learning_rate": math.nan}, "learning_rate=nan: must be a finite number > 0. Pass e.g. "
         "--learning_rate 3e-06."),
        (GRPOConfig, {"learning_rate": -1e-5}, "learning_rate=-1e-05: must be a finite number > 0."),
        (PPOConfig, {"cliprange": -1}, "cliprange=-1: must be a finite number > 0."),
        (PPOConfig, {"cliprange_value": 0.0}, "cliprange_value=0.0: must be a finite number > 0."),
        (PPOConfig, {"gamma": 2}, "gamma=2: must be a number in [0, 1]."),
        (PPOConfig, {"lam": math.nan}, "lam=nan: must be a number in [0, 1]."),
        (PPOConfig, {"num_train_epochs": 0}, "num_train_epochs=0: must be a finite number > 0."),
        (GRPOConfig, {"num_train_epochs": math.inf}, "num_train_epochs=inf: must be a finite number > 0."),
        (PPOConfig, {"save_steps": -1}, "save_steps=-1: must be an integer >= 0, or a number in (0, 1) for that share of the run's steps."),
        (PPOConfig, {"logging_steps": 0}, "logging_steps=0: must be an integer >= 1, or a number in (0, 1) for that share of the run's steps."),
        (PPOConfig, {"weight_decay": math.nan}, "weight_decay=nan: must be a finite number >= 0."),
        (PPOConfig, {"adam_epsilon": 0}, "adam_epsilon=0: must be a finite number > 0."),
        (PPOConfig, {"max_grad_norm": -1}, "max_grad_norm=-1: must be a finite number >= 0. Pass e.g. "
         "--max_grad_norm 1.0, or leave it out."),
        (PPOConfig, {"penalty_reward_value": math.inf}, "penalty_reward_value=inf: must be a finite number."),
        (PPOConfig, {"missing_eos_penalty": -1.0}, "missing_eos_penalty=-1.0: must be a finite number >= 0."),
        (PPOConfig, {"kl_coef": -0.1}, "kl_coef=-0.1: must be a finite number >= 0."),
        (PPOConfig, {"kl_target": 0}, "kl_target=0: must be a finite number > 0."),
        (PPOConfig, {"kl_horizon": 0}, "kl_horizon=0: must be an integer >= 1."),
        (PPOConfig, {"stop_token_id": -5}, "stop_token_id=-5: must be an integer >= 0"),
        (PPOConfig, {"total_episodes": 0}, "total_episodes=0: must be an integer >= 1."),
        (PPOConfig, {"save_total_limit": 0}, "save_total_limit=0: must be an integer >= 1."),
        (PPOConfig, {"warmup_ratio": math.nan}, "warmup_ratio=nan: must be a number in [0, 1)."),
        (PPOConfig, {"warmup_ratio": 1.0}, "warmup_ratio=1.0: must be a number in [0, 1)."),
        (PPOConfig, {"seed": -1}, "seed=-1: must be an integer in [0, 2147483647]."),
        (PPOConfig, {"temperature": 0.0}, "temperature=0.0: must be a finite number > 0."),
        (PPOConfig, {"num_ppo_epochs": 2.5}, "num_ppo_epochs=2.5: must be an integer >= 1."),
        (PPOConfig, {"num_ppo_epochs": 4.0}, "num_ppo_epochs=4.0: must be an integer >= 1."),  # a YAML float
        (PPOConfig, {"num_ppo_epochs": True}, "num_ppo_epochs=True: must be an integer >= 1."),
        (PPOConfig, {"kl_estimator": "k2"}, "kl_estimator='k2': must be one of k1, k3."),
        (PPOConfig, {"stop_token": "eot"}, "stop_token='eot': must be one of eos."),
        (PPOConfig, {"health": "loud"}, "health='loud': must be one of off, warn, stop."),
        (PPOConfig, {"prompt_overflow": "cut"}, "prompt_overflow='cut': must be one of drop, truncate."),
        (PPOConfig, {"report_to": ["neptune"]}, "report_to=['neptune']: 'neptune' is not a tracker"),
        (PPOConfig, {"report_to": "none,wandb"}, "'none' cannot be combined with trackers"),
        (PPOConfig, {"health_thresholds": "kl_ref_max=1"}, "unknown health threshold(s) kl_ref_max"),
        (PPOConfig, {"output_dir": ""}, "output_dir='': must be a path."),
        (PPOConfig, {"fp16": True, "bf16": True}, "fp16=True and bf16=True: choose one precision."),
        (GRPOConfig, {"top_p": 1.5}, "top_p=1.5: must be a number in (0, 1]."),
        (GRPOConfig, {"top_k": -1}, "top_k=-1: must be an integer >= 0."),
        (GRPOConfig, {"num_generations": 1}, "num_generations=1: must be an integer >= 2 (group-relative"),
        (GRPOConfig, {"max_steps": 0}, "max_steps=0: must be an integer >= 1, or -1."),
        (GRPOConfig, {"beta": -0.04}, "beta=-0.04: must be a finite number >= 0."),
        (GRPOConfig, {"epsilon_high": math.nan}, "epsilon_high=nan: must be a finite number >= 0."),
        (GRPOConfig, {"num_completions_to_print": -1}, "num_completions_to_print=-1: must be an integer >= 0."),
        (GRPOConfig, {"loss_type": "ppo"}, "loss_type='ppo': must be one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo."),
        (GRPOConfig, {"scale_rewards": "std"}, "scale_rewards='std': must be one of group, batch, none."),
        (GRPOConfig, {"reward_weights": [1.0, math.inf]}, "reward_weights=[1.0, inf]: entry 1 (inf) must be a finite"),
        (GRPOConfig, {"reward_funcs": ["a", "b"], "reward_weights": [1.0]}, "needs one weight per reward"),
        (PPOConfig, {"eval_steps": 0}, "eval_steps=0: must be an integer >= 1, or a number in (0, 1) for that share of the run's steps. "
         "Pass e.g. --eval_steps 100, or leave "
         "it out."),
        (GRPOConfig, {"logging_strategy": "never"}, "logging_strategy='never': must be one of steps, epoch, no."),
        (GRPOConfig, {"eval_strategy": "best"}, "eval_strategy='best': must be one of no, steps, epoch."),
        (PPOConfig, {"lr_scheduler_kwargs": "{min_lr_rate: 0.1}"}, "lr_scheduler_kwargs='{min_lr_rate: 0.1}': must be "
         "a JSON object, e.g. '{\"key\": value}' (it is not JSON"),
        (PPOConfig, {"lr_scheduler_kwargs": "[0.1]"}, "lr_scheduler_kwargs='[0.1]': must be a JSON object"),
        (PPOConfig, {"adam_beta2": 1.0}, "adam_beta2=1.0: must be a number in [0, 1)."),
        (GRPOConfig, {"warmup_steps": -1}, "warmup_steps=-1: must be a finite number >= 0."),
        (GRPOConfig, {"dataset_num_proc": 0}, "dataset_num_proc=0: must be an integer >= 1."),
    ],
)  # fmt: skip
def test_bad_values_are_refused_with_field_value_range_and_fix(cls, kwargs, message):
    with pytest.raises(ConfigError) as info:
        cls(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (PPOConfig, {"save_steps": 0, "seed": 0, "gamma": 0.0, "lam": 1.0, "missing_eos_penalty": 0.0}),
        (PPOConfig, {"output_dir": Path("runs/x"), "report_to": "wandb,tensorboard", "learning_rate": 1}),
        (PPOConfig, {"report_to": None, "warmup_ratio": 0.0, "max_grad_norm": None, "stop_token": "eos"}),
        (GRPOConfig, {"max_steps": -1, "top_p": 1.0, "epsilon": 0.0, "num_completions_to_print": None}),
        (GRPOConfig, {"reward_funcs": ["a"], "reward_model_path": ["rm"], "reward_weights": [1.0, -0.5]}),
        (GRPOConfig, {"warmup_steps": 0.5, "lr_scheduler_type": "cosine", "lr_scheduler_kwargs": '{"num_cycles": 1}'}),
        (PPOConfig, {"optim": "adafactor", "save_strategy": "no", "eval_strategy": "epoch", "adam_beta1": 0.0}),
    ],
)
def test_values_at_the_edges_of_their_rules_are_accepted(cls, kwargs):
    cls(**kwargs)


def test_every_field_has_a_rule_shown_in_help_where_it_says_more_than_the_type():
    for cls in (PPOConfig, GRPOConfig):
        for f in fields(cls):
            rule = field_rule(f)
            assert isinstance(rule, Rule), f.name
            assert (f"Valid: {rule.text}." in f.metadata["help"]) == rule.in_help, f.name


def test_allowed_values_come_from_the_modules_that_implement_them():
    rules = {f.name: field_rule(f) for f in fields(GRPOConfig)}
    assert rules["loss_type"].values is LOSS_TYPES and rules["scale_rewards"].values is GROUP_SCALES
    assert rules["health"].values is HEALTH_MODES and rules["prompt_overflow"].values is PROMPT_OVERFLOW
    kl = field_rule(next(f for f in fields(PPOConfig) if f.name == "kl_estimator"))
    assert set(kl.values) == {"k1", "k3"} < set(KL_ESTIMATORS)


def test_max_grad_norm_0_turns_clipping_off_as_in_transformers():
    assert GRPOConfig(max_grad_norm=0).max_grad_norm is None and GRPOConfig().max_grad_norm == 1.0


def test_epsilon_high_defaults_to_epsilon_and_scale_rewards_takes_true_false():
    assert GRPOConfig(epsilon=0.3).epsilon_high == 0.3
    assert GRPOConfig(scale_rewards=True).scale_rewards == "group"
    assert GRPOConfig(scale_rewards="false").scale_rewards == "none"


def test_dict_flags_take_json_on_the_command_line_as_in_python():
    """--project_kwargs '{"logging_dir": "x"}' does on the command line what project_kwargs={...} does in Python."""
    from rlhfkit.config.parse import parse_config

    args, _ = parse_config(PPOConfig, ["--project_kwargs", '{"logging_dir": "tb"}'], "rlhfkit ppo")
    assert args.project_kwargs == {"logging_dir": "tb"} and args.logging_dir == "tb"
    assert PPOConfig(project_kwargs={"logging_dir": "tb"}).logging_dir == "tb"
