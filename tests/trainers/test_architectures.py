"""The architecture matrix: PPO and GRPO on tiny random models of every common decoder family (docs/model-families.md).

For each architecture a causal LM and a 1-label sequence-classification model are built from a tiny random config
sized to the built-in task's character tokenizer and saved with save_pretrained, as a user's checkpoints would be.
Then: the lean decoding loop agrees with ``model.generate`` (and takes the fast path), PPO's first-minibatch ratio
is 1 with value and reward heads loaded from the sequence-classification checkpoint, and GRPO trains against a
reward model of the same architecture.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from typing import NamedTuple

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhfkit.sampling import complete, fallback, generate, left_pad, sampling_config, terminator_ids
from rlhfkit.trainers.build import build_grpo_trainer, build_ppo_trainer
from tests.helpers import full_forward_logprobs
from tests.tiny_models import ARCHITECTURES, Arch, save_tiny_models
from tests.trainers.test_grpo import grpo_config
from tests.trainers.test_ppo import small_config


class Checkpoints(NamedTuple):
    name: str
    arch: Arch
    causal: str  # directory: causal LM + tokenizer
    seq_cls: str  # directory: 1-label sequence-classification model + tokenizer


@pytest.fixture(scope="module", params=list(ARCHITECTURES), ids=list(ARCHITECTURES))
def checkpoints(request, tiny_assets, tmp_path_factory) -> Checkpoints:
    """Tiny random checkpoints of one architecture, saved once for the module's tests of it."""
    name = request.param
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "tokenizer")
    causal, seq_cls = save_tiny_models(name, tokenizer, tmp_path_factory.mktemp(name))
    return Checkpoints(name, ARCHITECTURES[name], str(causal), str(seq_cls))


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_lean_loop_matches_generate(checkpoints):
    """Greedy tokens equal model.generate's on a left-padded batch of prompts of different lengths; sampled log-probs
    equal a full forward's; and the model takes the lean loop (no fallback notice)."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoints.causal, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(checkpoints.causal).eval()
    prompts = [tokenizer(p)["input_ids"] for p in ("sort 4312=", "sort 999901=", "sort 12=", "sort 55555=")]
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    stop = terminator_ids(tokenizer, model)
    greedy = sampling_config(12, None, tokenizer.pad_token_id, stop)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = generate(model, ids, mask, greedy).tokens
        torch.manual_seed(0)
        temperature = 0.7
        sampled = sampling_config(12, temperature, tokenizer.pad_token_id, stop)
        (chunk,) = complete(model, prompts * 4, sampled, batch_size=16)
    theirs = model.generate(input_ids=ids, attention_mask=mask.long(), generation_config=greedy)[:, ids.shape[1] :]
    assert torch.equal(ours, theirs)
    assert type(model) not in fallback._NO_LEAN_LOOP
    assert not [w for w in caught if "lean KV-cache decoding loop" in str(w.message)]
    expected = full_forward_logprobs(model, chunk, temperature)
    m = chunk.completion_mask
    torch.testing.assert_close(chunk.sampling_logprobs[m], expected[m], atol=1e-5, rtol=0)


def test_shared_prompt_prefixes_change_nothing(checkpoints):
    """GRPO's layout (each prompt in a run of 4 rows): encoding each prompt once and expanding the KV cache with the
    architecture's own cache (sliding windows, hybrid layers included) samples the same tokens with the same
    log-probs as encoding every row."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoints.causal, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(checkpoints.causal).eval()
    prompts = [tokenizer(p)["input_ids"] for p in ("sort 4312=", "sort 999901=", "sort 12=")]
    ids, mask = left_pad([p for p in prompts for _ in range(4)], tokenizer.pad_token_id)
    config = sampling_config(12, 0.7, tokenizer.pad_token_id, terminator_ids(tokenizer, model))
    results = []
    for share in (True, False):
        torch.manual_seed(0)
        results.append(generate(model, ids, mask, config, share_prefixes=share))
    assert torch.equal(results[0].tokens, results[1].tokens)
    torch.testing.assert_close(results[0].sampling_logprobs, results[1].sampling_logprobs, atol=1e-5, rtol=0)


def test_ppo_first_minibatch_ratio_is_one(checkpoints, tiny_assets, tmp_path):
    """One epoch, one mini-batch (two micro-batches): every ratio is taken before the update's only optimizer step,
    so val/ratio is 1 and approxkl 0. Value and reward models come from the sequence-classification checkpoint."""
    args = small_config(
        tiny_assets, tmp_path, model_name_or_path=checkpoints.causal, sft_model_path=checkpoints.causal,
        reward_model_path=checkpoints.seq_cls, value_model_path=checkpoints.seq_cls, per_device_train_batch_size=4,
        num_mini_batches=1, num_ppo_epochs=1, total_episodes=16, num_sample_generations=0, health="off",
    )  # fmt: skip  # 2 updates of 8, each one mini-batch of two micro-batches
    trainer = build_ppo_trainer(args)
    assert type(trainer.reward_model).__name__ == checkpoints.arch.seq_cls
    assert type(trainer.unwrapped.value_model).__name__ == checkpoints.arch.seq_cls
    assert type(trainer.unwrapped.policy).__name__ == checkpoints.arch.causal_lm
    before = {k: v.detach().clone() for k, v in trainer.unwrapped.named_parameters()}
    trainer.train()
    updates = [r for r in read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")) if "episode" in r]
    assert [r["step"] for r in updates] == [1, 2]
    assert all(math.isfinite(v) for r in updates for v in r.values() if isinstance(v, float)), updates
    after = dict(trainer.unwrapped.named_parameters())
    changed = {k.split(".")[0] for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"policy", "value_model"}
    with open(os.path.join(args.output_dir, "value_model", "config.json")) as f:
        assert json.load(f)["architectures"] == [checkpoints.arch.seq_cls]
    with open(os.path.join(args.output_dir, "config.json")) as f:
        assert json.load(f)["architectures"] == [checkpoints.arch.causal_lm]
    for r in updates:  # OPT's functional dropout (float attributes) made this ~0.998 before disable_dropout knew it
        assert r["val/ratio"] == pytest.approx(1.0, abs=1e-5)
        assert r["policy/approxkl_avg"] == pytest.approx(0.0, abs=1e-8)
        assert r["policy/clipfrac_avg"] == 0.0


def test_grpo_trains_with_a_reward_model_of_the_architecture(checkpoints, tiny_assets, tmp_path):
    args = grpo_config(
        tiny_assets, tmp_path, model_name_or_path=checkpoints.causal, reward_model_path=[checkpoints.seq_cls],
        gradient_accumulation_steps=1, max_steps=2, health="off",
    )  # fmt: skip
    trainer = build_grpo_trainer(args)
    (reward,) = trainer.rewards.funcs
    assert type(reward.model).__name__ == checkpoints.arch.seq_cls
    assert type(trainer.accelerator.unwrap_model(trainer.model)).__name__ == checkpoints.arch.causal_lm
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    rows = [r for r in read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert all(math.isfinite(v) for v in r.values() if isinstance(v, float)), r
        assert r["reward_std"] > 0  # a random reward model still tells completions apart: there is a gradient
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[k], after[k]) for k in before)
