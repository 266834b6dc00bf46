"""A TRL script's parsers (transformers' HfArgumentParser, TRL's TrlParser) parse rlhfkit's configs: the same values
as rlhfkit's own command line, and rlhfkit's ConfigError for a bad value (rlhfkit/config/rules.py: the rule is no
metadata key, so argparse never sees it)."""

import argparse

import pytest
from transformers import HfArgumentParser
from trl import ModelConfig, ScriptArguments, TrlParser

from rlhfkit.config import ConfigError, GRPOConfig, PPOConfig
from rlhfkit.config.parse import parse_config

# TRL 1.12's ppo.py docstring command (trl/examples/scripts/ppo/ppo.py), its flags as written.
PPO_COMMAND = (
    "--dataset_name trl-internal-testing/descriptiveness-sentiment-trl-style --dataset_train_split descriptiveness "
    "--learning_rate 3e-6 --output_dir pythia-1b-deduped-descriptiveness-sentiment-trl-style-ppo "
    "--per_device_train_batch_size 64 --gradient_accumulation_steps 1 --total_episodes 10000 "
    "--model_name_or_path EleutherAI/pythia-1b-deduped --missing_eos_penalty 1.0"
).split()
PPO_TLDR_COMMAND = (
    "--dataset_name trl-internal-testing/tldr-preference-sft-trl-style --dataset_test_split validation "
    "--output_dir models/minimal/ppo_tldr --learning_rate 3e-6 --per_device_train_batch_size 16 "
    "--gradient_accumulation_steps 4 --total_episodes 1000000 --model_name_or_path EleutherAI/pythia-1b-deduped "
    "--sft_model_path cleanrl/EleutherAI_pythia-1b-deduped__sft__tldr "
    "--reward_model_path cleanrl/EleutherAI_pythia-1b-deduped__reward__tldr --local_rollout_forward_batch_size 16 "
    "--missing_eos_penalty 1.0 --stop_token eos --eval_strategy steps --eval_steps 100 --no_gradient_checkpointing"
).split()
# A `trl grpo` command line with its usual flags.
GRPO_COMMAND = (
    "--model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name trl-lib/DeepMath-103K "
    "--reward_funcs trl.rewards.accuracy_reward --reward_model_name_or_path my-org/reward --reward_weights 1.0 0.5 "
    "--num_generations 8 --per_device_train_batch_size 16 --max_completion_length 512 --learning_rate 1e-6 "
    "--beta 0.04 --loss_type dapo --bf16 true --use_peft --lora_r 32 --lora_target_modules q_proj v_proj "
    "--gradient_checkpointing --num_iterations 2 --scale_rewards batch --logging_steps 10 --report_to none "
    "--output_dir out --max_grad_norm 0.5 --dtype bfloat16 --epsilon_high 0.28 --lr_scheduler_kwargs "
).split() + ['{"num_cycles": 0.5}', "--lr_scheduler_type", "cosine"]

CASES = [(PPOConfig, PPO_COMMAND), (PPOConfig, PPO_TLDR_COMMAND), (GRPOConfig, GRPO_COMMAND)]


def _ours(cls, argv):
    config, _ = parse_config(cls, argv, "rlhfkit")
    return config.to_dict()


@pytest.mark.parametrize("cls, argv", CASES)
def test_hf_argument_parser_gives_rlhfkits_values(cls, argv):
    (config,) = HfArgumentParser((cls,)).parse_args_into_dataclasses(args=argv)
    assert isinstance(config, cls)
    assert config.to_dict() == _ours(cls, argv)


@pytest.mark.parametrize("cls, argv", CASES)
def test_trl_parser_gives_rlhfkits_values(cls, argv):
    (config,) = TrlParser((cls,)).parse_args_and_config(args=argv)
    assert config.to_dict() == _ours(cls, argv)


def test_the_values_are_the_commands():
    """The comparison above is not of two defaults: the flags reached the fields."""
    (ppo,) = HfArgumentParser(PPOConfig).parse_args_into_dataclasses(args=PPO_COMMAND)
    assert ppo.total_episodes == 10000 and ppo.missing_eos_penalty == 1.0
    assert ppo.dataset_train_split == "descriptiveness" and ppo.model_name_or_path == "EleutherAI/pythia-1b-deduped"
    (tldr,) = HfArgumentParser(PPOConfig).parse_args_into_dataclasses(args=PPO_TLDR_COMMAND)
    assert tldr.stop_token == "eos" and tldr.eval_steps == 100 and tldr.gradient_checkpointing is False
    (grpo,) = TrlParser(GRPOConfig).parse_args_and_config(args=GRPO_COMMAND)
    assert grpo.reward_model_path == ["my-org/reward"] and grpo.reward_weights == [1.0, 0.5]
    assert (grpo.beta, grpo.bf16, grpo.use_peft, grpo.lora_r) == (0.04, True, True, 32)
    assert grpo.lora_target_modules == ["q_proj", "v_proj"] and grpo.lr_scheduler_kwargs == {"num_cycles": 0.5}


def test_trl_parser_reads_a_config_file_as_rlhfkit_does(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text("learning_rate: 2.0e-6\nnum_generations: 4\nper_device_train_batch_size: 8\nuse_peft: true\n")
    (config,) = TrlParser(GRPOConfig).parse_args_and_config(args=["--config", str(path), "--beta", "0.1"])
    assert config.to_dict() == _ours(GRPOConfig, ["--config", str(path), "--beta", "0.1"])
    assert (config.learning_rate, config.num_generations, config.use_peft, config.beta) == (2e-6, 4, True, 0.1)


@pytest.mark.parametrize("parser", [HfArgumentParser, TrlParser])
def test_a_bad_value_is_rlhfkits_config_error_naming_the_field(parser):
    with pytest.raises(ConfigError, match=r"num_generations=1: must be an integer >= 2"):
        parser(GRPOConfig).parse_args_into_dataclasses(args=["--num_generations", "1"])
    with pytest.raises(ConfigError, match=r"kl_estimator='k2': must be one of k1, k3"):
        parser(PPOConfig).parse_args_into_dataclasses(args=["--kl_estimator", "k2"])


def test_trls_three_dataclass_tuple_conflicts_as_documented():
    """rlhfkit's configs hold ScriptArguments' and ModelConfig's fields themselves (TRL's never share a name), so the
    tuple of TRL's scripts is refused by argparse; docs/migrating-from-trl.md says so and gives the replacement."""
    with pytest.raises(argparse.ArgumentError, match="conflicting option string.*--dataset_name"):
        HfArgumentParser((ScriptArguments, PPOConfig, ModelConfig))
    (training_args,) = HfArgumentParser(PPOConfig).parse_args_into_dataclasses(args=PPO_COMMAND)
    script_args = model_args = training_args  # the replacement the page gives
    script_defaults, model_defaults = ScriptArguments(dataset_name="x"), ModelConfig()
    assert script_args.dataset_train_split == "descriptiveness" and model_args.model_name_or_path.endswith("deduped")
    shared = [name for name in vars(model_defaults) if hasattr(training_args, name)]
    assert {"model_name_or_path", "use_peft", "lora_r", "lora_alpha", "dtype", "model_revision"} <= set(shared)
    assert {n for n in vars(script_defaults) if hasattr(training_args, n)} >= {"dataset_name", "dataset_test_split"}
    with open("docs/migrating-from-trl.md", encoding="utf-8") as f:
        assert "script_args = model_args = training_args" in f.read()
