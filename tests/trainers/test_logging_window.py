"""The logging window, the same for both trainers (rlhfkit/trainers/run.py): with --logging_steps N a row pools every
sum and count added during the N steps since the previous row.

Each test trains the same seeded run twice, logging every step and every second step. From the first run we keep
the raw sums, counts and extremes of every step (the accumulator's state just before each row is reduced); pooling
those of steps 2k-1 and 2k with the registry's formulas, written out here, must give row k of the second run.
"""

import json
import math
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.metrics.registry import REGISTRY, expand, is_template
from rlhfkit.trainers.build import build_grpo_trainer, build_ppo_trainer
from tests.helpers import MACHINE_METRICS
from tests.trainers.test_grpo import grpo_config
from tests.trainers.test_ppo import small_config
from tests.trainers.test_strategies import small_prompts

WALL_CLOCK = {"eps", "time/rollout", "time/optimization", "step_time"} | MACHINE_METRICS


def reduction(name):
    metric = REGISTRY.get(name)
    if metric is None:  # a per-reward-function expansion such as rewards/correctness/mean
        template = next(m for m in REGISTRY.values() if is_template(m) and expand(m, name.split("/")[1]).name == name)
        return template.reduction
    return metric.reduction


def pooled_row(states):
    """The logged value of every metric of a window, from the raw per-step states (independent of the accumulator:
    sums and counts added first, then the formulas of docs/metrics.md)."""
    sums, extremes = {}, {}
    for state in states:
        for name, (total, count, total_sq) in state["pooled"].items():
            t, c, q = sums.get(name, (0.0, 0.0, 0.0))
            sums[name] = (t + total, c + count, q + total_sq)
        for name, value in state["extreme"].items():  # None: added, but only empty selections
            extremes.setdefault(name, []).extend([] if value is None else [value])
    row = {name: (min if reduction(name) == "min" else max)(v) if v else 0.0 for name, v in extremes.items()}
    for name, (total, count, total_sq) in sums.items():
        kind = reduction(name)
        if kind == "sum":
            row[name] = total
        elif kind == "mean":
            row[name] = total / count if count else 0.0
        else:
            var = (total_sq - total * total / count) / (count - 1) if count >= 2 else 0.0
            row[name] = max(var, 0.0) if kind == "var" else math.sqrt(max(var, 0.0))
    return row


def train(trainer):
    """Train; return (training rows of metrics.jsonl, per-step raw states, histograms logged per row)."""
    run = trainer.run
    run.begin()  # opens the logger wrapped below (train() would)
    states, histograms = [], []
    reduce, log_histograms = run.metrics.reduce, run.logger.log_histograms

    def recording_reduce(*args):
        states.append(run.metrics.state_dict())
        return reduce(*args)

    def recording_histograms(values, step):
        histograms.append({k: np.asarray(v) for k, v in values.items()})
        return log_histograms(values, step=step)

    run.metrics.reduce, run.logger.log_histograms = recording_reduce, recording_histograms
    trainer.train()
    with open(os.path.join(trainer.args.output_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if "episode" in r], states, histograms


def check_window_of_two(make_trainer, tmp_path, last_metrics, weights_file):
    """Health checks are off in these runs: their health/* counts depend on which rows they saw."""
    every, every_states, every_histograms = train(make_trainer(tmp_path / "every", logging_steps=1))
    pairs, _, pair_histograms = train(make_trainer(tmp_path / "pairs", logging_steps=2))
    assert [r["step"] for r in every] == [1, 2, 3, 4] and [r["step"] for r in pairs] == [2, 4]

    # The two runs trained alike (logging does not touch training; the adaptive KL uses each update's own KL).
    a, b = load_file(tmp_path / "every" / weights_file), load_file(tmp_path / "pairs" / weights_file)
    assert all(torch.equal(a[k], b[k]) for k in a)

    for k, row in enumerate(pairs):
        first, second = every[2 * k], every[2 * k + 1]
        # The raw states reproduce the rows logged every step, and their pool is the row of the pair.
        for state, logged in ((every_states[2 * k], first), (every_states[2 * k + 1], second)):
            for name, value in pooled_row([state]).items():
                assert logged[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name  # wall clock included
        expected = pooled_row(every_states[2 * k : 2 * k + 2])
        assert set(row) - set(expected) - set(last_metrics) - WALL_CLOCK == {"step", "nonfinite_steps"}
        for name, value in expected.items():
            if name not in WALL_CLOCK:  # pooled like the others, but seconds differ from run to run
                assert row[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
        # Values at a step are those of the window's last step; counters add up.
        for name in last_metrics:
            assert row[name] == second[name], name
        assert row["nonfinite_steps"] == first["nonfinite_steps"] + second["nonfinite_steps"]
        # Histograms hold the values of both steps.
        assert pair_histograms[k].keys() == every_histograms[2 * k].keys()
        for name, values in pair_histograms[k].items():
            both = np.concatenate([every_histograms[2 * k][name], every_histograms[2 * k + 1][name]])
            np.testing.assert_array_equal(values, both)


def test_ppo_row_pools_the_updates_of_its_window(tiny_assets, tmp_path):
    def make_trainer(out, logging_steps):
        args = small_config(
            tiny_assets, tmp_path, output_dir=str(out), total_episodes=64, kl_target=0.5, logging_steps=logging_steps,
            num_sample_generations=0, health="off",
        )  # fmt: skip
        return build_ppo_trainer(args)

    last = ["lr", "episode", "epoch", "objective/kl_coef"]
    check_window_of_two(make_trainer, tmp_path, last, "model.safetensors")


def test_grpo_row_pools_the_steps_of_its_window(tiny_assets, tmp_path):
    def make_trainer(out, logging_steps):
        args = grpo_config(
            tiny_assets, tmp_path, output_dir=str(out), max_steps=4, num_iterations=2, beta=0.04,
            logging_steps=logging_steps, health="off",
        )  # fmt: skip
        return build_grpo_trainer(args, set())

    last = ["lr", "learning_rate", "episode", "epoch", "num_tokens"]
    check_window_of_two(make_trainer, tmp_path, last, "model.safetensors")


def test_skipped_steps_add_up_over_the_window(tiny_assets, tmp_path, monkeypatch):
    """nonfinite_steps counts the skipped optimizer steps of the whole window, not of its last step."""
    args = small_config(
        tiny_assets, tmp_path, total_episodes=64, num_mini_batches=1, num_ppo_epochs=1, logging_steps=2,
        num_sample_generations=0, max_nonfinite_steps=4,
    )  # fmt: skip
    trainer = build_ppo_trainer(args)
    acc, calls = trainer.accelerator, []
    clip = acc.clip_grad_norm_

    def nonfinite_on_updates_1_2_and_3(parameters, max_norm):
        calls.append(1)
        norm = clip(parameters, max_norm)
        return torch.tensor(float("nan")) if len(calls) in (1, 2, 3) else norm  # one optimizer step per update

    monkeypatch.setattr(acc, "clip_grad_norm_", nonfinite_on_updates_1_2_and_3)
    trainer.train()
    with open(os.path.join(trainer.args.output_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [(r["step"], r["nonfinite_steps"]) for r in rows if "episode" in r] == [(2, 2), (4, 1)]


def test_first_step_and_epoch_rows_pool_their_own_steps(tiny_assets, tmp_path):
    """--logging_strategy epoch --logging_first_step: a row after update 1, at the end of the first pass (update 3:
    40 prompts, 16 per update) and after the last update; each pools the updates since the previous row."""
    data = small_prompts(tiny_assets, tmp_path / "prompts", train=40, test=8)

    def make_trainer(out, **logging):
        args = small_config(
            tiny_assets, tmp_path, output_dir=str(out), dataset_name=data, total_episodes=64, num_ppo_epochs=1,
            num_sample_generations=0, health="off", **logging,
        )  # fmt: skip
        return build_ppo_trainer(args)

    every, every_states, _ = train(make_trainer(tmp_path / "every", logging_steps=1))
    rows, _, _ = train(make_trainer(tmp_path / "epoch", logging_strategy="epoch", logging_first_step=True))
    assert [r["step"] for r in every] == [1, 2, 3, 4] and [r["step"] for r in rows] == [1, 3, 4]
    for row, (first, last) in zip(rows, [(0, 1), (1, 3), (3, 4)]):
        for name, value in pooled_row(every_states[first:last]).items():
            if name not in WALL_CLOCK:
                assert row[name] == pytest.approx(value, rel=1e-9, abs=1e-12), (row["step"], name)
        assert row["lr"] == every[last - 1]["lr"] and row["episode"] == every[last - 1]["episode"]


def test_the_window_still_open_at_the_end_is_merged_into_the_summary_row(tiny_assets, tmp_path):
    # 3 steps logged every 2: step 3's window has no row of its own, and TRL's log() merges it into the summary row,
    # which log_history[-1], metrics.jsonl and the callbacks (on_log) all get; its numbers are those of the row step 3
    # gets when every step is logged.
    from transformers import TrainerCallback

    class Logs(TrainerCallback):
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs))

    def run(out, logging_steps):
        args = grpo_config(tiny_assets, tmp_path, output_dir=str(out), max_steps=3, logging_steps=logging_steps)
        trainer = build_grpo_trainer(args, set())
        trainer.add_callback(callback := Logs())
        output = trainer.train()
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return trainer, output, [json.loads(line) for line in f], callback.logs

    every = run(tmp_path / "every", 1)[2]
    trainer, output, rows, logs = run(tmp_path / "pairs", 2)
    assert [r["step"] for r in rows] == [2, 3]
    summary = trainer.state.log_history[-1]
    assert summary == rows[-1] and logs[-1] == {k: v for k, v in summary.items() if k != "step"}
    assert summary["train_loss"] == output.training_loss
    assert {"train_runtime", "train_samples_per_second", "total_flos", "epoch"} <= summary.keys()
    step_3 = every[2]  # logging every step: step 3's own row (its window is the same single step)
    assert step_3["step"] == 3 and "train_loss" not in step_3
    for name in ("reward", "reward_std", "rewards/partial_credit/mean", "loss", "entropy", "completions/mean_length",
                 "rollout/task_success", "episode", "lr"):  # fmt: skip
        assert summary[name] == step_3[name], name
    assert set(step_3) - WALL_CLOCK - {"health/warnings", "health/critical"} <= set(summary)
    # logging every step, the last window has its own row and the summary row is transformers' alone
    assert set(every[-1]) == {"step", "train_runtime", "train_samples_per_second", "train_steps_per_second",
                              "total_flos", "train_loss", "epoch"}  # fmt: skip
