"""The Python configs give the command line's reasons: a TRL field rlhfkit refuses raises ConfigError (also a
TypeError, as Python's own unexpected-keyword error) with config/trl_flags.py's reason; the accepted-and-ignored ones
and --torch_dtype get one note."""

import pytest

from rlhfkit.config import ConfigError, GRPOConfig, PPOConfig, trl_flags
from rlhfkit.config.parse import parse_config
from rlhfkit.errors import UsageError


def test_a_refused_trl_field_gives_the_command_lines_reason():
    reason = trl_flags.group_of("use_vllm").reason
    with pytest.raises(ConfigError) as info:
        GRPOConfig(use_vllm=True)
    assert isinstance(info.value, TypeError)
    assert str(info.value).startswith("GRPOConfig(use_vllm=...): use_vllm is a TRL/transformers field that rlhfkit")
    assert reason in str(info.value)
    with pytest.raises(UsageError, match="--use_vllm is a TRL/transformers flag") as cli:
        parse_config(GRPOConfig, ["--use_vllm"], "rlhfkit grpo")
    assert reason in str(cli.value)
    with pytest.raises(ConfigError, match=r"hub_strategy is a TRL/transformers field .* uploads output_dir once"):
        PPOConfig(hub_strategy="checkpoint")
    PPOConfig(hub_strategy="every_save")  # TRL's default asks for nothing rlhfkit does differently


def test_an_unknown_keyword_is_still_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'lerning_rate'. Did you mean 'learning_rate'"):
        GRPOConfig(lerning_rate=1e-6)
    with pytest.raises(TypeError, match=r"PPOConfig.__init__\(\) got an unexpected keyword argument 'zzz'\.$"):
        PPOConfig(zzz=1)
    with pytest.raises(TypeError, match="num_generations"):  # a GRPO field is no PPO field
        PPOConfig(num_generations=4)


def test_an_ignored_field_is_dropped_with_one_note(capsys):
    config = GRPOConfig(dataloader_num_workers=4, log_level="info", learning_rate=2e-6)
    assert config.learning_rate == 2e-6 and "dataloader_num_workers" not in config.to_dict()
    assert config.dataloader_num_workers == 4 and config.log_level == "info"  # as given, for a script to read
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("rlhfkit: note: dataloader_num_workers has no effect in rlhfkit: ")
    assert "log_level has no effect in rlhfkit: transformers' console logging controls" in err[1]


@pytest.mark.parametrize(
    "flags, name",
    [
        (["--log_level", "info"], "log_level"),
        (["--dataloader_num_workers", "8"], "dataloader_num_workers"),
        (["--ddp_timeout=7200"], "ddp_timeout"),
        (["--disable_tqdm", "true"], "disable_tqdm"),
        (["--skip_memory_metrics", "false"], "skip_memory_metrics"),  # bare, it is transformers' default: silent
    ],
)
def test_harmless_trainer_flags_of_recipes_are_accepted_with_one_note(flags, name, capsys):
    config, explicit = parse_config(GRPOConfig, [*flags, "--beta", "0.1"], "rlhfkit grpo")
    assert config.beta == 0.1 and name not in explicit  # the value did not leak into another flag
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"rlhfkit: note: --{name} has no effect in rlhfkit: ")


def test_ignored_keys_of_a_config_file_get_the_note_too(tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text("log_level: info\nddp_timeout: 7200\nlearning_rate: 1.0e-6\n")
    config, _ = parse_config(GRPOConfig, ["--config", str(path)], "rlhfkit grpo")
    assert config.learning_rate == 1e-6
    err = capsys.readouterr().err
    assert err.count("rlhfkit: note:") == 2 and "log_level (in --config" in err and "ddp_timeout (in --config" in err


def test_a_training_config_that_becomes_its_full_arguments_is_built_once(capsys):
    """PPOConfig(model_name_or_path=...) is a PPOArguments: its keywords are screened, and its checks run, once."""
    config = PPOConfig(model_name_or_path="m", torch_dtype="float16", do_train=True)
    assert type(config).__name__ == "PPOArguments" and config.dtype == "float16"
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "do_train has no effect" in err[0] and "torch_dtype is the old name" in err[1]


def test_torch_dtype_is_the_old_name_of_dtype(capsys):
    config, _ = parse_config(GRPOConfig, ["--torch_dtype", "bfloat16"], "rlhfkit grpo")
    assert config.dtype == "bfloat16" and config.torch_dtype is None
    assert capsys.readouterr().err.strip() == (
        "rlhfkit: note: torch_dtype is the old name of dtype (transformers 5 renamed it): using dtype=bfloat16."
    )
    assert PPOConfig(torch_dtype="float16").dtype == "float16"
    assert GRPOConfig(**GRPOConfig(torch_dtype="auto").to_dict()).dtype == "auto"  # rebuilt without a second move
    with pytest.raises(ConfigError, match="torch_dtype='float16' and dtype='bfloat16'.*Pass only --dtype"):
        GRPOConfig(torch_dtype="float16", dtype="bfloat16")
    with pytest.raises(ConfigError, match="torch_dtype='fp8': must be one of auto, float32, bfloat16, float16"):
        GRPOConfig(torch_dtype="fp8")
