"""perf/ metrics of real GRPO and PPO runs on the tiny built-in task: perf/mfu and perf/training_tokens_per_s equal
their formulas recomputed from the training forwards the policy actually ran (seen by a hook on it, not by the
trainer's own count), and the per-phase peak memory is logged where it is measured."""

import collections
import os
import sys

import pytest
import torch

from rlhfkit import perf
from rlhfkit.metrics import registry as M
from rlhfkit.trainers.build import build_grpo_trainer, build_ppo_trainer
from tests.trainers.test_grpo import grpo_config, read_jsonl
from tests.trainers.test_ppo import small_config

PEAK_TFLOPS = 0.5  # a made-up CPU peak: the run's MFU is then flops / (seconds x 0.5e12)
MEMORY = [M.PERF_PEAK_MEMORY_ROLLOUT.name, M.PERF_PEAK_MEMORY_OPTIMIZATION.name]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU peak RSS is Linux's VmHWM")


def train_watching(trainer, policy):
    """Train; returns the logged training rows and, per step, the (B, L) attention masks of the policy's forwards
    that had a gradient (the training forwards)."""
    masks = collections.defaultdict(list)

    def hook(module, args, kwargs):
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            masks[trainer.run.progress.step + 1].append(kwargs["attention_mask"].detach().clone())

    handle = policy.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        trainer.train()
    finally:
        handle.remove()
    rows = [r for r in read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl")) if M.LR.name in r]
    return rows, masks


def check_perf_rows(rows, masks, model, forwards_per_step):
    assert [r["step"] for r in rows] == sorted(masks)  # logging_steps 1: one row per step
    for row in rows:
        step_masks = masks[row["step"]]
        assert len(step_masks) == forwards_per_step
        lengths = torch.cat([m.sum(-1) for m in step_masks]).tolist()
        assert min(lengths) > 0 and all(m.shape[1] > min(lengths) for m in step_masks)  # padding is left out
        seconds = row[M.TIME_OPTIMIZATION.name]  # one step, one process: the phase's seconds
        assert seconds > 0
        tokens = sum(lengths)
        assert row[M.PERF_TRAINING_TOKENS_PER_S.name] == pytest.approx(tokens / seconds, rel=1e-9)
        # 3 x (forward FLOPs), each sequence at its own mean causal context (n + 1) / 2; F evaluated directly
        flops = 3 * sum(n * perf.forward_flops_per_token(model, (n + 1) / 2) for n in lengths)
        assert row[M.PERF_MFU.name] == pytest.approx(flops / (seconds * PEAK_TFLOPS * 1e12), rel=1e-9)
        assert 0 < row[M.PERF_MFU.name] < 1  # a tiny model on a CPU uses a small share of even 0.5 TFLOP/s
        if sys.platform.startswith("linux"):
            for name in MEMORY:
                # the whole process's peak RSS (torch and transformers loaded): far above 10 MB, far below 100 GB
                assert 0.01 < row[name] < 100, (name, row[name])


@pytest.fixture
def measured(monkeypatch):
    monkeypatch.setenv(perf.PEAK_TFLOPS_ENV, str(PEAK_TFLOPS))
    monkeypatch.setenv(perf.PHASE_MEMORY_ENV, "1")


@linux_only
def test_grpo_logs_mfu_tokens_and_phase_memory(tiny_assets, tmp_path, measured):
    args = grpo_config(tiny_assets, tmp_path, reward_funcs=["partial_credit"], max_steps=2, num_iterations=2)
    trainer = build_grpo_trainer(args, explicit={"reward_funcs"})
    rows, masks = train_watching(trainer, trainer.policy)
    # per step: gradient_accumulation_steps micro-batch forwards (a generation serves num_iterations of them)
    check_perf_rows(rows, masks, trainer.policy, forwards_per_step=args.gradient_accumulation_steps)


@linux_only
def test_ppo_logs_mfu_tokens_and_phase_memory(tiny_assets, tmp_path, measured):
    args = small_config(tiny_assets, tmp_path, total_episodes=32, logging_steps=1, num_sample_generations=0)
    trainer = build_ppo_trainer(args)
    rows, masks = train_watching(trainer, trainer.policy)
    # per update: num_ppo_epochs x micro-batches of a rollout batch; each ran the policy and the value model
    per_update = args.num_ppo_epochs * args.gradient_accumulation_steps
    both = trainer.accelerator.unwrap_model(trainer.model)
    assert perf.forward_flops_per_token(both, 1.0) > perf.forward_flops_per_token(trainer.policy, 1.0)
    check_perf_rows(rows, masks, both, forwards_per_step=per_update)


def test_without_a_peak_or_phase_memory_neither_is_logged(tiny_assets, tmp_path, monkeypatch):
    """A float32 CPU run: no peak to divide by, and the CPU's peak RSS is left alone unless asked for."""
    monkeypatch.delenv(perf.PEAK_TFLOPS_ENV, raising=False)
    monkeypatch.delenv(perf.PHASE_MEMORY_ENV, raising=False)
    args = grpo_config(tiny_assets, tmp_path, reward_funcs=["partial_credit"], max_steps=1)
    trainer = build_grpo_trainer(args, explicit={"reward_funcs"})
    if trainer.accelerator.device.type != "cpu":
        pytest.skip("on CUDA the phase memory is measured by default")
    rows, _ = train_watching(trainer, trainer.policy)
    logged = set().union(*rows)
    assert M.PERF_TRAINING_TOKENS_PER_S.name in logged
    assert not logged & {M.PERF_MFU.name, *MEMORY}


@pytest.mark.parametrize("name,value", [(perf.PEAK_TFLOPS_ENV, "fast"), (perf.PHASE_MEMORY_ENV, "yes")])
def test_a_bad_setting_stops_the_run_before_it_begins(tiny_assets, tmp_path, monkeypatch, name, value):
    from rlhfkit.errors import ConfigError

    monkeypatch.setenv(name, value)
    args = grpo_config(tiny_assets, tmp_path, reward_funcs=["partial_credit"], max_steps=1)
    with pytest.raises(ConfigError, match=name):
        build_grpo_trainer(args, explicit={"reward_funcs"})


def test_without_trim_cpu_heap_the_c_heap_is_left_to_glibc(tiny_assets, tmp_path, monkeypatch):
    """The default: no malloc_trim, no mallopt (each costs time on every step and pays only at large vocabularies)."""
    trims, mapped = [], []
    monkeypatch.setattr(perf, "_malloc_trim", lambda: trims.append)
    monkeypatch.setattr(perf, "map_large_blocks", lambda: mapped.append(True))
    monkeypatch.setattr(perf, "_LEAN_HEAP", False)
    build_grpo_trainer(grpo_config(tiny_assets, tmp_path, max_steps=2, reward_funcs=["partial_credit"])).train()
    assert trims == [] and mapped == []


def test_with_trim_cpu_heap_the_freed_heap_is_returned_after_sampling_and_before_each_optimizer_step(
    tiny_assets, tmp_path, monkeypatch
):
    """--trim_cpu_heap: large blocks mapped on their own (once) and perf.return_freed_heap (glibc's malloc_trim) run
    once per sampling call and once per optimizer step."""
    trims, mapped = [], []
    monkeypatch.setattr(perf, "_malloc_trim", lambda: trims.append)
    monkeypatch.setattr(perf, "map_large_blocks", lambda: mapped.append(True))
    monkeypatch.setattr(perf, "_LEAN_HEAP", False)  # the flag is the process's: restored after the test
    steps = []
    args = grpo_config(tiny_assets, tmp_path, max_steps=2, reward_funcs=["partial_credit"], trim_cpu_heap=True)
    trainer = build_grpo_trainer(args)
    assert mapped == [True]
    original = trainer.run.optimizer_step

    def optimizer_step(*args, **kwargs):
        before = len(trims)
        original(*args, **kwargs)
        steps.append((before, len(trims)))

    monkeypatch.setattr(trainer.run, "optimizer_step", optimizer_step)
    trainer.train()
    assert [after - before for before, after in steps] == [1, 1]  # the optimizer step's own
    assert steps[0][0] >= 1 and steps[1][0] - steps[0][1] >= 1  # and each step's sampling before it
