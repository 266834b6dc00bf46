"""code_reward through the trainer: a short GRPO run on the code task (test preset) with the reward named on the
command line's way (--reward_funcs rlhfkit.sandbox:code_reward) logs the registry's set plus sandbox/*, and the
quickstart trains the code task end to end."""

from __future__ import annotations

import json

import pytest

from rlhfkit.metrics import registry
from rlhfkit.quickstart import cmd_quickstart
from rlhfkit.tasks import build_tiny, load_task
from rlhfkit.trainers.build import build_grpo_trainer
from tests.helpers import expand_templates
from tests.trainers.test_grpo import grpo_config, read_jsonl

from .conftest import require_sandbox


@pytest.fixture(scope="module")
def code_assets(tmp_path_factory):
    out = tmp_path_factory.mktemp("code-assets") / "code"
    build_tiny(str(out), seed=0, preset="test", log=lambda *a, **k: None, task="code")
    return out


def test_code_task_dataset_carries_its_tests(code_assets):
    from datasets import load_from_disk

    prompts = load_from_disk(str(code_assets / "prompts"))
    task = load_task(code_assets)
    row = prompts["train"][0]
    assert set(prompts["train"].column_names) == {"prompt", "answer", "tests"}
    assert row["tests"] == task.columns(row["prompt"])["tests"] and row["tests"].count("assert f(") == 4
    assert list(task.reward_funcs) == ["code_reward"]


@pytest.mark.slow
def test_grpo_with_code_reward_from_the_command_line_name(code_assets, tmp_path):
    require_sandbox()
    args = grpo_config(
        code_assets,
        tmp_path,
        reward_funcs=["rlhfkit.sandbox:code_reward"],
        max_completion_length=load_task(code_assets).max_new_tokens,
        max_steps=2,
        num_sample_generations=1,
        beta=0.04,
    )
    trainer = build_grpo_trainer(args, explicit={"reward_funcs"})
    trainer.train()
    every_row = read_jsonl(f"{args.output_dir}/metrics.jsonl")
    rows = [r for r in every_row if "loss" in r]
    assert len(rows) == 2
    logged = set().union(*(r.keys() for r in every_row)) - {"step"}
    expected = {m.name for m in expand_templates(registry.metrics_for("grpo"), ["code_reward"], sandbox=True)}
    not_this_run = {"cispo_clip_ratio", "vespo/phi_seq_mean", "entropy_coef", "policy_loss"}
    not_this_run |= {name for name in expected if name.startswith("dynamic_sampling/")}
    assert logged == expected - not_this_run
    for row in rows:
        assert 0.0 <= row["rewards/code_reward/mean"] <= 1.0
        assert row["sandbox/timeout_ratio"] == 0.0 and 0 < row["sandbox/mean_seconds"] < 5
    evaluations = [r for r in every_row if "eval/task_success" in r]
    assert evaluations and all(0 < r["eval/sandbox/mean_seconds"] < 5 for r in evaluations)  # ran in the sandbox too


@pytest.mark.slow
def test_quickstart_trains_the_code_task(tmp_path, capsys):
    require_sandbox()
    run_dir = tmp_path / "qs"
    argv = ["--algorithm", "grpo", "--task", "code", "--preset", "test", "--output_dir", str(run_dir),
            "--report_to", "none", "--num_sample_generations", "0", "--max_steps", "2",
            "--per_device_train_batch_size", "8", "--num_generations", "4", "--gradient_accumulation_steps", "1"]  # fmt: skip
    assert cmd_quickstart(argv) == 0
    assert "GRPO policy vs the SFT model on 32 held-out prompts" in capsys.readouterr().out
    config = json.loads((run_dir / "run_config.json").read_text())
    assert config["reward_funcs"] == ["code_reward"]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert any("sandbox/mean_seconds" in row for row in rows)


def test_code_task_reference_programs_pass_their_tests_and_near_misses_do_not():
    require_sandbox()
    import random

    from rlhfkit.tasks import code

    rng = random.Random(0)
    prompts = [code.make_example(rng)[0] for _ in range(16)]
    answers = [code.answer(p) for p in prompts]
    tests = [code.tests(p) for p in prompts]
    assert code.code_reward(answers, tests=tests) == [1.0] * 16
    equivalent = [a.replace("lambda x: x", "lambda x: 0+x") for a in answers]  # another program, the same function
    assert code.code_reward(equivalent, tests=tests) == [1.0] * 16
    wrong = [code.corrupt(p, a, rng) for p, a in zip(prompts, answers)]
    assert all(score < 1.0 for score in code.code_reward(wrong, tests=tests) if score is not None)
