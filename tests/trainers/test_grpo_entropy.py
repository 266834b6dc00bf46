"""GRPO's entropy regularisation in the real trainer on the tiny built-in task: the static coefficient changes the loss
and gradient by exactly the bonus, the adaptive controller moves by entropy_coef_delta in the direction the step's
entropy says and is logged as entropy_coef, and its state survives a resume."""

import os

import pytest
import torch

from rlhfkit import GRPOConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.errors import ConfigError
from rlhfkit.models import completion_logits
from rlhfkit.trainers.build import build_grpo_trainer
from tests.trainers.test_grpo import grpo_config, read_jsonl, train_rows
from tests.trainers.test_resume import assert_same_run, resume_from


def test_trl_entropy_flags_parse_with_trl_defaults():
    defaults = GRPOConfig()
    assert (defaults.entropy_coef, defaults.use_adaptive_entropy) == (0.0, False)
    assert (defaults.entropy_coef_min, defaults.entropy_coef_max) == (0.0, 1.0)
    assert (defaults.entropy_coef_delta, defaults.entropy_target) == (0.005, 0.2)
    flags = ["--use_adaptive_entropy", "--entropy_coef", "0.01", "--entropy_coef_max", "0.05"]
    args, explicit = parse_config(GRPOConfig, [*flags, "--entropy_target", "0.3"], "rlhfkit grpo")
    assert (args.use_adaptive_entropy, args.entropy_coef, args.entropy_coef_max, args.entropy_target) == (
        True, 0.01, 0.05, 0.3,
    )  # fmt: skip
    assert {"entropy_coef", "use_adaptive_entropy", "entropy_coef_max", "entropy_target"} <= explicit


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(use_adaptive_entropy=True, entropy_coef_min=0.5, entropy_coef_max=0.1),
         r"entropy_coef_min \(0.5\) is greater than entropy_coef_max \(0.1\).*Swap them"),
        (dict(use_adaptive_entropy=True, entropy_coef=0.0, entropy_coef_min=0.01),
         r"entropy_coef \(0.0\) is outside \[entropy_coef_min, entropy_coef_max\] = \[0.01, 1.0\].*--entropy_coef 0.01"),
        (dict(entropy_coef_delta=-0.1), r"entropy_coef_delta=-0.1: must be a finite number >= 0"),
        (dict(entropy_target=float("inf")), r"entropy_target=inf: must be a finite number >= 0"),
    ],
)  # fmt: skip
def test_entropy_settings_that_contradict_each_other_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(**overrides)
    # the range only binds the adaptive controller
    if overrides.get("use_adaptive_entropy"):
        GRPOConfig(**{**overrides, "use_adaptive_entropy": False})


def reference_entropy(logits, temperature):
    """-sum p log p per position, in float64 (the trainer's own entropy is float32 and computed another way)."""
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def micro_step_gradients(trainer, batch, idx, entropy_coef):
    trainer.model.zero_grad()
    loss = trainer.micro_step(batch, idx, entropy_coef=entropy_coef)
    return loss, {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("top_entropy_quantile", [1.0, 0.5])
def test_static_coefficient_adds_the_bonus_to_loss_and_gradient(tiny_assets, tmp_path, top_entropy_quantile):
    """One micro-batch, with and without the entropy term: loss and gradient differ by -coef x the masked mean
    entropy / gradient_accumulation_steps (over the high-entropy tokens with top_entropy_quantile < 1), the entropy
    computed again here in float64 from the policy's logits."""
    coef, accumulation = 0.3, 2
    args = grpo_config(
        tiny_assets, tmp_path, entropy_coef=coef, loss_type="grpo", max_steps=1,
        gradient_accumulation_steps=accumulation, top_entropy_quantile=top_entropy_quantile,
    )  # fmt: skip
    trainer = build_grpo_trainer(args, set())
    torch.manual_seed(0)
    batch = trainer.generation.generate_and_score([0, 1])
    idx = slice(0, args.per_device_train_batch_size)
    loss_without, grads_without = micro_step_gradients(trainer, batch, idx, None)
    loss_with, grads_with = micro_step_gradients(trainer, batch, idx, coef)

    # The reference: the bonus's own gradient, through a float64 entropy of the same forward.
    trainer.model.zero_grad()
    mask = batch.loss_mask[idx]
    logits = completion_logits(trainer.model, batch.input_ids[idx], batch.attention_mask[idx], batch.prompt_width)
    entropy = reference_entropy(logits, args.temperature)
    tokens = mask
    if top_entropy_quantile < 1.0:
        threshold = torch.quantile(entropy.detach()[mask], 1.0 - top_entropy_quantile)
        tokens = mask & (entropy.detach() >= threshold)
        assert 0 < tokens.sum() < mask.sum()
    mean_entropy = (entropy * tokens).sum() / tokens.sum()
    (mean_entropy / accumulation).backward()
    bonus_grads = {n: p.grad.double() for n, p in trainer.model.named_parameters() if p.grad is not None}

    assert loss_with - loss_without == pytest.approx(-coef * mean_entropy.item() / accumulation, rel=1e-4)
    changed = 0
    for name, grad in grads_with.items():
        expected = grads_without[name].double() - coef * bonus_grads[name]
        torch.testing.assert_close(grad.double(), expected, rtol=1e-4, atol=1e-7)
        changed += not torch.equal(grad, grads_without[name])
    assert changed > 0


def test_static_coefficient_in_a_run_is_logged_and_lowers_the_loss_by_the_bonus(tiny_assets, tmp_path):
    """One micro-batch per step: the first step's loss (same samples, same weights) is lower by coef x the logged
    entropy (the token mean over the same tokens), and entropy_coef is logged on every step."""
    rows = {}
    for coef in (0.0, 0.2):
        args = grpo_config(
            tiny_assets, tmp_path / str(coef), entropy_coef=coef, gradient_accumulation_steps=1, max_steps=2
        )
        build_grpo_trainer(args, set()).train()
        rows[coef] = train_rows(read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")))
    plain, regularised = rows[0.0], rows[0.2]
    assert regularised[0]["entropy"] == pytest.approx(plain[0]["entropy"], rel=1e-6)
    assert regularised[0]["loss"] - plain[0]["loss"] == pytest.approx(-0.2 * plain[0]["entropy"], rel=1e-4)
    assert [r["entropy_coef"] for r in regularised] == [0.2, 0.2]
    assert all("entropy_coef" not in r and "policy_loss" not in r for r in plain)
    # TRL's policy_loss: the loss before the bonus, the plain run's loss on the same samples and weights.
    assert regularised[0]["policy_loss"] == pytest.approx(plain[0]["loss"], rel=1e-5, abs=1e-7)
    for row in regularised:
        assert row["loss"] == pytest.approx(row["policy_loss"] - 0.2 * row["entropy"], rel=1e-4, abs=1e-6)


def adaptive_run(tiny_assets, tmp_path, **overrides):
    """An adaptive run; returns its rows and the coefficient each micro-batch applied."""
    args = grpo_config(tiny_assets, tmp_path, use_adaptive_entropy=True, max_steps=4, **overrides)
    trainer = build_grpo_trainer(args, set())
    applied, micro_step = [], trainer.micro_step

    def recording(batch, idx, fresh=False, entropy_coef=None, entropy_sums=None):
        applied.append(entropy_coef)
        return micro_step(batch, idx, fresh, entropy_coef, entropy_sums)

    trainer.micro_step = recording
    trainer.train()
    return trainer, train_rows(read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))), applied


def test_adaptive_coefficient_rises_below_the_target(tiny_assets, tmp_path):
    """Every step's entropy is below a target of 100 nats: +delta per optimizer step up to entropy_coef_max; the
    bonus waits for the first measurement, then every micro-batch of a step applies the coefficient of the step
    before."""
    trainer, rows, applied = adaptive_run(
        tiny_assets, tmp_path, entropy_target=100.0, entropy_coef=0.1, entropy_coef_delta=0.05, entropy_coef_max=0.22
    )
    coefs = [r["entropy_coef"] for r in rows]
    assert coefs == pytest.approx([0.15, 0.2, 0.22, 0.22])
    assert applied == pytest.approx([0.0, 0.0, 0.15, 0.15, 0.2, 0.2, 0.22, 0.22])  # 2 micro-batches per step
    assert trainer.entropy_coef == pytest.approx(0.22)
    assert trainer.last_window_entropy == pytest.approx(rows[-1]["entropy"], rel=1e-6)  # the same tokens


def test_adaptive_coefficient_falls_above_the_target_and_applies_no_bonus(tiny_assets, tmp_path):
    """Above a target of 0.1 nats (the tiny policy's entropy is far higher): -delta per step down to
    entropy_coef_min, and never a bonus; the loss is then the unregularised run's."""
    _, rows, applied = adaptive_run(
        tiny_assets, tmp_path / "adaptive", entropy_target=0.1, entropy_coef=0.1, entropy_coef_delta=0.04,
        entropy_coef_min=0.01,
    )  # fmt: skip
    assert all(r["entropy"] > 0.1 for r in rows)
    assert [r["entropy_coef"] for r in rows] == pytest.approx([0.06, 0.02, 0.01, 0.01])
    assert applied == [0.0] * 8
    args = grpo_config(tiny_assets, tmp_path / "plain", max_steps=4)
    build_grpo_trainer(args, set()).train()
    plain = train_rows(read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")))
    assert [r["loss"] for r in rows] == [r["loss"] for r in plain]


def test_adaptive_state_survives_a_resume(tiny_assets, tmp_path):
    """A checkpoint after step 2 holds the coefficient and the last step's entropy: the resumed run logs the same
    rows (entropy_coef included) and ends with the same weights as the run that never stopped."""

    def make_config(out, **extra):
        return grpo_config(
            tiny_assets, tmp_path, output_dir=str(out), max_steps=4, save_steps=2, use_adaptive_entropy=True,
            entropy_target=100.0, entropy_coef_delta=0.05, **extra,
        )  # fmt: skip

    original = tmp_path / "original"
    build_grpo_trainer(make_config(original), set()).train()
    state = torch.load(original / "checkpoint-2" / "extra_state.pt", weights_only=True)["trainer"]
    assert state["entropy_control"]["entropy_coef"] == pytest.approx(0.1)
    assert 0 < state["entropy_control"]["last_window_entropy"] < 100
    resumed = resume_from(original, 2, tmp_path, make_config, build_grpo_trainer)
    assert [r["entropy_coef"] for r in train_rows(read_jsonl(resumed / "metrics.jsonl"))] == pytest.approx(
        [0.05, 0.1, 0.15, 0.2]
    )
    assert_same_run(original, resumed, ["model.safetensors"])
