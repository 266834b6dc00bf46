"""--num_processes and --accelerate_config (flags, or keys of --config) run `rlhfkit ppo|grpo` under accelerate launch as
the `trl` command does; every on/off flag has --no_NAME. (A real 2-process launch takes ~20 s on a CPU: the test checks
the arguments given to accelerate's own launch parser, which rlhfkit.cli.relaunch hands to launch_command.)"""

import pytest
from accelerate.commands.launch import launch_command_parser

from rlhfkit.config import GRPOConfig, PPOConfig
from rlhfkit.config.parse import launch_arguments, parse_config
from rlhfkit.errors import UsageError


def _accelerate(launch):
    return launch_command_parser().parse_args(launch)


def test_num_processes_and_accelerate_config_become_accelerate_launch_arguments(tmp_path):
    config = tmp_path / "zero2.yaml"
    config.write_text("distributed_type: MULTI_GPU\n")
    argv = ["--learning_rate", "1e-6", "--num_processes", "2", f"--accelerate_config={config}", "--beta", "0.1"]
    args = _accelerate(launch_arguments("grpo", argv))
    assert args.num_processes == 2 and args.config_file == str(config)
    assert args.module and args.training_script == "rlhfkit"
    assert args.training_script_args == ["grpo", "--learning_rate", "1e-6", "--beta", "0.1"]
    assert launch_arguments("ppo", ["--learning_rate", "1e-6"]) is None  # nothing to launch: run here


def test_the_launch_keys_of_a_config_file_are_read_and_flags_win(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("num_processes: 4\nlearning_rate: 1.0e-6\n")
    args = _accelerate(launch_arguments("ppo", ["--config", str(path)]))
    assert args.num_processes == 4 and args.config_file is None
    assert args.training_script_args == ["ppo", "--config", str(path)]  # the processes read the same file
    assert _accelerate(launch_arguments("ppo", ["--config", str(path), "--num_processes", "8"])).num_processes == 8
    # The processes (and any parse) leave the launcher's keys and flags out.
    config, explicit = parse_config(PPOConfig, ["--config", str(path), "--num_processes", "2"], "rlhfkit ppo")
    assert config.learning_rate == 1e-6 and "num_processes" not in explicit


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_processes", "two"], "--num_processes 'two': must be an integer >= 1"),
        (["--num_processes"], "--num_processes needs a value"),
        (["--accelerate_config", "nowhere.yaml"], "--accelerate_config 'nowhere.yaml' is not a file"),
    ],
)
def test_bad_launch_flags_are_usage_errors(argv, message):
    with pytest.raises(UsageError, match=message):
        launch_arguments("ppo", argv)


@pytest.mark.parametrize(
    "cls, flag, default",
    [
        (PPOConfig, "gradient_checkpointing", False),
        (GRPOConfig, "use_peft", False),
        (GRPOConfig, "bf16", None),
        (PPOConfig, "non_eos_penalty", False),  # --non_... is the flag itself, --no_non_... its negation
        (PPOConfig, "disable_dropout", True),  # HfArgumentParser's own --no_ of a flag that defaults to true
    ],
)
def test_every_on_off_flag_has_no_name(cls, flag, default):
    assert getattr(parse_config(cls, [], "x")[0], flag) == default
    for argv, value in (
        ([f"--{flag}"], True),
        ([f"--{flag}", "false"], False),
        ([f"--no_{flag}"], False),
        ([f"--no-{flag.replace('_', '-')}"], False),
        ([f"--{flag}", f"--no_{flag}"], False),
    ):
        config, explicit = parse_config(cls, argv, "x")
        assert getattr(config, flag) is value, argv
        assert flag in explicit


def test_no_name_is_in_help_for_every_on_off_flag(capsys):
    with pytest.raises(SystemExit):
        parse_config(GRPOConfig, ["--help"], "rlhfkit grpo")
    text = capsys.readouterr().out
    for name in ("gradient_checkpointing", "use_peft", "bf16", "log_completions", "disable_dropout"):
        assert f"--no_{name}" in text, name
