"""TRL's flags that rlhfkit does not take (rlhfkit/config/trl_flags.py): every one is accepted at TRL's default and
refused at another value with its reason, never as an unknown flag, and docs/trl-flags.md lists them."""

import os
from dataclasses import fields

import pytest

from rlhfkit.cli import main
from rlhfkit.config import (
    GRPOArguments,
    GRPOConfig,
    PPOArguments,
    PPOConfig,
    config_field_names,
    trl_flags,
    trl_flags_docs,
)
from rlhfkit.config.parse import _parser, parse_config
from rlhfkit.config.trl_recorded import TRL_GRPO_CONFIG_FIELDS
from rlhfkit.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = {"ppo": PPOArguments, "grpo": GRPOArguments}  # every flag of each command


def test_docs_are_generated_from_the_module():
    with open(os.path.join(ROOT, "docs", "trl-flags.md"), encoding="utf-8") as f:
        assert f.read() == trl_flags_docs.render_markdown(), "docs/trl-flags.md is stale: run `make docs`"


def test_grpo_docs_hold_every_trl_grpo_config_field():
    with open(os.path.join(ROOT, "docs", "algorithms", "grpo.md"), encoding="utf-8") as f:
        text = f.read()
    table = trl_flags_docs.render_grpo_config_table()
    assert table in text, "docs/algorithms/grpo.md is stale: run `make docs`"
    assert all(f"`{name}`" in table for name in TRL_GRPO_CONFIG_FIELDS)


@pytest.mark.parametrize("command", trl_flags.COMMANDS)
def test_every_trl_flag_is_taken_or_has_a_reason(command):
    taken = set(config_field_names(CONFIGS[command]))
    flags = trl_flags.trl_flags(command)
    assert {"learning_rate", "push_to_hub", "lr_scheduler_type"} <= set(flags)  # transformers' flags are read
    assert set(trl_flags.TRL_FLAGS[command]) <= set(flags)
    for name in flags:
        assert name in taken or trl_flags.group_of(name) is not trl_flags.FALLBACK, name


def test_every_listed_flag_is_a_trl_flag_that_some_command_refuses():
    everything = {name for command in trl_flags.COMMANDS for name in trl_flags.trl_flags(command)}
    refused = {
        name for command, cls in CONFIGS.items() for name in trl_flags.not_taken(command, set(config_field_names(cls)))
    }
    listed = [name for group in trl_flags.GROUPS for name in group.names]
    assert len(listed) == len(set(listed))  # one reason per flag
    for name in listed:
        assert name in everything and name in refused, name


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["ppo", "--hub_strategy", "checkpoint"], "--hub_strategy is a TRL/transformers flag that rlhfkit does not "
         "support: rlhfkit uploads output_dir once, when training has ended (--push_to_hub"),
        (["grpo", "--use_vllm", "true"], "--use_vllm is a TRL/transformers flag that rlhfkit does not support:"),
        (["ppo", "--model-adapter-name", "policy"], "--model_adapter_name is a TRL/transformers flag that rlhfkit "
         "does not support: with --use_peft rlhfkit creates one LoRA adapter"),
        (["grpo", "--use_transformers_paged", "true"], "--use_transformers_paged is a TRL/transformers flag "
         "that rlhfkit does not support: rlhfkit samples with its own KV-cache decoder"),
        (["ppo", "--no_remove_unused_columns"], "--remove_unused_columns is a TRL/transformers flag"),
        (["ppo", "--ddp_backend", "gloo"], "--ddp_backend is a TRL/transformers flag that rlhfkit does not support: "
         "devices, processes and sharding come from accelerate"),
    ],
)  # fmt: skip
def test_a_trl_flag_exits_2_with_its_reason(capsys, tmp_path, argv, needle):
    out = tmp_path / "run"
    code = main([*argv, "--output_dir", str(out), "--learning_rate", "1e-5"])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "See docs/trl-flags.md." in err, err
    assert "unknown" not in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("command", trl_flags.COMMANDS)
def test_every_refused_flag_is_accepted_at_trls_default_from_python_and_the_command_line(command, capsys):
    cls = CONFIGS[command]
    refused = trl_flags.not_taken(command, set(config_field_names(cls)))
    cls(**{name: trl_flags.trl_default(command, name) for name in refused})  # all at once
    argv = []
    for name in refused:  # TRL's default as its command line spells it; a default of None is the flag left out
        default = trl_flags.trl_default(command, name)
        if isinstance(default, (bool, int, float, str)) and default != "":
            argv += [f"--{name}", str(default)]
    assert len(argv) > 40
    config, explicit = parse_config(cls, [*argv, "--learning_rate", "2e-6"], "x")
    assert config.learning_rate == 2e-6 and explicit == {"learning_rate"}
    assert capsys.readouterr().err == ""  # not even the ignored flags' notes: the defaults ask for nothing


def test_is_default_reads_values_as_trl_does():
    assert trl_flags.is_default("grpo", "use_vllm", False) and not trl_flags.is_default("grpo", "use_vllm", 0)
    assert trl_flags.is_default("grpo", "vllm_server_timeout", 240) and trl_flags.is_default("ppo", "debug", [])
    assert not trl_flags.is_default("grpo", "remove_unused_columns", True)  # TRL 1.16's GRPOConfig turns it off
    assert trl_flags.is_default("ppo", "remove_unused_columns", True)  # TRL 1.12's PPOConfig keeps transformers'
    assert trl_flags.is_default("ppo", "accelerator_config", {"even_batches": True})  # transformers fills it in
    assert not trl_flags.is_default("ppo", "accelerator_config", {"even_batches": False})
    assert not trl_flags.is_default("ppo", "accelerator_config", {"no_such_key": None})
    assert not trl_flags.is_default("grpo", "no_such_flag", None)
    assert trl_flags.flag_value("grpo", "use_vllm", "FALSE") is False and trl_flags.flag_value(
        "grpo", "use_vllm", None
    )
    assert trl_flags.flag_value("grpo", "vllm_server_port", "8000") == 8000
    assert trl_flags.flag_value("ppo", "deepspeed", "None") == "None"  # HfArgumentParser's text, not None


def test_a_misspelt_flag_is_still_unknown(capsys):
    assert main(["ppo", "--learnin_rate", "1e-5", "--push_to_hubb"]) == 2
    err = capsys.readouterr().err
    assert "unknown flags: --learnin_rate, --push_to_hubb" in err and "TRL" not in err
    assert main(["ppo", "--use_vllm"]) == 2  # a flag of trl grpo, not of trl ppo
    assert "unknown flags: --use_vllm" in capsys.readouterr().err


def test_every_refused_flag_is_named_at_once():
    with pytest.raises(UsageError) as info:
        parse_config(GRPOConfig, ["--use_vllm", "--hub_revision", "dev", "--beta", "0.1"], "x")
    assert str(info.value).count("is a TRL/transformers flag") == 2


def test_trl_flags_are_looked_up_only_when_a_flag_is_not_rlhfkit_s(monkeypatch):
    def not_taken(*args):
        raise AssertionError("TRL's flags were looked up")

    monkeypatch.setattr(trl_flags, "not_taken", not_taken)  # it imports transformers' TrainingArguments (+11 MB)
    args, _ = parse_config(GRPOConfig, ["--beta", "0.1", "--no_use_bias_correction_kl", "--report-to=none"], "x")
    assert args.beta == 0.1 and args.use_bias_correction_kl is False
    with pytest.raises(AssertionError, match="looked up"):
        parse_config(GRPOConfig, ["--beta", "0.1", "--hub_always_push"], "x")


def test_ignored_flags_are_dropped_with_their_values():
    args, explicit = parse_config(
        PPOConfig, ["--do_train", "--local-rank=0", "--do_eval", "true", "--local_rank", "1", "--kl_coef", "0.2"], "x"
    )
    assert args.kl_coef == 0.2 and explicit == {"kl_coef"}


def test_yaml_keys_get_the_same_reasons(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: 1.0e-5\ndo_train: true\nhub_always_push: true\n")
    with pytest.raises(UsageError, match=r"has the key hub_always_push: --hub_always_push is a TRL/transformers flag"):
        parse_config(PPOConfig, ["--config", str(path)], "x")
    path.write_text("learning_rate: 1.0e-5\ndo_train: true\n")
    assert parse_config(PPOConfig, ["--config", str(path)], "x")[0].learning_rate == 1e-5


@pytest.mark.parametrize("cls", [PPOConfig, GRPOConfig])
def test_help_lists_every_flag_and_points_to_the_refused_ones(cls):
    text = _parser(cls, "rlhfkit x").format_help()
    for f in fields(cls):
        assert f"--{f.name} " in text or f"--{f.name}\n" in text, f.name
    assert "docs/trl-flags.md" in " ".join(text.split())


def test_trl_grpo_reward_model_flag_adds_a_reward_model():
    args, _ = parse_config(
        GRPOConfig, ["--reward_model_path", "a", "--reward_model_name_or_path", "b", "--reward_funcs", "f"], "x"
    )
    assert args.reward_model_path == ["a", "b"] and args.reward_model_name_or_path is None
    assert GRPOConfig(**args.to_dict()).reward_model_path == ["a", "b"]  # a config rebuilt from its dict adds nothing


def test_a_transformers_optimizer_rlhfkit_does_not_build_exits_2_naming_the_supported_ones(capsys):
    assert main(["ppo", "--optim", "adamw_bnb_8bit"]) == 2
    err = capsys.readouterr().err
    assert "optim='adamw_bnb_8bit': not supported by rlhfkit" in err and "adamw_torch, adamw_torch_fused, sgd" in err
    assert "Traceback" not in err
