"""examples/ppo.py and examples/grpo.py run to the end on the built-in task's tiny assets (one or two updates): the
command line parses into their dataclasses, the model they save loads, and metrics.jsonl has the training rows."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str):
    """The example script as a module (examples/ is not a package); registered so its dataclasses resolve."""
    module_name = f"rlhfkit_example_{name}"
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def metric_rows(output_dir: Path) -> list[dict]:
    with open(output_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("name", ["ppo", "grpo"])
def test_example_docstring_gives_both_commands(name):
    text = (EXAMPLES / f"{name}.py").read_text()
    assert f"python examples/{name}.py" in text and "builtin_assets('default'" in text  # the built-in task
    assert "accelerate launch --config_file examples/accelerate_configs/" in text  # a real model
    config_file = text.split("--config_file ", 1)[1].split()[0]
    assert (EXAMPLES.parent / config_file).is_file()


def test_ppo_example(tiny_assets, tmp_path):
    example = load_example("ppo")
    out = tmp_path / "run"
    script_args, training_args, model_args = example.make_parser().parse_args_into_dataclasses(
        args=[
            "--model_name_or_path", str(tiny_assets / "tokenizer"), "--sft_model_path", str(tiny_assets / "sft"),
            "--reward_model_path", str(tiny_assets / "reward"), "--dataset_name", str(tiny_assets / "prompts"),
            "--dataset_test_split", "none", "--eval_samples", "8", "--task", str(tiny_assets),
            "--output_dir", str(out), "--report_to", "none", "--per_device_train_batch_size", "8",
            "--num_ppo_epochs", "1", "--total_episodes", "16", "--response_length", "8", "--stop_token", "eos",
            "--local_rollout_forward_batch_size", "8", "--num_sample_generations", "0", "--save_steps", "0",
        ]
    )  # fmt: skip
    trainer = example.main(script_args, training_args, model_args)
    assert len(trainer.eval_dataset) == 8  # held out of the train split, as TRL's script holds out 100

    rows = metric_rows(out)
    assert [r["step"] for r in rows if "episode" in r] == [1, 2]
    assert [r["episode"] for r in rows if "episode" in r] == [8, 16]
    assert [r["step"] for r in rows if "eval/task_success" in r] == [2]  # generate_completions() at the end
    policy = AutoModelForCausalLM.from_pretrained(out)
    assert policy.config.vocab_size == AutoModelForCausalLM.from_pretrained(tiny_assets / "sft").config.vocab_size
    AutoModelForSequenceClassification.from_pretrained(out / "value_model", num_labels=1)


def test_grpo_example(tiny_assets, tmp_path):
    example = load_example("grpo")
    out = tmp_path / "run"
    script_args, training_args, model_args = example.make_parser().parse_args_into_dataclasses(
        args=[
            "--model_name_or_path", str(tiny_assets / "sft"), "--dataset_name", str(tiny_assets / "prompts"),
            "--task", str(tiny_assets), "--reward_funcs", "rlhfkit.tasks.sort.correctness", "partial_credit",
            "--reward_model_name_or_path", str(tiny_assets / "reward"),
            "--output_dir", str(out), "--report_to", "none", "--num_generations", "4",
            "--per_device_train_batch_size", "8", "--max_completion_length", "8", "--max_steps", "1",
            "--num_sample_generations", "0", "--save_steps", "0",
        ]
    )  # fmt: skip
    trainer = example.main(script_args, training_args, model_args)
    assert trainer.rewards.names[0] == "reward"  # TRL's order: the reward model first, then the functions

    rows = metric_rows(out)
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == [1]
    assert {"rewards/correctness/mean", "rewards/partial_credit/mean"} <= set(steps[0])
    AutoModelForCausalLM.from_pretrained(out)
