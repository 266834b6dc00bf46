"""DAPO dynamic sampling in GRPOTrainer (--dynamic_sampling, --max_num_gen_batches) on the tiny built-in task: the
batch trained on holds only groups with reward spread, extra rounds draw further prompts, the cap fills the batch
with zero-spread groups, a resumed run continues exactly, and a run with nothing to drop is the run without it."""

import os

import pytest
import torch

from rlhfkit import GRPOConfig
from rlhfkit.config import grpo_batch_sizes
from rlhfkit.errors import ConfigError
from rlhfkit.trainers.build import build_grpo_trainer
from tests.helpers import run_two_processes
from tests.trainers.test_grpo import grpo_config, read_jsonl, train_rows, two_process_grpo_command
from tests.trainers.test_resume import assert_same_run, resume_from, rows_of

HERE = "tests.trainers.test_grpo_dynamic_sampling"
DS = (
    "dynamic_sampling/extra_rounds",
    "dynamic_sampling/zero_std_groups_dropped",
    "dynamic_sampling/zero_std_groups_filled",
)


def flat_for_even_prompts(prompts, completions, **kwargs):
    """1.0 for every completion of a prompt whose characters' codes sum to an even number (no spread); 0, 1, 0, 1
    along the completions otherwise (a group of an even size always gets spread)."""
    return [1.0 if sum(map(ord, str(p))) % 2 == 0 else float(i % 2) for i, p in enumerate(prompts)]


def always_spread(prompts, completions, **kwargs):
    return [float(i % 2) for i in range(len(completions))]


def constant(prompts, completions, **kwargs):
    return [1.0] * len(completions)


def config(assets, tmp_path, reward, **overrides):
    overrides = {"dynamic_sampling": True, **overrides}
    return grpo_config(assets, tmp_path, reward_funcs=[f"{HERE}:{reward}"], **overrides)


def samples(output_dir):
    return read_jsonl(os.path.join(output_dir, "samples.jsonl"))


def is_flat(prompt):
    return sum(map(ord, prompt)) % 2 == 0


def test_defaults_and_config_checks():
    defaults = GRPOConfig()
    assert (defaults.dynamic_sampling, defaults.max_num_gen_batches) == (False, 10)
    with pytest.raises(ConfigError, match=r"max_num_gen_batches=1 with dynamic_sampling.*0 \(no cap\) or >= 2"):
        GRPOConfig(dynamic_sampling=True, max_num_gen_batches=1)
    GRPOConfig(max_num_gen_batches=1)  # no effect without dynamic_sampling
    with pytest.raises(ConfigError, match="max_num_gen_batches=-1"):
        GRPOConfig(max_num_gen_batches=-1)
    # 2 processes x 2 completions: the generation holds whole groups of 4, each process's half does not.
    args = GRPOConfig(per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=1, max_steps=1)
    args.per_device_train_batch_size = 2  # a layout that only 2 processes make whole groups of
    assert grpo_batch_sizes(args, 2, 10).completions == 4
    args.dynamic_sampling = True
    with pytest.raises(ConfigError, match="a group would span two processes.*--steps_per_generation 2"):
        grpo_batch_sizes(args, 2, 10)


@pytest.fixture(scope="module")
def run(tiny_assets, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dynamic")
    args = config(tiny_assets, tmp, "flat_for_even_prompts", max_steps=4, log_completions=True)
    trainer = build_grpo_trainer(args, {"reward_funcs"})
    trainer.train()
    return trainer, train_rows(read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")))


def test_every_kept_group_has_spread(run):
    trainer, rows = run
    table = samples(trainer.args.output_dir)
    assert len(table) == 16 * len(rows)  # a full batch every step
    for start in range(0, len(table), 4):
        group = table[start : start + 4]
        assert len({s["prompt"] for s in group}) == 1 and not is_flat(group[0]["prompt"])
        assert len({s["flat_for_even_prompts"] for s in group}) > 1
        assert sum(s["advantage"] for s in group) == pytest.approx(0.0, abs=1e-5)
        assert all(abs(s["advantage"]) > 0.5 for s in group)


def test_metrics_count_every_generated_group(run):
    trainer, rows = run
    episode = 0
    for row in rows:
        assert set(DS) <= set(row)
        rounds = 1 + row["dynamic_sampling/extra_rounds"]
        episode += 16 * rounds
        assert row["episode"] == episode  # every generated completion counts
        # frac_reward_zero_std: over the 4 groups of every round, before the zero-spread ones were dropped
        zero_groups = row["frac_reward_zero_std"] * 4 * rounds
        assert zero_groups == pytest.approx(row["dynamic_sampling/zero_std_groups_dropped"])
        assert row["dynamic_sampling/zero_std_groups_filled"] == 0
    assert sum(r["dynamic_sampling/extra_rounds"] for r in rows) > 0  # some batch needed another round
    assert trainer.run.progress.generations == episode // 16  # prompt batches drawn: the data position


def test_cap_fills_the_batch_and_the_run_goes_on(tiny_assets, tmp_path):
    args = config(tiny_assets, tmp_path, "constant", max_steps=2, max_num_gen_batches=3)
    build_grpo_trainer(args, {"reward_funcs"}).train()
    rows = train_rows(read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")))
    for step, row in enumerate(rows, 1):
        assert row["dynamic_sampling/extra_rounds"] == 2
        assert row["dynamic_sampling/zero_std_groups_filled"] == 4  # the whole batch: no group had spread
        assert row["dynamic_sampling/zero_std_groups_dropped"] == 8
        assert row["frac_reward_zero_std"] == 1.0
        assert row["episode"] == 3 * 16 * step
        assert row["loss"] == 0.0


def test_nothing_to_drop_trains_as_without_dynamic_sampling(tiny_assets, tmp_path):
    """Every group has spread: the first round is the batch, so the run is the run without dynamic sampling, bit
    for bit, apart from the dynamic_sampling/* metrics (all 0). Without it, they are not logged."""
    logged, weights = {}, {}
    for on in (False, True):
        args = config(tiny_assets, tmp_path / str(on), "always_spread", dynamic_sampling=on, beta=0.04)
        trainer = build_grpo_trainer(args, {"reward_funcs"})
        trainer.train()
        logged[on] = rows_of(args.output_dir)
        weights[on] = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    assert all(not set(DS) & set(r) for r in logged[False])
    for row in logged[True]:
        if "loss" in row:
            assert [row.pop(name) for name in DS] == [0, 0, 0]
    assert logged[True] == logged[False]
    assert all(torch.equal(weights[True][k], weights[False][k]) for k in weights[False])


def test_resumes_exactly(tiny_assets, tmp_path):
    def make_config(out, **extra):
        # The checkpoint after step 3 holds a batch made of several rounds that still serves step 4 (num_iterations
        # 2), and the prompt order must continue after every prompt batch the extra rounds drew.
        return config(
            tiny_assets, tmp_path, "flat_for_even_prompts", output_dir=str(out), max_steps=6, num_iterations=2,
            save_steps=3, beta=0.04, **extra,
        )  # fmt: skip

    original = tmp_path / "original"
    build_grpo_trainer(make_config(original), {"reward_funcs"}).train()
    resumed = resume_from(original, 3, tmp_path, make_config, build_grpo_trainer)
    rows = [r for r in rows_of(original) if "loss" in r]
    assert sum(r.get("dynamic_sampling/extra_rounds", 0) for r in rows[3:]) > 0  # after the checkpoint too
    assert_same_run(original, resumed, ["model.safetensors"])


@pytest.mark.slow
def test_two_processes(tiny_assets, tmp_path):
    """Under accelerate launch with 2 CPU processes each process keeps whole groups of its own completions; every
    process's completions table holds only groups with spread, and the metrics count both processes' groups."""
    out = tmp_path / "run"
    command = two_process_grpo_command(tiny_assets, out, f"{HERE}:flat_for_even_prompts")
    run_two_processes([*command, "--dynamic_sampling", "--log_completions"], tmp_path)
    rows = train_rows(read_jsonl(out / "metrics.jsonl"))
    assert len(rows) == 2
    episode = 0
    for row in rows:
        rounds = 1 + row["dynamic_sampling/extra_rounds"]
        episode += 16 * rounds  # 2 processes x 8 completions a round
        assert row["episode"] == episode
        zero_groups = row["frac_reward_zero_std"] * 4 * rounds
        assert zero_groups == pytest.approx(row["dynamic_sampling/zero_std_groups_dropped"])
    assert sum(r["dynamic_sampling/extra_rounds"] for r in rows) > 0
    table = samples(out)
    assert len(table) == 2 * 8 and not any(is_flat(s["prompt"]) for s in table)  # the main process's share
