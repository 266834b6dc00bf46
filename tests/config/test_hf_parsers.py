"""A TRL script's parsers (transformers' HfArgumentParser, TRL's TrlParser) parse rlhfkit's configs: the same values
as rlhfkit's own command line, and rlhfkit's ConfigError for a bad value (rlhfkit/config/rules.py: the rule is no
metadata key, so argparse never sees it)."""

import dataclasses

import pytest
from transformers import HfArgumentParser
from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, TrlParser
from trl.scripts.grpo import GRPOScriptArguments

from rlhfkit.config import ConfigError, GRPOArguments, GRPOConfig, PPOArguments, PPOConfig
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

PPO_GROUPS = (ScriptArguments, PPOConfig, ModelConfig)  # TRL 1.12's ppo.py
GRPO_GROUPS = (GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig)  # TRL 1.16's trl/scripts/grpo.py
CASES = [(PPO_GROUPS, PPO_COMMAND), (PPO_GROUPS, PPO_TLDR_COMMAND), (GRPO_GROUPS, GRPO_COMMAND)]


def _ours(cls, argv):
    return parse_config(cls, argv, "rlhfkit")


def _same_values(groups, training_cls, argv):
    """TRL's dataclasses next to rlhfkit's config, parsed from one command line, against rlhfkit's own parse: the
    training config has every value of rlhfkit's; TRL's other groups hold the value of every flag written."""
    ours, written = _ours(training_cls, argv)
    training = next(g for g in groups if isinstance(g, training_cls))
    assert type(training) is training_cls  # TRL's field groups: training arguments only
    expected = {name: getattr(ours, name) for name in training.to_dict()}
    if getattr(groups[0], "reward_model_name_or_path", None):  # the script's reward model, added by rlhfkit's alias
        expected["reward_model_path"] = ours.reward_model_path[:-1] or None
    assert training.to_dict() == expected
    checked = set()
    for group in groups:
        if group is training or not dataclasses.is_dataclass(group):
            continue
        for name in written & {f.name for f in dataclasses.fields(group)}:
            if name == "reward_model_name_or_path":  # rlhfkit moves it into reward_model_path, after its entries
                assert ours.reward_model_path[-1] == group.reward_model_name_or_path
            else:
                assert getattr(group, name) == getattr(ours, name), name
            checked.add(name)
    return checked


@pytest.mark.parametrize("groups, argv", CASES)
def test_hf_argument_parser_over_trls_groups_gives_rlhfkits_values(groups, argv):
    """HfArgumentParser((ScriptArguments, PPOConfig, ModelConfig)), TRL's script and model dataclasses beside
    rlhfkit's config, as a TRL script builds it, gives the values rlhfkit's own parser gives."""
    training_cls = groups[1]
    parsed = HfArgumentParser(groups).parse_args_into_dataclasses(args=argv)
    checked = _same_values(parsed, training_cls, argv)
    assert {"dataset_name", "model_name_or_path"} <= checked  # the groups' flags were compared, not skipped


@pytest.mark.parametrize("groups, argv", CASES)
def test_trl_parser_over_trls_groups_gives_rlhfkits_values(groups, argv):
    training_cls = groups[1]
    parsed = TrlParser(groups).parse_args_and_config(args=argv)
    assert _same_values(parsed, training_cls, argv)


@pytest.mark.parametrize("cls, argv", [(PPOArguments, PPO_COMMAND), (GRPOArguments, GRPO_COMMAND)])
def test_one_parser_over_rlhfkits_full_arguments_gives_rlhfkits_values(cls, argv):
    """PPOArguments / GRPOArguments: every group in one dataclass, as rlhfkit's command line reads them."""
    (config,) = HfArgumentParser(cls).parse_args_into_dataclasses(args=argv)
    assert config.to_dict() == _ours(cls, argv)[0].to_dict()
    (config,) = TrlParser(cls).parse_args_and_config(args=argv)
    assert config.to_dict() == _ours(cls, argv)[0].to_dict()


def test_the_values_are_the_commands():
    """The comparison above is not of two defaults: the flags reached the fields."""
    script, ppo, model = HfArgumentParser(PPO_GROUPS).parse_args_into_dataclasses(args=PPO_COMMAND)
    assert ppo.total_episodes == 10000 and ppo.missing_eos_penalty == 1.0
    assert (
        script.dataset_train_split == "descriptiveness" and model.model_name_or_path == "EleutherAI/pythia-1b-deduped"
    )
    _, tldr, _ = HfArgumentParser(PPO_GROUPS).parse_args_into_dataclasses(args=PPO_TLDR_COMMAND)
    assert tldr.stop_token == "eos" and tldr.eval_steps == 100 and tldr.gradient_checkpointing is False
    script, grpo, model, _ = TrlParser(GRPO_GROUPS).parse_args_and_config(args=GRPO_COMMAND)
    assert script.reward_model_name_or_path == "my-org/reward" and grpo.reward_weights == [1.0, 0.5]
    assert (grpo.beta, grpo.bf16, model.use_peft, model.lora_r) == (0.04, True, True, 32)
    assert model.lora_target_modules == ["q_proj", "v_proj"] and grpo.lr_scheduler_kwargs == {"num_cycles": 0.5}
    ours, _ = _ours(GRPOConfig, GRPO_COMMAND)
    assert ours.reward_model_path == ["my-org/reward"] and ours.reward_funcs == ["trl.rewards.accuracy_reward"]


def test_trl_parser_reads_a_config_file_as_rlhfkit_does(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text("learning_rate: 2.0e-6\nnum_generations: 4\nper_device_train_batch_size: 8\nuse_peft: true\n")
    argv = ["--config", str(path), "--beta", "0.1"]
    _, config, model, _ = TrlParser(GRPO_GROUPS).parse_args_and_config(args=argv)
    ours, _ = _ours(GRPOConfig, argv)
    assert config.to_dict() == {name: getattr(ours, name) for name in config.to_dict()}
    assert (config.learning_rate, config.num_generations, model.use_peft, config.beta) == (2e-6, 4, True, 0.1)
    assert ours.use_peft is True


def test_a_training_config_given_a_script_or_model_field_is_the_full_arguments():
    """rlhfkit's one-config Python use: PPOConfig(model_name_or_path=...) is a PPOArguments (a PPOConfig); with
    training fields only it stays a PPOConfig, what TRL's parsers build."""
    full = PPOConfig(model_name_or_path="m", dataset_name="d", use_peft=True, learning_rate=1e-5)
    assert type(full) is PPOArguments and isinstance(full, PPOConfig)
    assert (full.model_name_or_path, full.dataset_name, full.use_peft, full.learning_rate) == ("m", "d", True, 1e-5)
    assert type(PPOConfig(learning_rate=1e-5)) is PPOConfig
    assert type(GRPOConfig(reward_funcs=["f"])) is GRPOArguments
    assert {f.name for f in dataclasses.fields(PPOConfig)}.isdisjoint(
        {f.name for f in dataclasses.fields(ScriptArguments)} | {f.name for f in dataclasses.fields(ModelConfig)}
    )
    with pytest.raises(TypeError, match="use_pef.*Did you mean 'use_peft'"):
        PPOConfig(use_pef=True)


@pytest.mark.parametrize("parser", [HfArgumentParser, TrlParser])
def test_a_bad_value_is_rlhfkits_config_error_naming_the_field(parser):
    with pytest.raises(ConfigError, match=r"num_generations=1: must be an integer >= 2"):
        parser(GRPOConfig).parse_args_into_dataclasses(args=["--num_generations", "1"])
    with pytest.raises(ConfigError, match=r"kl_estimator='k2': must be one of k1, k3"):
        parser(PPOConfig).parse_args_into_dataclasses(args=["--kl_estimator", "k2"])
