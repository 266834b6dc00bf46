"""A TRL user's commands run unchanged with hub ids: the models and datasets come from hub caches filled with tiny
stand-ins (tests/hub_cache.py), offline, in subprocesses whose environment points at those caches."""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlhfkit.cli import main
from rlhfkit.models import load_tokenizer
from tests.hub_cache import CHAT_TEMPLATE, cache_dataset, cache_model, offline_env
from tests.tiny_models import save_tiny_models

ROOT = Path(__file__).resolve().parents[1]

TLDR_PROMPT = "SUBREDDIT: r/{sub}\n\nTITLE: {title}\n\nPOST: {post}\n\nTL;DR:"


@pytest.fixture(scope="module")
def caches(tiny_assets, tmp_path_factory):
    """Hub and datasets caches holding the ids of seed 003's TL;DR command and of TRL's GRPO quick start."""
    tmp = tmp_path_factory.mktemp("hub")
    hub, datasets = tmp / "hub", tmp / "datasets"
    tokenizer = load_tokenizer(str(tiny_assets / "tokenizer"))

    # Seed 003: pythia-1b-deduped (tokenizer), cleanrl's SFT and reward models; GPT-NeoX like the originals.
    causal, scalar = save_tiny_models("gpt_neox", tokenizer, tmp, max_positions=512)
    cache_model(hub, "EleutherAI/pythia-1b-deduped", causal)
    cache_model(hub, "cleanrl/EleutherAI_pythia-1b-deduped__sft__tldr", causal)
    cache_model(hub, "cleanrl/EleutherAI_pythia-1b-deduped__reward__tldr", scalar)
    rows = [
        {"prompt": TLDR_PROMPT.format(sub=f"sub{i}", title=f"title {i}", post=f"post number {i} " * 3), "id": i}
        for i in range(24)
    ]
    cache_dataset(
        datasets, "trl-internal-testing/tldr-preference-sft-trl-style",
        {"train": rows[:16], "validation": rows[16:]}, tmp,
    )  # fmt: skip

    # TRL's GRPO quick start: a chat model (Qwen2), and a conversational math dataset with a solution column.
    tokenizer.chat_template = CHAT_TEMPLATE
    causal, scalar = save_tiny_models("qwen2", tokenizer, tmp / "chat", max_positions=512)
    cache_model(hub, "Qwen/Qwen2.5-0.5B-Instruct", causal)
    cache_model(hub, "rlhfkit-tests/tiny-chat-reward", scalar)
    math = [{"prompt": [{"role": "user", "content": f"what is {i}+{i}?"}], "solution": str(2 * i)} for i in range(16)]
    cache_dataset(datasets, "trl-lib/DeepMath-103K", {"train": math}, tmp)
    return hub, datasets


def run_offline(caches, args, cwd):
    hub, datasets = caches
    env = offline_env(hub, datasets, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_seed_tldr_command_trains_on_hub_ids_offline(caches, tmp_path):
    """Seed 003's TL;DR command with its ids as written (plus the dataset flags of TRL's current docs, and sizes
    that keep the test short)."""
    out = tmp_path / "ppo_tldr"
    command = [
        sys.executable, "-m", "rlhfkit", "ppo",
        "--output_dir", str(out),
        "--learning_rate", "3e-6",
        "--per_device_train_batch_size", "16",
        "--gradient_accumulation_steps", "4",
        "--total_episodes", "64",
        "--model_name_or_path", "EleutherAI/pythia-1b-deduped",
        "--sft_model_path", "cleanrl/EleutherAI_pythia-1b-deduped__sft__tldr",
        "--reward_model_path", "cleanrl/EleutherAI_pythia-1b-deduped__reward__tldr",
        "--local_rollout_forward_batch_size", "16",
        "--non_eos_penalty",
        "--stop_token", "eos",
        "--dataset_name", "trl-internal-testing/tldr-preference-sft-trl-style",
        "--dataset_test_split", "validation",
        "--response_length", "12", "--num_sample_generations", "1", "--report_to", "none",
    ]  # fmt: skip
    result = run_offline(caches, command, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "training on 1 process (" in result.stdout
    with open(out / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    update = next(r for r in rows if "episode" in r)
    assert update["episode"] == 64 and update["val/ratio"] == pytest.approx(1.0, abs=1e-5)
    with open(out / "run_config.json") as f:
        assert json.load(f)["sft_model_path"] == "cleanrl/EleutherAI_pythia-1b-deduped__sft__tldr"
    samples = [json.loads(line) for line in open(out / "samples.jsonl")]
    # The sample generations use the validation split (rows 16-23); capitals decode as nothing in the stand-in.
    assert samples and all(int(re.search(r"sub(\d+)", s["query"]).group(1)) >= 16 for s in samples)


GRPO_QUICKSTART = """
import json, sys
from datasets import load_dataset
from rlhfkit import GRPOConfig, GRPOTrainer

seen = {}

def accuracy_reward(completions, solution, prompts, **kwargs):
    seen.setdefault("completion", completions[0])
    seen.setdefault("prompt", prompts[0])
    return [float(c[0]["content"].strip() == s) for c, s in zip(completions, solution)]

dataset = load_dataset("trl-lib/DeepMath-103K", split="train")
trainer = GRPOTrainer(
    model="Qwen/Qwen2.5-0.5B-Instruct",
    reward_funcs=[accuracy_reward, "rlhfkit-tests/tiny-chat-reward"],
    args=GRPOConfig(
        output_dir=sys.argv[1], report_to="none", max_steps=2, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=8, num_sample_generations=1,
    ),
    train_dataset=dataset,
)
trainer.train()
json.dump(seen, open(sys.argv[2], "w"))
"""


@pytest.mark.slow
def test_trl_grpo_quickstart_runs_offline_on_a_conversational_hub_dataset(caches, tmp_path):
    script, out, seen = tmp_path / "quickstart.py", tmp_path / "grpo", tmp_path / "seen.json"
    script.write_text(textwrap.dedent(GRPO_QUICKSTART))
    result = run_offline(caches, [sys.executable, str(script), str(out), str(seen)], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    # Reward functions get TRL's conversational forms.
    received = json.loads(seen.read_text())
    (message,) = received["prompt"]
    assert message["role"] == "user" and message["content"].startswith("what is ")
    (completion,) = received["completion"]
    assert completion["role"] == "assistant" and isinstance(completion["content"], str)
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    logged = set().union(*rows)
    assert {"rewards/accuracy_reward/mean", "rewards/tiny-chat-reward/mean"} <= logged
    # The completions table shows the prompt as the model read it, through the chat template.
    samples = [json.loads(line) for line in open(out / "samples.jsonl")]
    assert samples[0]["prompt"].startswith("user: what is") and samples[0]["prompt"].endswith("assistant: ")


@pytest.mark.parametrize(
    "flags, needles",
    [
        (
            ["--model_name_or_path", "rlhfkit-tests/not-in-the-cache", "--dataset_name", "{prompts}"],
            ["--model_name_or_path 'rlhfkit-tests/not-in-the-cache'", "HF_HUB_OFFLINE=1", "local directory"],
        ),
        (
            ["--model_name_or_path", "{tmp}/no/such/dir", "--dataset_name", "{prompts}"],
            ["neither a local directory nor a hub model id"],
        ),
        (
            ["--model_name_or_path", "{sft}", "--dataset_name", "rlhfkit-tests/not-a-cached-dataset"],
            ["--dataset_name 'rlhfkit-tests/not-a-cached-dataset'", "offline", "local file or directory"],
        ),
        (["--model_name_or_path", "{sft}"], ["no --dataset_name", "built-in task"]),
    ],
)
def test_missing_models_and_datasets_exit_2_naming_the_flag(tiny_assets, tmp_path, capsys, flags, needles):
    values = dict(prompts=tiny_assets / "prompts", sft=tiny_assets / "sft", tmp=tmp_path)
    reward = ["--reward_model_path", str(tiny_assets / "reward")]  # PPO needs one; the error must be the model's
    argv = ["ppo", *[flag.format(**values) for flag in flags], *reward, "--output_dir", str(tmp_path / "out")]
    assert main([*argv, "--report_to", "none"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not (tmp_path / "out").exists()
