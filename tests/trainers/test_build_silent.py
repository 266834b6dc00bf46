"""No silent meaning changes on the command line: `rlhfkit grpo` weighs reward models and functions in
`trl grpo`'s order, PPO without a reward exits 2 instead of training on a random head, and an evaluation asked for
without its test split exits 2 instead of being skipped. Real parses and builds on the tiny built-in task."""

import inspect
import os

import pytest
from datasets import DatasetDict, load_from_disk

from rlhfkit.cli import main
from rlhfkit.config import GRPOConfig, PPOConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.trainers.build import build_grpo_trainer, build_ppo_trainer
from rlhfkit.trainers.grpo import GRPOTrainer


def grpo_flags(assets, tmp_path):
    return [
        "--model_name_or_path", str(assets / "sft"), "--dataset_name", str(assets / "prompts"), "--task", str(assets),
        "--output_dir", str(tmp_path / "run"), "--report_to", "none", "--max_steps", "1", "--num_generations", "2",
        "--per_device_train_batch_size", "4", "--max_completion_length", "4",
    ]  # fmt: skip


def ppo_flags(assets, tmp_path, reward: bool = True):
    flags = [
        "--model_name_or_path", str(assets / "tokenizer"), "--sft_model_path", str(assets / "sft"),
        "--dataset_name", str(assets / "prompts"), "--task", str(assets), "--output_dir", str(tmp_path / "run"),
        "--report_to", "none", "--total_episodes", "8", "--per_device_train_batch_size", "4",
        "--response_length", "4",
    ]  # fmt: skip
    return flags + (["--reward_model_path", str(assets / "reward")] if reward else [])


def weights_by_source(trainer) -> dict[str, float]:
    return dict(zip(trainer.rewards.names, trainer.rewards.weights, strict=True))


def test_trl_grpo_script_puts_the_reward_model_first():
    """What the order below mirrors: trl/scripts/grpo.py appends the reward model before the functions."""
    from trl.scripts import grpo

    source = inspect.getsource(grpo.main)
    assert source.index("reward_funcs.append(script_args.reward_model_name_or_path)") < source.index(
        "for func_name in script_args.reward_funcs"
    )


@pytest.mark.parametrize("model_flag", ["--reward_model_name_or_path", "--reward_model_path"])
def test_grpo_command_line_weighs_the_reward_model_first_as_trl_grpo(tiny_assets, tmp_path, model_flag):
    argv = [
        *grpo_flags(tiny_assets, tmp_path), model_flag, str(tiny_assets / "reward"),
        "--reward_funcs", "correctness", "--reward_weights", "1.0", "0.5",
    ]  # fmt: skip
    args, explicit = parse_config(GRPOConfig, argv, "rlhfkit grpo")
    trainer = build_grpo_trainer(args, explicit)
    assert trainer.rewards.names == ["reward", "correctness"]
    assert weights_by_source(trainer) == {"reward": 1.0, "correctness": 0.5}


def test_grpo_python_api_keeps_the_order_written(tiny_assets, tmp_path):
    args, _ = parse_config(
        GRPOConfig, [*grpo_flags(tiny_assets, tmp_path), "--reward_weights", "1.0", "0.5"], "rlhfkit grpo"
    )
    train = load_from_disk(str(tiny_assets / "prompts"))["train"].select(range(8))

    def correctness(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    trainer = GRPOTrainer(str(tiny_assets / "sft"), [correctness, str(tiny_assets / "reward")], args, train)
    assert weights_by_source(trainer) == {"correctness": 1.0, "reward": 0.5}
    assert trainer.rewards.names == ["correctness", "reward"]


def test_ppo_command_line_weighs_the_functions_then_the_reward_model(tiny_assets, tmp_path):
    argv = [*ppo_flags(tiny_assets, tmp_path), "--reward_funcs", "correctness", "--reward_weights", "1.0", "0.5"]
    args, explicit = parse_config(PPOConfig, argv, "rlhfkit ppo")
    trainer = build_ppo_trainer(args, explicit)
    assert weights_by_source(trainer) == {"correctness": 1.0, "reward": 0.5}
    assert trainer.rewards.names == ["correctness", "reward"]


def test_ppo_without_a_reward_exits_2_naming_the_flags(tiny_assets, tmp_path, capsys):
    code = main(["ppo", *ppo_flags(tiny_assets, tmp_path, reward=False)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--reward_model_path" in err and "--reward_funcs" in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "run")


@pytest.fixture(scope="module")
def train_only(tiny_assets, tmp_path_factory):
    """The built-in prompts without their test split (a train split and a 'valid' one)."""
    prompts = load_from_disk(str(tiny_assets / "prompts"))
    path = tmp_path_factory.mktemp("train_only") / "prompts"
    DatasetDict({"train": prompts["train"].select(range(16)), "valid": prompts["test"].select(range(4))}).save_to_disk(
        path
    )
    return str(path)


@pytest.mark.parametrize(
    "algorithm, flags, named",
    [
        ("ppo", ["--eval_strategy", "steps"], "--eval_strategy steps"),
        ("grpo", ["--eval_strategy", "epoch"], "--eval_strategy epoch"),
        ("ppo", ["--eval_on_start"], "--eval_on_start"),
        ("grpo", ["--num_sample_generations", "2"], "--num_sample_generations 2"),
        ("ppo", ["--dataset_test_split", "validation"], "--dataset_test_split validation"),
    ],
)
def test_an_evaluation_asked_for_without_its_split_exits_2(
    tiny_assets, tmp_path, train_only, capsys, algorithm, flags, named
):
    base = ppo_flags(tiny_assets, tmp_path) if algorithm == "ppo" else grpo_flags(tiny_assets, tmp_path)
    base[base.index("--dataset_name") + 1] = train_only
    code = main([algorithm, *base, *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    split = flags[1] if flags[0] == "--dataset_test_split" else "test"
    assert named in err and f"--dataset_test_split {split!r}" in err and "(splits: train, valid)" in err, err
    assert "Pass --dataset_test_split with one of valid" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "algorithm, flags",
    [("ppo", []), ("grpo", []), ("ppo", ["--num_sample_generations", "0", "--dataset_test_split", "validation"])],
)
def test_the_default_schedule_without_a_test_split_builds_without_evaluation(
    tiny_assets, tmp_path, train_only, algorithm, flags
):
    """The default num_sample_generations schedule evaluates only where a test split exists, as before."""
    config_cls, build = (PPOConfig, build_ppo_trainer) if algorithm == "ppo" else (GRPOConfig, build_grpo_trainer)
    base = ppo_flags(tiny_assets, tmp_path) if algorithm == "ppo" else grpo_flags(tiny_assets, tmp_path)
    base[base.index("--dataset_name") + 1] = train_only
    args, explicit = parse_config(config_cls, [*base, *flags], f"rlhfkit {algorithm}")
    assert args.num_sample_generations == (0 if flags else 10)
    assert build(args, explicit).eval_dataset is None
