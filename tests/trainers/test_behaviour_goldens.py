"""The trainers' behaviour is pinned: with the same seed, PPO, GRPO, asynchronous GRPO and agent runs (tools in GRPO's
and PPO's episode loops, evaluation with tools) write the metrics (timings aside), samples and final weights recorded
in goldens/behaviour.json, byte for byte. A restructuring that changes any number fails here.

Float results are exact only on the machine that recorded them: the recorded fingerprint (torch version, CPU
instruction set torch dispatches to, threads) says which. On another machine the numbers are compared within a
relative 1e-4 and the texts and weights' sums within the same, since another instruction set rounds differently.
Re-record, after a change that is meant to change behaviour, with RLHFKIT_RECORD_GOLDENS=1 and say why in the commit.
"""

import hashlib
import json
import math
import os
import platform
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit import GRPOConfig, GRPOTrainer
from rlhfkit.quickstart import AGENT_EVAL_FILE, cmd_quickstart
from rlhfkit.sampling import completions as sampling_completions
from rlhfkit.trainers.build import build_grpo_trainer, build_ppo_trainer
from tests.tool_chat import (
    END,
    async_add,
    call_text,
    multiply,
    scripted_generate,
    tool_chat_model,
    tool_chat_tokenizer,
)
from tests.trainers.test_grpo import grpo_config
from tests.trainers.test_grpo_async import TIMING
from tests.trainers.test_ppo import small_config
from tests.trainers.test_resume import PER_CALL

GOLDENS = Path(__file__).parent / "goldens" / "behaviour.json"
RECORD = os.environ.get("RLHFKIT_RECORD_GOLDENS") == "1"
# what differs between equal runs: wall-clock numbers, a train() call's own rate numbers, and the agent evaluation's
# minutes (and the tools' latencies)
VARIABLE = TIMING | (PER_CALL - {"train_loss"}) | {"minutes"}
MODEL_FILES = ("model.safetensors", "value_model/model.safetensors")


def fingerprint() -> dict:
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
    }


def drop_variable(value):
    if isinstance(value, dict):
        return {k: drop_variable(v) for k, v in value.items() if k not in VARIABLE and not k.endswith("/latency_s")}
    if isinstance(value, list):
        return [drop_variable(v) for v in value]
    return value


def jsonl(path: Path) -> list:
    return [drop_variable(json.loads(line)) for line in path.read_text().splitlines()] if path.is_file() else []


def tensor_record(t: torch.Tensor) -> dict:
    return {
        "sha256": hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest(),
        "sum": t.double().sum().item(),
        "abs_sum": t.double().abs().sum().item(),
    }


def record_of(run_dir: Path, extra_files: tuple[str, ...] = ()) -> dict:
    """What a run left that the same seed must reproduce: its metrics rows and samples (timings dropped), the JSON files
    `extra_files`, and each final weight tensor's bytes (with sums, for the comparison on another machine)."""
    out = {"metrics": jsonl(run_dir / "metrics.jsonl"), "samples": jsonl(run_dir / "samples.jsonl")}
    for name in extra_files:
        out[name] = drop_variable(json.loads((run_dir / name).read_text()))
    for name in MODEL_FILES:
        if (run_dir / name).is_file():
            out[name] = {key: tensor_record(t) for key, t in sorted(load_file(run_dir / name).items())}
    return out


def close(recorded, actual, path="") -> list[str]:
    """Where `actual` differs from `recorded` beyond a relative 1e-4 in numbers (weights: their sums; hashes ignored)."""
    if isinstance(recorded, dict) and isinstance(actual, dict):
        if recorded.keys() != actual.keys():
            return [f"{path}: keys {sorted(recorded.keys() ^ actual.keys())}"]
        return [d for k in recorded if k != "sha256" for d in close(recorded[k], actual[k], f"{path}/{k}")]
    if isinstance(recorded, list) and isinstance(actual, list):
        if len(recorded) != len(actual):
            return [f"{path}: {len(recorded)} items recorded, {len(actual)} now"]
        return [d for i, (a, b) in enumerate(zip(recorded, actual)) for d in close(a, b, f"{path}[{i}]")]
    if isinstance(recorded, float) and isinstance(actual, (int, float)):
        same = math.isclose(recorded, actual, rel_tol=1e-4, abs_tol=1e-6) or (
            math.isnan(recorded) and math.isnan(actual)
        )
        return [] if same else [f"{path}: {recorded} recorded, {actual} now"]
    return [] if recorded == actual else [f"{path}: {recorded!r} recorded, {actual!r} now"]


def check(name: str, record: dict) -> None:
    goldens = json.loads(GOLDENS.read_text()) if GOLDENS.is_file() else {}
    if RECORD:
        goldens.setdefault("fingerprint", fingerprint())
        assert goldens["fingerprint"] == fingerprint(), "re-record every run on one machine"
        goldens[name] = json.loads(json.dumps(record))
        GOLDENS.parent.mkdir(exist_ok=True)
        GOLDENS.write_text(json.dumps(goldens, indent=1, sort_keys=True) + "\n")
        return
    assert name in goldens, f"no recorded golden for {name}: record with RLHFKIT_RECORD_GOLDENS=1"
    actual = json.loads(json.dumps(record))  # the same JSON round trip as the recorded one (NaN kept)
    if goldens["fingerprint"] == fingerprint():
        assert json.dumps(actual, sort_keys=True) == json.dumps(goldens[name], sort_keys=True), (
            close(goldens[name], actual)[:10] or "only the weights' bytes differ"
        )
    else:
        assert close(goldens[name], actual) == []


# ---------------------------------------------------------------------------------------------------------------------
# The runs: each small, each a different path through the trainers.


@pytest.mark.slow
def test_ppo(tiny_assets, tmp_path):
    args = small_config(tiny_assets, tmp_path, num_sample_generations=2, logging_steps=1)
    build_ppo_trainer(args).train()
    check("ppo", record_of(Path(args.output_dir)))


@pytest.mark.slow
def test_grpo(tiny_assets, tmp_path):
    args = grpo_config(tiny_assets, tmp_path, num_sample_generations=2)
    build_grpo_trainer(args, set()).train()
    check("grpo", record_of(Path(args.output_dir)))


@pytest.mark.slow
def test_async_grpo(tiny_assets, tmp_path):
    # every round is sampled with exactly the policy version its request names, so a staleness of 1 is deterministic
    args = grpo_config(
        tiny_assets, tmp_path, gradient_accumulation_steps=1, max_steps=4, async_generation=True, max_staleness=1,
        generation_threads=torch.get_num_threads(), num_sample_generations=2,
    )  # fmt: skip
    build_grpo_trainer(args, set()).train()
    check("async_grpo", record_of(Path(args.output_dir)))


# The scripted agent: each prompt's first turn calls a tool (multiply, async_add, or a name that does not exist); after a
# result it answers with the last number it read, so rewards differ within each group.
FIRST_TURNS = {
    "What is 3 times 4?": call_text("multiply", {"a": 3, "b": 4}),
    "Add 1 and 2.": call_text("async_add", {"a": 1, "b": 2}),
    "Open a file.": call_text("open_file", {"path": "x"}),
    "Say hi.": f"hi{END}",
}


def script(text: str) -> str:
    prompt = text.split("<|im_start|>user\n", 1)[1].split(END, 1)[0]
    if "<tool_response>" not in text:
        return FIRST_TURNS[prompt]
    result = text.rsplit("<tool_response>", 1)[1].split("</tool_response>", 1)[0].strip()
    return f"It is {result}.{END}"


def answered(completions, answer, **kwargs):
    # plus half a point on every other episode, so that rewards differ within each group of identical episodes
    return [float(str(a) in c[-1]["content"]) + 0.5 * (i % 2) for i, (c, a) in enumerate(zip(completions, answer))]


def agent_dataset():
    from datasets import Dataset

    answers = ["12", "3", "none", "hi"]
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": p}], "answer": a} for p, a in zip(FIRST_TURNS, answers)]
    )


@pytest.mark.slow
def test_grpo_agent_with_tools(tmp_path, monkeypatch):
    tok = tool_chat_tokenizer()
    monkeypatch.setattr(sampling_completions, "generate", scripted_generate(tok, script))
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"), report_to=["none"], learning_rate=1e-3, num_generations=2,
        per_device_train_batch_size=8, gradient_accumulation_steps=1, max_steps=2, max_completion_length=200,
        max_tool_calling_iterations=2, logging_steps=1, num_sample_generations=0, save_steps=0, seed=3,
        eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=8,
    )  # fmt: skip
    data = agent_dataset()
    trainer = GRPOTrainer(
        tool_chat_model(tok),
        answered,
        args,
        data,
        eval_dataset=data,
        processing_class=tok,
        tools=[multiply, async_add],
    )
    trainer.train()
    check("grpo_agent", record_of(Path(args.output_dir)))


QUICKSTART = ["--task", "agent", "--preset", "test", "--report_to", "none", "--num_sample_generations", "1"]
QUICKSTART_FLAGS = {
    "grpo": ["--max_steps", "2", "--per_device_train_batch_size", "8", "--num_generations", "4",
             "--gradient_accumulation_steps", "1"],
    "ppo": ["--total_episodes", "16", "--per_device_train_batch_size", "8", "--local_rollout_forward_batch_size", "8",
            "--num_ppo_epochs", "1"],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_agent_quickstart(algorithm, tmp_path):
    # the built-in agent task: the calculator in PPO's and GRPO's episodes, and greedy evaluation episodes with it
    run_dir = tmp_path / "qs"
    argv = ["--algorithm", algorithm, "--output_dir", str(run_dir), *QUICKSTART, *QUICKSTART_FLAGS[algorithm]]
    assert cmd_quickstart(argv) == 0
    check(f"agent_quickstart_{algorithm}", record_of(run_dir, (AGENT_EVAL_FILE, "before_after.json")))
