"""--padding_free: both trainers' policy and reference forwards run on the batch's real tokens packed into one row
(models.completion_token_stats), with the padded batch's numbers."""

import math
import os

import pytest
import torch

from rlhfkit.errors import ConfigError
from rlhfkit.trainers.build import build_ppo_trainer
from tests.trainers.test_grpo_trl_fields import generation, gradients, trainer_of
from tests.trainers.test_ppo import read_jsonl, small_config, update_rows


def test_grpo_micro_step_and_logprobs_are_the_padded_ones(tiny_assets, tmp_path):
    trainer = trainer_of(
        tiny_assets, tmp_path, per_device_train_batch_size=8, gradient_accumulation_steps=1, beta=0.1,
        entropy_coef=0.01,
    )  # fmt: skip
    batch = generation(trainer)
    assert not batch.attention_mask.all()  # ragged: there is padding to leave out
    results = {}
    for packed in (False, True):
        trainer.args.padding_free = packed
        ref = trainer.generation.reference_logprobs(
            trainer.policy, batch.input_ids, batch.attention_mask, batch.prompt_width, batch.completion_ids
        )
        results[packed] = (ref, *gradients(trainer, batch, entropy_coef=0.01))
    mask = batch.loss_mask
    torch.testing.assert_close(results[True][0] * mask, results[False][0] * mask, atol=1e-5, rtol=0)
    assert math.isclose(results[True][1], results[False][1], rel_tol=1e-5, abs_tol=1e-6)  # the loss
    grads_padded, grads_packed = results[False][2], results[True][2]
    assert grads_padded.keys() == grads_packed.keys() and grads_padded
    for name, g in grads_padded.items():
        torch.testing.assert_close(grads_packed[name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_ppo_trains_the_same_run_padding_free(tiny_assets, tmp_path):
    """The same seed, padded and padding-free: the same completions, losses and KL, update after update."""
    rows = {}
    for packed in (False, True):
        trainer = build_ppo_trainer(small_config(tiny_assets, tmp_path / str(packed), padding_free=packed))
        trainer.train()
        rows[packed] = update_rows(read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl")))
    assert len(rows[True]) == len(rows[False]) >= 2
    for padded, packed in zip(rows[False], rows[True]):
        for key in ("objective/kl", "loss/policy_avg", "loss/value_avg", "objective/entropy", "policy/entropy_avg"):
            assert packed[key] == pytest.approx(padded[key], rel=1e-3, abs=1e-5), key


def test_padding_free_is_refused_before_training_with_the_fix(tiny_assets, tmp_path):
    """transformers' paged attention (continuous batching) reads no sequences from position ids."""
    with pytest.raises(ConfigError, match=r"--padding_free true: .*'paged\|eager'.*--attn_implementation sdpa"):
        trainer_of(tiny_assets, tmp_path, padding_free=True, attn_implementation="paged|eager")
