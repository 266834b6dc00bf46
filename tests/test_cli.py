"""The command line, run as a user runs it (subprocesses), plus flag parsing."""

import json
import os
import subprocess
import sys

import pytest

from rlhfkit.config import GRPOConfig, PPOConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.errors import ConfigError, UsageError
from tests.helpers import asset_flags


def rlhfkit(*args, cwd=None, timeout=300, env=None):
    return subprocess.run(
        [sys.executable, "-m", "rlhfkit.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env
    )


@pytest.mark.slow
def test_help_lists_commands_and_ppo_flags():
    top = rlhfkit("--help")
    assert top.returncode == 0 and "ppo" in top.stdout and "build-tiny" in top.stdout
    ppo = rlhfkit("ppo", "--help")
    assert ppo.returncode == 0
    for flag in (
        "--learning_rate",
        "--per_device_train_batch_size",
        "--total_episodes",
        "--num_ppo_epochs",
        "--non_eos_penalty",
        "--penalty_reward_value",
        "--kl_estimator",
        "--kl_target",
        "--report_to",
    ):
        assert flag in ppo.stdout
    assert "Passes over each rollout batch" in ppo.stdout  # help text, not just names
    assert "Valid: a number in [0, 1]." in " ".join(ppo.stdout.split())  # --gamma's rule
    assert rlhfkit("build-tiny", "--help").returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("command", ["ppo", "grpo"])
def test_help_builds_and_imports_no_trainer(command):
    # what `--help` loads is what it costs (bench/startup.py): the flags, not the trainers, peft or TRL's flag list
    probe = (
        "import sys\n"
        "from rlhfkit.cli import main\n"
        "try:\n"
        f"    main([{command!r}, '--help'])\n"
        "except SystemExit as e:  # argparse's help exits\n"
        "    assert e.code == 0\n"
        "loaded = ('rlhfkit.trainers.build', 'rlhfkit.engines', 'transformers.training_args', 'peft')\n"
        "print([name for name in loaded if name in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-1] == "[]"


@pytest.mark.slow
def test_unknown_flag_is_named_and_exits_2():
    result = rlhfkit("ppo", "--learning_rat", "1e-5", "--bogus_flag")
    assert result.returncode == 2
    assert "--learning_rat" in result.stderr and "--bogus_flag" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_unknown_command_exits_2():
    assert rlhfkit("dpo").returncode == 2


def test_trl_getting_started_and_tldr_commands_parse_unchanged():
    # Seed 003 "Get started" command, flags verbatim.
    args, explicit = parse_config(
        PPOConfig,
        [
            "--learning_rate",
            "3e-6",
            "--num_ppo_epochs",
            "1",
            "--num_mini_batches",
            "1",
            "--output_dir",
            "models/minimal/ppo",
            "--per_device_train_batch_size",
            "64",
            "--gradient_accumulation_steps",
            "1",
            "--total_episodes",
            "10000",
            "--model_name_or_path",
            "EleutherAI/pythia-1b-deduped",
            "--non_eos_penalty",
        ],
        "rlhfkit ppo",
    )
    assert args.non_eos_penalty is True and args.total_episodes == 10000 and args.learning_rate == 3e-6
    assert {"learning_rate", "non_eos_penalty", "model_name_or_path"} <= explicit
    # Seed 003 TL;DR benchmark command.
    args, _ = parse_config(
        PPOConfig,
        [
            "--output_dir",
            "models/minimal/ppo_tldr",
            "--learning_rate",
            "3e-6",
            "--per_device_train_batch_size",
            "16",
            "--gradient_accumulation_steps",
            "4",
            "--total_episodes",
            "1000000",
            "--model_name_or_path",
            "a",
            "--sft_model_path",
            "b",
            "--reward_model_path",
            "c",
            "--local_rollout_forward_batch_size",
            "16",
            "--non_eos_penalty",
            "--stop_token",
            "eos",
        ],
        "rlhfkit ppo",
    )
    assert args.stop_token == "eos" and args.gradient_accumulation_steps == 4 and args.sft_model_path == "b"


@pytest.mark.slow
def test_yaml_config_with_flag_override(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: 1.0e-5\nkl_coef: 0.1\nreport_to: [tensorboard, wandb]\n")
    args, explicit = parse_config(PPOConfig, ["--config", str(path), "--kl_coef", "0.2"], "rlhfkit ppo")
    assert args.learning_rate == 1e-5 and args.kl_coef == 0.2 and args.report_to == ["tensorboard", "wandb"]
    assert {"learning_rate", "kl_coef", "report_to"} <= explicit
    path.write_text("learning_rte: 1.0e-5\n")
    result = rlhfkit("ppo", "--config", str(path))
    assert result.returncode == 2 and "learning_rte" in result.stderr
    # YAML reads 2.0 as a float: refused for an integer field, not truncated; a number-like string is parsed.
    path.write_text("num_ppo_epochs: 2.0\nlearning_rate: 1e-5\n")
    with pytest.raises(ConfigError, match=r"num_ppo_epochs=2.0: must be an integer >= 1\."):
        parse_config(PPOConfig, ["--config", str(path)], "rlhfkit ppo")
    path.write_text("learning_rate: 1e-5\nreward_weights: [1, .nan]\n")
    with pytest.raises(ConfigError, match=r"reward_weights=\[1, nan\]: entry 1 \(nan\)"):
        parse_config(GRPOConfig, ["--config", str(path)], "rlhfkit grpo")


def test_negative_numbers_are_values_and_argparse_errors_are_usage_errors():
    args, _ = parse_config(PPOConfig, ["--penalty_reward_value", "-1e-2", "--missing_eos_penalty=0"], "rlhfkit ppo")
    assert args.penalty_reward_value == -0.01 and args.missing_eos_penalty == 0
    with pytest.raises(ConfigError, match=r"kl_coef=-inf: must be a finite number >= 0\."):
        parse_config(PPOConfig, ["--kl_coef", "-inf"], "rlhfkit ppo")
    with pytest.raises(UsageError, match="--learning_rate.*expected one argument"):
        parse_config(PPOConfig, ["--learning_rate"], "rlhfkit ppo")
    with pytest.raises(UsageError, match="--non_eos_penalty.*got maybe"):
        parse_config(PPOConfig, ["--non_eos_penalty", "maybe"], "rlhfkit ppo")


@pytest.mark.slow
def test_bad_value_exits_2_before_anything_is_built_or_written(tmp_path):
    """No model flags: the built-in task's assets would be built into $RLHFKIT_CACHE (minutes); the value is checked
    first, so the command fails at once, and neither the cache nor --output_dir gets a file."""
    cache, out = tmp_path / "cache", tmp_path / "run"
    cache.mkdir()
    result = rlhfkit(
        "ppo", "--learning_rate", "nan", "--output_dir", str(out), env=dict(os.environ, RLHFKIT_CACHE=str(cache)),
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "learning_rate=nan: must be a finite number > 0. Pass e.g. --learning_rate" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists() and not any(cache.iterdir())


@pytest.mark.slow
def test_non_dividing_batch_sizes_fail_naming_the_flags(tiny_assets, tmp_path):
    result = rlhfkit(
        "ppo",
        *asset_flags(tiny_assets, task=False),
        "--output_dir",
        str(tmp_path / "run"),
        "--report_to",
        "none",
        "--per_device_train_batch_size",
        "6",
        "--num_mini_batches",
        "4",
    )
    assert result.returncode == 2, result.stderr
    assert "num_mini_batches" in result.stderr and "per_device_train_batch_size" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_missing_model_directory_is_a_clear_error(tiny_assets, tmp_path):
    result = rlhfkit(
        "ppo", "--model_name_or_path", str(tmp_path / "nope"), "--dataset_name", str(tiny_assets / "prompts"),
        "--reward_model_path", str(tiny_assets / "reward"), "--output_dir", str(tmp_path / "run"),
    )  # fmt: skip
    assert result.returncode == 2 and "--model_name_or_path" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_getting_started_command_runs_on_local_checkpoints(tiny_assets, tmp_path):
    """Seed 003's command with the model path pointing at a local checkpoint (and fewer episodes)."""
    result = rlhfkit(
        "ppo",
        "--learning_rate",
        "3e-6",
        "--num_ppo_epochs",
        "1",
        "--num_mini_batches",
        "1",
        "--output_dir",
        str(tmp_path / "models/minimal/ppo"),
        "--per_device_train_batch_size",
        "64",
        "--gradient_accumulation_steps",
        "1",
        "--total_episodes",
        "64",
        "--model_name_or_path",
        str(tiny_assets / "sft"),
        "--reward_model_path",  # TRL's command names the SFT model as the reward model too (a random head)
        str(tiny_assets / "sft"),
        "--non_eos_penalty",
        "--dataset_name",
        str(tiny_assets / "prompts"),
        "--report_to",
        "none",
        "--response_length",
        "8",
        "--num_sample_generations",
        "0",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in open(tmp_path / "models/minimal/ppo/metrics.jsonl")]
    assert [r["episode"] for r in rows if "episode" in r] == [64]
    assert os.path.exists(tmp_path / "models/minimal/ppo/model.safetensors")


@pytest.mark.slow
def test_build_tiny_command_writes_loadable_assets(tmp_path):
    result = rlhfkit("build-tiny", str(tmp_path / "tiny"), "--preset", "test")
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("tokenizer", "sft", "reward", "prompts", "task.json"):
        assert (tmp_path / "tiny" / name).exists(), name
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert "pair_accuracy_synthetic" in summary["reward"]


@pytest.mark.slow
def test_ppo_without_model_flags_uses_the_builtin_task(tmp_path):
    """The README's main command: builds the default assets into $RLHFKIT_CACHE (a temp dir here) and trains."""
    result = rlhfkit(
        "ppo",
        "--output_dir",
        str(tmp_path / "run"),
        "--total_episodes",
        "64",
        "--num_sample_generations",
        "1",
        "--report_to",
        "none",
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    config = json.loads((tmp_path / "run" / "run_config.json").read_text())
    # the built-in task's defaults
    builtin = {"learning_rate": 1e-4, "kl_coef": 0.15, "lam": 1.0, "num_ppo_epochs": 2, "stop_token": "eos"}
    assert {name: config[name] for name in builtin} == builtin
    assert rows[0]["step"] == 0 and 0.2 <= rows[0]["eval/task_success"] <= 0.6  # the SFT start is imperfect
    assert [r["episode"] for r in rows if "episode" in r] == [64]


@pytest.mark.slow
def test_ppo_with_the_builtin_task_reward_function_has_no_reward_model(tmp_path):
    """`rlhfkit ppo --reward_funcs correctness`: PPO against the task's checker (assets cached by the test above)."""
    result = rlhfkit(
        "ppo", "--reward_funcs", "correctness", "--output_dir", str(tmp_path / "run"), "--total_episodes", "64",
        "--num_sample_generations", "0", "--report_to", "none", timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    config = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert config["reward_model_path"] is None and config["reward_funcs"] == ["correctness"]
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    (row,) = [r for r in rows if "episode" in r]  # the update's row (then train()'s summary row)
    assert row["objective/scores"] == pytest.approx(row["rewards/correctness/mean"], abs=1e-9)
    assert row["rewards/correctness/mean"] == pytest.approx(row["rollout/task_success"], abs=1e-9)
    assert os.path.isfile(tmp_path / "run" / "value_model" / "model.safetensors")


@pytest.mark.parametrize(
    "command, flag",
    [
        ("quickstart", "--total_episodes"),
        ("grpo", "--num_generations"),
        ("eval", "--judge"),
        ("report", "--out"),
        ("doctor", "run_dir"),
    ],
)
@pytest.mark.slow
def test_every_subcommand_has_help(command, flag):
    result = rlhfkit(command, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert flag in result.stdout


@pytest.mark.slow
def test_grpo_without_model_flags_uses_the_builtin_task(tmp_path):
    """The built-in task with its rule-based rewards (assets cached by the PPO test above, or built here)."""
    result = rlhfkit(
        "grpo", "--output_dir", str(tmp_path / "run"), "--max_steps", "2", "--num_sample_generations", "1",
        "--report_to", "none", timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    config = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert config["reward_funcs"] == ["correctness", "partial_credit"] and config["temperature"] == 0.7
    assert rows[0]["step"] == 0 and 0.2 <= rows[0]["eval/task_success"] <= 0.6
    assert [r["episode"] for r in rows if "loss" in r] == [256, 512]  # 32 prompts x 8 completions per step
    assert {"rewards/correctness/mean", "rewards/partial_credit/mean"} <= set(rows[1])


@pytest.mark.slow
def test_quickstart_runs_the_whole_pipeline(tmp_path):
    """Train (briefly), judge against the SFT model with two judges, write the report, say where things are."""
    result = rlhfkit(
        "quickstart", "--output_dir", str(tmp_path / "qs"), "--total_episodes", "128", "--report_to", "trackio",
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert out.count("Model win rate:") == 2 and "judge: task:sort" in out and "judge: reward-model:" in out
    assert f"Report: {tmp_path / 'qs' / 'report' / 'report.html'}" in out
    assert "Dashboard: trackio show --project huggingface" in out
    assert (tmp_path / "qs" / "report" / "report.html").stat().st_size > 10_000
    before_after = json.loads((tmp_path / "qs" / "before_after.json").read_text())
    assert [w["judge"].split(":")[0] for w in before_after["win_rates"]] == ["task", "reward-model"]
    assert before_after["prompts"] == 256 and 1 <= len(before_after["examples"]) <= 6
    html = (tmp_path / "qs" / "report" / "report.html").read_text()
    assert html.index("Before and after") < html.index("Crucial values")  # the report opens with it
    assert before_after["examples"][0]["prompt"] in html


@pytest.mark.slow
def test_grpo_quickstart_runs_the_whole_pipeline(tmp_path):
    """`rlhfkit quickstart --algorithm grpo`: GRPO on the task's rule-based rewards, then the same judging and report."""
    result = rlhfkit(
        "quickstart", "--algorithm", "grpo", "--output_dir", str(tmp_path / "qs"), "--max_steps", "2",
        "--report_to", "none", timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "GRPO policy vs the SFT model" in out and out.count("Model win rate:") == 2
    config = json.loads((tmp_path / "qs" / "run_config.json").read_text())
    assert config["reward_funcs"] == ["correctness", "partial_credit"] and config["max_steps"] == 2
    assert (tmp_path / "qs" / "report" / "report.html").is_file()


@pytest.mark.slow
def test_quickstart_refuses_an_unknown_algorithm():
    result = rlhfkit("quickstart", "--algorithm", "dpo")
    assert result.returncode == 2 and "--algorithm 'dpo': must be one of ppo, grpo" in result.stderr
