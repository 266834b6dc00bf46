"""Precision and memory options on the built-in tiny task: mixed precision through accelerate (bf16 autocast works on
CPU), pure low-precision weights (--dtype), gradient checkpointing, and fp16's loss scaling in the step guard."""

import copy
import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhfkit.cli import main
from rlhfkit.models import enable_gradient_checkpointing, load_scalar_model, policy_logits, token_values
from rlhfkit.trainers.build import build_grpo_trainer, build_ppo_trainer
from rlhfkit.trainers.guards import StepGuard
from tests.helpers import asset_flags
from tests.trainers.test_grpo import grpo_config
from tests.trainers.test_ppo import small_config


def is_checkpointing(model) -> bool:
    """transformers' is_activation_checkpointing (is_gradient_checkpointing before 5.24, deprecated since)."""
    on = getattr(model, "is_activation_checkpointing", None)
    return bool(on if on is not None else model.is_gradient_checkpointing)


def update_rows(output_dir):
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return [row for row in map(json.loads, f) if "episode" in row]


def first_ratio_config(tiny_assets, tmp_path, **precision):
    """One PPO epoch of one mini-batch per update: every ratio is taken before the update's only optimizer step."""
    return small_config(
        tiny_assets, tmp_path, num_ppo_epochs=1, num_mini_batches=1, total_episodes=32, num_sample_generations=0,
        health="off", **precision,
    )  # fmt: skip


def test_bf16_is_autocast_over_fp32_weights_and_the_first_ratio_stays_near_one(tiny_assets, tmp_path):
    """--bf16 is mixed precision: fp32 master weights, the forwards in bf16. Rollout and update run under the same
    autocast; their log-probs still differ by bf16 rounding (different padding per chunk), measured ~1e-2."""
    trainer = build_ppo_trainer(first_ratio_config(tiny_assets, tmp_path, bf16=True))
    assert trainer.accelerator.mixed_precision == "bf16"
    seen = []
    policy = trainer.unwrapped.policy
    policy.lm_head.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    trainer.train()
    assert torch.bfloat16 in seen and all(p.dtype == torch.float32 for p in trainer.unwrapped.parameters())
    for row in update_rows(trainer.args.output_dir):
        assert row["val/ratio"] == pytest.approx(1.0, abs=2e-2)
        assert row["policy/clipfrac_avg"] < 0.05


def test_dtype_bfloat16_trains_pure_bf16_weights(tiny_assets, tmp_path):
    trainer = build_ppo_trainer(first_ratio_config(tiny_assets, tmp_path, dtype="bfloat16"))
    assert trainer.accelerator.mixed_precision == "no"
    assert all(p.dtype == torch.bfloat16 for p in trainer.unwrapped.parameters())
    trainer.train()
    for row in update_rows(trainer.args.output_dir):  # rollout log-probs recomputed by a full forward
        assert row["val/ratio"] == pytest.approx(1.0, abs=1e-2)


def test_grpo_runs_under_bf16_autocast(tiny_assets, tmp_path):
    trainer = build_grpo_trainer(grpo_config(tiny_assets, tmp_path, bf16=True, num_iterations=2, max_steps=2), set())
    trainer.train()
    rows = [r for r in update_rows(trainer.args.output_dir) if "loss" in r]
    assert len(rows) == 2 and all(abs(v) < float("inf") for r in rows for v in r.values() if isinstance(v, float))


def test_fp16_needs_a_gpu(tiny_assets, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    argv = ["ppo", *asset_flags(tiny_assets), "--output_dir", str(tmp_path / "out"), "--fp16", "--report_to", "none"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--fp16" in err and "needs a CUDA GPU" in err and "--bf16" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def gradients(model, forward):
    model.zero_grad(set_to_none=True)
    forward(model).square().mean().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["policy", "value"])
def test_gradient_checkpointing_gives_the_same_gradients(tiny_assets, kind):
    if kind == "policy":
        model = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft")
        forward = policy_logits
    else:
        model = load_scalar_model(str(tiny_assets / "reward"), torch.float32, "reward_model_path")
        forward = token_values
    ids = torch.randint(3, 40, (4, 12))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :3] = False  # left padding, as the trainers see it
    checkpointed = copy.deepcopy(model)
    enable_gradient_checkpointing(checkpointed)
    model.train(), checkpointed.train()
    plain = gradients(model, lambda m: forward(m, ids, mask))
    recomputed = gradients(checkpointed, lambda m: forward(m, ids, mask))
    assert is_checkpointing(checkpointed) and plain.keys() == recomputed.keys() and plain
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], rtol=0, atol=1e-6)


def test_ppo_and_grpo_with_gradient_checkpointing_train_as_without(tiny_assets, tmp_path):
    """Same seeds, same data: the runs with and without checkpointing log the same losses."""
    rows = {}
    for checkpointing in (False, True):
        out = tmp_path / f"ppo-{checkpointing}"
        args = small_config(tiny_assets, out, gradient_checkpointing=checkpointing, num_sample_generations=0)
        trainer = build_ppo_trainer(args)
        assert is_checkpointing(trainer.unwrapped.policy) == checkpointing
        assert is_checkpointing(trainer.unwrapped.value_model) == checkpointing
        trainer.train()
        rows[checkpointing] = update_rows(args.output_dir)
    for a, b in zip(rows[False], rows[True]):
        for name in ("loss/policy_avg", "loss/value_avg", "val/ratio", "objective/kl"):
            assert b[name] == pytest.approx(a[name], rel=1e-4, abs=1e-7), name
    args = grpo_config(tiny_assets, tmp_path / "grpo", gradient_checkpointing=True, max_steps=2)
    trainer = build_grpo_trainer(args, set())
    assert is_checkpointing(trainer.accelerator.unwrap_model(trainer.model))
    trainer.train()
    assert len([r for r in update_rows(args.output_dir) if "loss" in r]) == 2


class ScalingAccelerator:
    """The two things StepGuard asks of accelerate under --fp16, done as accelerate does them with a GradScaler:
    clip_grad_norm_ unscales first; the prepared optimizer's step is the scaler's step and update."""

    def __init__(self, optimizer, init_scale):
        self.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        self.optimizer = optimizer
        self.optimizer_step_was_skipped = False

    def clip_grad_norm_(self, parameters, max_norm):
        self.scaler.unscale_(self.optimizer)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    def step(self):
        before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer_step_was_skipped = self.scaler.get_scale() < before


def test_fp16_loss_scaling_overflows_are_counted_but_only_a_broken_loss_stops_training():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accelerator = ScalingAccelerator(optimizer, init_scale=4.0)
    stepper = type("Prepared", (), {"step": lambda self: accelerator.step(), "zero_grad": optimizer.zero_grad})()
    guard = StepGuard(max_streak=2)
    x = torch.ones(2, 3)
    # A loss that overflows under the scale, then a finite one: skipped once, no streak, then applied.
    accelerator.scaler.scale(model(x).sum() * 1e38).backward()
    guard.step(accelerator, model, stepper, None)
    assert accelerator.optimizer_step_was_skipped and guard.skipped == 1 and guard.streak == 0
    weight = model.weight.detach().clone()
    accelerator.scaler.scale(model(x).sum()).backward()
    guard.step(accelerator, model, stepper, None)
    assert not accelerator.optimizer_step_was_skipped and not torch.equal(model.weight, weight)
    # A NaN loss: the scaler keeps halving; once the scale is below 1 each skip moves the streak, then it is over.
    while not guard.exhausted:
        accelerator.scaler.scale(model(x).sum() * float("nan")).backward()
        guard.step(accelerator, model, stepper, None)
        assert guard.skipped < 20
    assert accelerator.scaler.get_scale() < 1 and guard.streak == 2


def test_lora_with_gradient_checkpointing_under_bf16(tiny_assets, tmp_path):
    """The three memory options together, as a GPU user would combine them."""
    args = small_config(
        tiny_assets, tmp_path, use_peft=True, gradient_checkpointing=True, bf16=True, num_sample_generations=0
    )
    trainer = build_ppo_trainer(args)
    assert is_checkpointing(trainer.unwrapped.policy)
    trainer.train()
    rows = update_rows(args.output_dir)
    assert len(rows) == 3 and all(abs(v) < float("inf") for r in rows for v in r.values() if isinstance(v, float))


def test_bf16_is_an_on_off_flag_on_the_command_line():
    from rlhfkit.config import PPOConfig
    from rlhfkit.config.parse import parse_config

    assert parse_config(PPOConfig, ["--bf16"], "rlhfkit ppo")[0].bf16 is True
    assert parse_config(PPOConfig, ["--bf16", "false"], "rlhfkit ppo")[0].bf16 is False
    assert parse_config(PPOConfig, [], "rlhfkit ppo")[0].bf16 is None  # the launch config's, else the device's
