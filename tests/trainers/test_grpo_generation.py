"""GRPO's generation batches as TRL's: steps_per_generation / generation_batch_size, groups spanning micro-batches,
one generation serving several optimizer steps, the reference sync and sampled evaluation."""

import os

import pytest
import torch

from rlhfkit import GRPOConfig
from rlhfkit.errors import ConfigError
from rlhfkit.ops.losses import LOSS_TYPES
from rlhfkit.trainers.build import build_grpo_trainer
from tests.trainers.test_grpo import grpo_config, read_jsonl, train_rows

SPLIT_DEPENDENT = {"bnpo"}  # token mean per micro-batch: the split changes the weights of the tokens


def test_trl_batch_shape_trains_with_groups_spanning_micro_batches(tiny_assets, tmp_path):
    """TRL's `--per_device_train_batch_size 2 --num_generations 8 --steps_per_generation 4`: one prompt's 8
    completions per generation, 4 optimizer steps of 2 completions each on it."""
    args = grpo_config(
        tiny_assets, tmp_path, per_device_train_batch_size=2, num_generations=8, steps_per_generation=4,
        gradient_accumulation_steps=1, max_steps=8, learning_rate=5e-2, epsilon=0.05, max_grad_norm=None,
        reward_funcs=["partial_credit"], scale_rewards="none",
    )  # fmt: skip
    trainer = build_grpo_trainer(args, explicit={"reward_funcs"})
    assert (trainer.sizes.prompts, trainer.sizes.completions, trainer.sizes.steps_per_generation) == (1, 8, 4)
    trainer.train()
    rows = train_rows(read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")))
    assert [r["episode"] for r in rows] == [8, 8, 8, 8, 16, 16, 16, 16]  # a generation every 4 steps
    assert rows[0]["clip_ratio/region_mean"] == 0.0 and rows[4]["clip_ratio/region_mean"] == 0.0  # fresh: ratio 1
    assert max(r["clip_ratio/region_mean"] for r in rows) > 0  # later steps on a generation are off-policy


def test_generation_batch_size_is_the_other_spelling(tiny_assets, tmp_path):
    a = grpo_config(tiny_assets, tmp_path, per_device_train_batch_size=2, num_generations=8, generation_batch_size=16)
    trainer = build_grpo_trainer(a, explicit={"reward_funcs"})
    assert (trainer.sizes.prompts, trainer.sizes.steps_per_generation, trainer.sizes.local_completions) == (2, 8, 16)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(per_device_train_batch_size=6, num_generations=4), r"does not hold whole groups of num_generations 4"),
        (dict(steps_per_generation=2, generation_batch_size=16), r"both set: set one"),
        (dict(per_device_train_batch_size=4, generation_batch_size=10), r"multiple of per_device_train_batch_size"),
        (dict(delta=1.1), r"delta \(1.1\) must be greater than 1 \+ epsilon_high"),
        (dict(sync_ref_model=True), r"sync_ref_model needs a reference model.*beta is 0"),
    ],
)
def test_generation_shape_errors_say_what_to_change(overrides, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(**overrides)


def one_generation_gradients(tiny_assets, tmp_path, loss_type, micro, steps, beta):
    """Gradients of one optimizer step over one fixed generation of 8 completions (the same for every split),
    accumulated over `steps` micro-batches of `micro` completions."""
    args = grpo_config(
        tiny_assets, tmp_path / f"{micro}", per_device_train_batch_size=micro, num_generations=8,
        gradient_accumulation_steps=steps, steps_per_generation=steps, loss_type=loss_type, beta=beta,
        reward_funcs=["partial_credit"], scale_rewards="none", max_steps=1,
    )  # fmt: skip
    trainer = build_grpo_trainer(args, explicit={"reward_funcs"})
    torch.manual_seed(0)
    batch = trainer.generation.generate_and_score([0])
    trainer.model.zero_grad()
    for index in range(steps):
        trainer.micro_step(batch, slice(index * micro, (index + 1) * micro))
    return batch, {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_accumulated_gradient_equals_the_one_batch_gradient(tiny_assets, tmp_path, loss_type):
    """Four micro-batches of 2 completions accumulate the gradient of one micro-batch of all 8, for every loss type
    whose normaliser does not depend on the split (all but bnpo), with and without the KL term."""
    for beta in (0.0, 0.04):
        batch, split = one_generation_gradients(tiny_assets, tmp_path / f"{beta}", loss_type, 2, 4, beta)
        _, whole = one_generation_gradients(tiny_assets, tmp_path / f"{beta}", loss_type, 8, 1, beta)
        lengths = batch.loss_mask.sum(1).view(4, 2).sum(1)
        differ = [not torch.allclose(split[n], whole[n], rtol=1e-4, atol=1e-7) for n in whole]
        if loss_type in SPLIT_DEPENDENT:
            assert any(differ) == bool(lengths.unique().numel() > 1)  # equal only when the splits hold equal tokens
        else:
            assert not any(differ), loss_type


def test_sync_ref_model_moves_the_reference_and_saves_it(tiny_assets, tmp_path):
    args = grpo_config(
        tiny_assets, tmp_path, beta=0.04, sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.5,
        max_steps=2, learning_rate=1e-2,
    )  # fmt: skip
    trainer = build_grpo_trainer(args, explicit={"reward_funcs"})
    ref_before = {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    policy_seen = {}
    original_sync = trainer.sync_reference

    def sync():  # the policy as the sync sees it
        policy_seen.update({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        original_sync()

    trainer.sync_reference = sync
    trainer.train()
    assert policy_seen, "the reference was never synced"
    for name, p in trainer.ref_model.named_parameters():
        expected = 0.5 * policy_seen[name] + 0.5 * ref_before[name]
        torch.testing.assert_close(p.detach(), expected)
    assert os.path.isfile(os.path.join(args.output_dir, "ref_model", "model.safetensors"))


def test_sampled_evaluation_with_num_generations_eval(tiny_assets, tmp_path):
    args = grpo_config(tiny_assets, tmp_path, num_generations_eval=3, eval_strategy="steps", eval_steps=1, max_steps=1)
    trainer = build_grpo_trainer(args, explicit={"reward_funcs"})
    calls = []
    original = trainer.rewards.score

    def score(rows, prompts, *rest, **kwargs):
        calls.append(prompts)
        return original(rows, prompts, *rest, **kwargs)

    trainer.rewards.score = score
    trainer.evaluate()
    eval_prompts = [p for c in calls for p in c]
    assert len(eval_prompts) == 3 * len(trainer.eval_dataset)  # three samples of every eval prompt
