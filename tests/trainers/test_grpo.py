"""End-to-end GRPO runs on the tiny built-in task (test preset): logged metrics checked against the raw rewards."""

import json
import math
import os

import pytest
import torch
from datasets import load_from_disk

from rlhfkit import GRPOConfig, GRPOTrainer
from rlhfkit.errors import RewardFunctionError
from rlhfkit.metrics import registry
from rlhfkit.sampling import decoders
from rlhfkit.tasks import load_task
from rlhfkit.trainers.build import build_grpo_trainer
from tests.helpers import expand_templates, run_two_processes
from tests.trainers import grpo_rewards


def grpo_config(assets, tmp_path, **overrides) -> GRPOConfig:
    values = dict(
        model_name_or_path=str(assets / "sft"),
        dataset_name=str(assets / "prompts"),
        task=str(assets),
        output_dir=str(tmp_path / "run"),
        report_to=["none"],
        learning_rate=1e-3,
        num_generations=4,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        max_steps=3,
        max_completion_length=8,
        logging_steps=1,
        num_sample_generations=0,
        save_steps=0,
        seed=3,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def records(prefix):
    out = []
    for name in sorted(os.listdir(os.path.dirname(prefix))):
        if name.startswith(os.path.basename(prefix) + ".rank"):
            out.append(read_jsonl(os.path.join(os.path.dirname(prefix), name)))
    return out


@pytest.fixture(scope="module")
def run(tiny_assets, tmp_path_factory):
    """Three steps with two weighted rewards, beta > 0, one recording its calls; metrics.jsonl rows and records."""
    tmp = tmp_path_factory.mktemp("grpo")
    record = str(tmp / "calls")
    os.environ["RLHFKIT_TEST_RECORD"] = record
    try:
        args = grpo_config(
            tiny_assets,
            tmp,
            reward_funcs=["correctness", "tests.trainers.grpo_rewards:recorded_length"],
            reward_weights=[1.0, 0.5],
            beta=0.04,
            num_sample_generations=1,
        )
        trainer = build_grpo_trainer(args, explicit={"reward_funcs"})
        before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
        trainer.train()
    finally:
        del os.environ["RLHFKIT_TEST_RECORD"]
    rows = read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))
    (calls,) = records(record)  # one process
    return trainer, rows, calls, before


def train_rows(rows):
    return [r for r in rows if "loss" in r]


def test_logs_exactly_the_registry_set(run):
    trainer, rows, _, _ = run
    logged = set().union(*(r.keys() for r in rows)) - {"step"}
    expected = expand_templates(registry.metrics_for("grpo"), ["correctness", "recorded_length"])
    # logged by loss_type cispo / vespo only, with entropy regularisation only, and with dynamic_sampling only
    not_this_run = {"cispo_clip_ratio", "vespo/phi_seq_mean", "entropy_coef", "policy_loss"}
    not_this_run |= {m.name for m in expected if m.name.startswith("dynamic_sampling/")}
    assert logged == {m.name for m in expected} - not_this_run


def test_length_and_reward_metrics_match_the_raw_calls(run):
    trainer, rows, calls, _ = run
    eos = set(trainer.stop_ids)
    task = load_task(trainer.args.task)
    train_calls = [c for c in calls if len(c["rewards"]) == 16]  # not the evaluation calls (32 eval prompts)
    for row, call in zip(train_rows(rows), train_calls, strict=True):
        ids = call["completion_ids"]
        lengths = [len(c) for c in ids]
        assert row["completions/min_length"] <= row["completions/mean_length"] <= row["completions/max_length"]
        assert row["completions/mean_length"] == pytest.approx(sum(lengths) / len(lengths))
        assert (row["completions/min_length"], row["completions/max_length"]) == (min(lengths), max(lengths))
        truncated = [not (c and c[-1] in eos) for c in ids]
        assert all(len(c) == 8 for c, t in zip(ids, truncated) if t)  # truncated = hit max_completion_length
        assert row["completions/clipped_ratio"] == pytest.approx(sum(truncated) / len(ids))
        lengths_t = [n for n, t in zip(lengths, truncated) if not t]
        assert row["completions/mean_terminated_length"] == pytest.approx(sum(lengths_t) / len(lengths_t))
        # rewards/<name>/mean is the raw, unweighted mean; reward applies reward_weights [1.0, 0.5].
        length_reward = call["rewards"]
        assert row["rewards/recorded_length/mean"] == pytest.approx(sum(length_reward) / len(length_reward))
        correct = row["rewards/correctness/mean"]
        assert row["reward"] == pytest.approx(correct + 0.5 * row["rewards/recorded_length/mean"])
        assert row["reward"] != pytest.approx(correct + row["rewards/recorded_length/mean"])
        assert row["rollout/task_success"] == pytest.approx(correct)  # the task's check is the correctness reward
        # The dataset's other columns arrive as keyword arguments, one value per completion.
        assert call["answer"] == [task.answer(p) for p in call["prompts"]]
        assert call["prompts"][:4] == [call["prompts"][0]] * 4  # a group: one prompt, num_generations completions


def test_invariants_on_every_step(run):
    trainer, rows, _, before = run
    for r in train_rows(rows):
        assert all(math.isfinite(v) for v in r.values()), r
        assert r["episode"] == r["step"] * 16  # 8 completions x 2 accumulation steps per generation
        # Each batch is used once (num_iterations = 1): logp_old = logp, so nothing is clipped.
        for name in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/high_max"):
            assert r[name] == 0.0
        assert r["kl"] >= 0 and r["entropy"] > 0
        assert 0 <= r["frac_reward_zero_std"] <= 1
    steps = train_rows(rows)
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the first step's policy is the reference
    assert steps[-1]["num_tokens"] > steps[0]["num_tokens"] > 0
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert os.path.exists(os.path.join(trainer.args.output_dir, "model.safetensors"))


def test_completions_table_has_rewards_and_advantages(run):
    trainer, _, _, _ = run
    samples = read_jsonl(os.path.join(trainer.args.output_dir, "samples.jsonl"))
    assert {"prompt", "completion", "correctness", "recorded_length", "advantage"} <= set(samples[0])
    # Group-relative advantages: within each group of 4 the advantages sum to 0.
    for g in range(0, 16, 4):
        assert sum(s["advantage"] for s in samples[g : g + 4]) == pytest.approx(0.0, abs=1e-5)


def test_reused_batches_get_clipped(tiny_assets, tmp_path):
    """num_iterations = 3 at a large learning rate: the 2nd and 3rd steps on a batch move the ratio past the bounds."""
    args = grpo_config(
        tiny_assets, tmp_path, num_iterations=3, max_steps=3, learning_rate=5e-2, epsilon=0.05, max_grad_norm=None,
        reward_funcs=["partial_credit"], scale_rewards="none",
    )  # fmt: skip
    build_grpo_trainer(args, explicit={"reward_funcs"}).train()
    rows = train_rows(read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")))
    assert rows[0]["clip_ratio/region_mean"] == 0.0  # the first step on a batch: ratio exactly 1
    assert max(r["clip_ratio/region_mean"] for r in rows[1:]) > 0
    for r in rows:
        assert r["clip_ratio/region_mean"] == pytest.approx(r["clip_ratio/low_mean"] + r["clip_ratio/high_mean"])
        assert 0 <= r["clip_ratio/low_min"] <= r["clip_ratio/low_mean"] or r["clip_ratio/low_mean"] == 0
        assert r["clip_ratio/high_max"] >= r["clip_ratio/high_mean"]
    assert [r["episode"] for r in rows] == [16, 16, 16]  # one generation serves three steps


def test_static_cache_trains_as_the_dynamic_cache(tiny_assets, tmp_path):
    """--cache_implementation static (TRL's flag): the compiled decoder samples the same completions, so the run
    logs the same rewards and lengths, and the same losses up to float rounding."""
    logged = {}
    for implementation in ("dynamic", "static"):
        args = grpo_config(tiny_assets, tmp_path / implementation, cache_implementation=implementation)
        trainer = build_grpo_trainer(args)
        trainer.train()
        logged[implementation] = train_rows(read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")))
        compiled = trainer.accelerator.unwrap_model(trainer.model) in decoders._STATIC_STEPS
        assert compiled == (implementation == "static")
    for dynamic, static in zip(logged["dynamic"], logged["static"], strict=True):
        for key in ("reward", "completions/mean_length", "num_tokens"):
            assert static[key] == dynamic[key], key
        assert static["loss"] == pytest.approx(dynamic["loss"], abs=1e-5)


def test_python_api_with_callables_and_none_rewards(tiny_assets, tmp_path):
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    args = grpo_config(tiny_assets, tmp_path, max_steps=1, reward_weights=[1.0, 2.0])
    trainer = GRPOTrainer(
        model=str(tiny_assets / "sft"),
        reward_funcs=[grpo_rewards.half_none, str(tiny_assets / "reward")],
        args=args,
        train_dataset=dataset["train"],
    )
    assert trainer.rewards.names == ["half_none", "reward"]
    trainer.train()
    (row,) = train_rows(read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")))
    assert row["rewards/half_none/mean"] == 1.0  # None (odd completions) is left out, not counted as 0
    assert row["rewards/half_none/std"] == 0.0
    assert math.isfinite(row["rewards/reward/mean"])


@pytest.mark.parametrize(
    "name, message",
    [
        ("raises", "'raises' raised RuntimeError: the grader is down"),
        ("too_short", "'too_short' returned 15 values for 16 completions"),
        ("not_a_number", "'not_a_number' returned 'good' (str) for completion 0"),
    ],
)
def test_bad_reward_functions_are_named(tiny_assets, tmp_path, name, message):
    args = grpo_config(tiny_assets, tmp_path, max_steps=1)
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    trainer = GRPOTrainer(str(tiny_assets / "sft"), getattr(grpo_rewards, name), args, train_dataset=dataset["train"])
    with pytest.raises(RewardFunctionError) as info:
        trainer.train()
    assert message in str(info.value)


def two_process_grpo_command(assets, out, reward_func: str) -> list[str]:
    """`rlhfkit grpo` for a 2-process launch: 2 steps of 2 groups of 4 completions per process, every step logged."""
    return [
        "grpo",
        "--model_name_or_path", str(assets / "sft"), "--dataset_name", str(assets / "prompts"),
        "--output_dir", str(out), "--report_to", "none", "--num_generations", "4",
        "--per_device_train_batch_size", "8", "--max_steps", "2", "--max_completion_length", "8",
        "--num_sample_generations", "0", "--logging_steps", "1", "--save_steps", "0", "--scale_rewards", "batch",
        "--reward_funcs", reward_func,
    ]  # fmt: skip


@pytest.mark.slow
def test_two_processes_pool_metrics(tiny_assets, tmp_path):
    """Under accelerate launch with 2 CPU processes every logged number pools both processes' completions."""
    out, record = tmp_path / "run", str(tmp_path / "calls")
    command = two_process_grpo_command(tiny_assets, out, "tests.trainers.grpo_rewards:recorded_length")
    run_two_processes(command, tmp_path, RLHFKIT_TEST_RECORD=record)
    rows = train_rows(read_jsonl(out / "metrics.jsonl"))
    per_rank = records(record)
    assert len(per_rank) == 2 and all(len(calls) == 2 for calls in per_rank)
    for step, row in enumerate(rows):
        calls = [calls[step] for calls in per_rank]  # this step's call on each process
        rewards = [r for c in calls for r in c["rewards"]]
        lengths = [len(ids) for c in calls for ids in c["completion_ids"]]
        assert len(rewards) == 16 and row["episode"] == 16 * (step + 1)  # 2 processes x 8 completions
        assert row["rewards/recorded_length/mean"] == pytest.approx(sum(rewards) / 16)
        assert row["reward_std"] == pytest.approx(torch.tensor(rewards, dtype=torch.float64).std().item())
        assert row["completions/mean_length"] == pytest.approx(sum(lengths) / 16)
        assert (row["completions/min_length"], row["completions/max_length"]) == (min(lengths), max(lengths))
        prompts = [c["prompts"] for c in calls]
        assert prompts[0] != prompts[1]  # each process sampled its own share of the prompts
