"""TRL 1.16 GRPOConfig fields honoured in real GRPO runs on the tiny built-in task: off_policy_mask_threshold,
multi_objective_aggregation, cast_lm_head_to_fp32, pad_to_multiple_of and generation_kwargs."""

import dataclasses
import math
import os

import pytest
import torch
from datasets import load_from_disk
from transformers import AutoModelForCausalLM

from rlhfkit import GRPOTrainer, ops
from rlhfkit.trainers.build import build_grpo_trainer
from tests.trainers import grpo_rewards
from tests.trainers.test_grpo import grpo_config, read_jsonl, train_rows
from tests.trainers.test_grpo_dynamic_sampling import flat_for_even_prompts

HERE = "tests.trainers.test_grpo_trl_fields"


def tenfold_flat(prompts, completions, **kwargs):
    """flat_for_even_prompts at ten times its scale: a second reward whose groups are flat where the first's are."""
    return [10.0 * r for r in flat_for_even_prompts(prompts, completions)]


def trainer_of(assets, tmp_path, **overrides):
    values = dict(reward_funcs=["partial_credit"], max_steps=2)
    return build_grpo_trainer(grpo_config(assets, tmp_path, **{**values, **overrides}), explicit={"reward_funcs"})


def generation(trainer, seed=0):
    torch.manual_seed(seed)
    return trainer.generation.generate_and_score([0, 1])


def gradients(trainer, batch, entropy_coef=None):
    trainer.model.zero_grad()
    loss = trainer.micro_step(batch, slice(0, trainer.args.per_device_train_batch_size), entropy_coef=entropy_coef)
    return loss, {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def assert_same_gradients(a, b, atol=1e-7):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-5, msg=name)


def train_and_read(trainer):
    trainer.train()
    return train_rows(read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl")))


# ---- off_policy_mask_threshold ----


def test_off_policy_mask_drops_the_policy_term_of_drifted_negative_completions(tiny_assets, tmp_path):
    """Sampler log-probs 1 nat above the policy's on rows 0-3: with delta 0.5 the negative rows among them (0 and 2)
    lose their policy term, exactly as if their advantage were 0; rows with drift 0 or A > 0 keep theirs."""
    trainer = trainer_of(tiny_assets, tmp_path, per_device_train_batch_size=8, gradient_accumulation_steps=1)
    batch = generation(trainer)
    current = trainer.generation.logprobs(
        trainer.policy, batch.input_ids, batch.attention_mask, batch.prompt_width, batch.completion_ids
    )
    drift = torch.tensor([1.0] * 4 + [0.0] * 4)[:, None]
    batch.sampling_logprobs = torch.where(batch.loss_mask, current + drift, 0.0)
    batch.advantages = torch.tensor([-1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0])

    trainer.args.off_policy_mask_threshold = 0.5
    masked_loss, masked = gradients(trainer, batch)
    trainer.args.off_policy_mask_threshold = None
    loss, plain = gradients(trainer, batch)
    batch.advantages = torch.tensor([0.0, 1.0, 0.0, 1.0, -1.0, 1.0, -1.0, 1.0])
    dropped_loss, dropped = gradients(trainer, batch)
    assert_same_gradients(masked, dropped)
    assert masked_loss == pytest.approx(dropped_loss) and masked_loss != pytest.approx(loss)
    trainer.args.off_policy_mask_threshold = 1.5  # no drift above the threshold: nothing dropped
    batch.advantages = torch.tensor([-1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0])
    assert_same_gradients(gradients(trainer, batch)[1], plain)


def test_off_policy_mask_keeps_the_kl_term_and_the_entropy_bonus(tiny_assets, tmp_path):
    """A dropped completion keeps its KL term (TRL masks the policy term only) and the entropy bonus its tokens."""
    trainer = trainer_of(
        tiny_assets, tmp_path, per_device_train_batch_size=8, gradient_accumulation_steps=1, beta=0.5,
        loss_type="bnpo", use_bias_correction_kl=False,
    )  # fmt: skip
    batch = generation(trainer)
    batch.ref_logprobs = torch.where(batch.loss_mask, batch.ref_logprobs - 0.3, 0.0)  # a KL term with a gradient
    batch.sampling_logprobs = torch.where(batch.loss_mask, batch.ref_logprobs + 2.0, 0.0)  # every row drifted
    batch.advantages = -torch.ones(8)
    trainer.args.off_policy_mask_threshold = 0.5
    _, masked = gradients(trainer, batch, entropy_coef=0.1)
    trainer.args.off_policy_mask_threshold = None
    batch.advantages = torch.zeros(8)  # no policy term anywhere; the KL and the entropy bonus as they were
    _, expected = gradients(trainer, batch, entropy_coef=0.1)
    assert_same_gradients(masked, expected)
    _, kl_only = gradients(trainer, batch)
    trainer.args.beta = 0.0  # the loss's settings are bound when the trainer is built: rebind them
    trainer.loss = dataclasses.replace(trainer.loss, beta=0.0)
    assert all(g.abs().max() == 0 for g in gradients(trainer, batch)[1].values())  # A = 0, no KL, no entropy
    assert any(not torch.allclose(kl_only[n], expected[n]) for n in expected)  # the entropy bonus counted
    assert any(g.abs().max() > 0 for g in kl_only.values())  # and so did the KL


def test_a_run_with_the_off_policy_mask_trains(tiny_assets, tmp_path, monkeypatch):
    kept = []
    mask = ops.off_policy_sequence_mask

    def recorded(logprobs, behaviour, advantages, loss_mask, threshold):
        out = mask(logprobs, behaviour, advantages, loss_mask, threshold)
        kept.append((out.float().mean().item(), threshold, behaviour.requires_grad))
        return out

    monkeypatch.setattr(ops, "off_policy_sequence_mask", recorded)
    trainer = trainer_of(tiny_assets, tmp_path, off_policy_mask_threshold=0.0, num_iterations=2, learning_rate=5e-2)
    rows = train_and_read(trainer)
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)
    assert len(kept) == 2 * 2 and all(t == 0.0 and not grad for _, t, grad in kept)  # every micro-batch
    assert min(share for share, _, _ in kept) < 1.0  # after an update, some negative completion drifted past 0


# ---- multi_objective_aggregation ----


def test_normalize_then_sum_gives_gdpo_advantages(tiny_assets, tmp_path):
    trainer = trainer_of(
        tiny_assets, tmp_path, reward_funcs=["partial_credit", f"{grpo_rewards.__name__}:recorded_length"],
        reward_weights=[1.0, 0.5], multi_objective_aggregation="normalize_then_sum", max_steps=1,
    )  # fmt: skip
    rows = train_and_read(trainer)
    batch, G = trainer.generation.batch, trainer.args.num_generations
    weights = torch.tensor([1.0, 0.5], dtype=torch.float64)
    expected = ops.decoupled_group_advantages(batch.rewards, weights, G).float()
    torch.testing.assert_close(batch.advantages, expected)
    total = (batch.rewards * weights[:, None]).sum(0)
    assert not torch.allclose(batch.advantages, ops.group_advantages(total, G, "group").float(), atol=1e-3)
    assert len(rows) == 1 and math.isfinite(rows[0]["loss"])


def test_sum_then_normalize_is_the_default(tiny_assets, tmp_path):
    trainer = trainer_of(
        tiny_assets, tmp_path, reward_funcs=["partial_credit", f"{grpo_rewards.__name__}:recorded_length"],
        reward_weights=[1.0, 0.5], scale_rewards="batch", max_steps=1,
    )  # fmt: skip
    batch = generation(trainer)
    total = (batch.rewards * torch.tensor([1.0, 0.5], dtype=torch.float64)[:, None]).sum(0)
    expected = ops.group_advantages(total, trainer.args.num_generations, "batch").float()
    torch.testing.assert_close(batch.advantages, expected)


def test_normalize_then_sum_with_dynamic_sampling_normalises_the_kept_groups(tiny_assets, tmp_path):
    """Groups of several generation rounds merged into one batch: each source's rewards of the kept groups."""
    trainer = trainer_of(
        tiny_assets, tmp_path, reward_funcs=["tests.trainers.test_grpo_dynamic_sampling:flat_for_even_prompts",
        f"{HERE}:tenfold_flat"], reward_weights=[1.0, 0.5], multi_objective_aggregation="normalize_then_sum",
        dynamic_sampling=True, max_steps=1,
    )  # fmt: skip
    torch.manual_seed(0)
    prompts = iter([[i, i + 1, i + 2, i + 3] for i in range(0, 400, 4)])
    batch = trainer.generation.generate_and_score(next(prompts), prompts)
    assert batch.rounds > 1  # flat groups were dropped and replaced
    weights = torch.tensor([1.0, 0.5], dtype=torch.float64)
    expected = ops.decoupled_group_advantages(batch.rewards, weights, trainer.args.num_generations).float()
    torch.testing.assert_close(batch.advantages, expected)
    assert (batch.advantages != 0).all()  # only groups with spread were kept


# ---- cast_lm_head_to_fp32 ----


def test_cast_lm_head_to_fp32_trains_a_bf16_policy_with_float32_logits(tiny_assets, tmp_path, monkeypatch):
    import rlhfkit.ops.logprobs as logprobs_module

    dtypes = []  # of the logits the log-probs are taken from (a chunk of positions at a time)
    logprobs_from_logits = logprobs_module.logprobs_from_logits

    def recorded(logits, *args):
        dtypes.append(logits.dtype)
        return logprobs_from_logits(logits, *args)

    monkeypatch.setattr(logprobs_module, "logprobs_from_logits", recorded)
    trainer = trainer_of(
        tiny_assets, tmp_path, dtype="bfloat16", cast_lm_head_to_fp32=True, beta=0.04, learning_rate=5e-2
    )
    policy, ref = trainer.policy, trainer.ref_model
    assert policy.lm_head.weight.dtype == ref.lm_head.weight.dtype == torch.float32
    assert policy.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16  # only the head
    assert policy.lm_head.weight is policy.model.embed_tokens.weight  # the tiny model's tied weight stays tied
    before = policy.lm_head.weight.detach().clone()
    rows = train_and_read(trainer)
    assert dtypes and set(dtypes) == {torch.float32}
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert not torch.equal(before, policy.lm_head.weight)  # trained, in float32


def test_a_bf16_policy_with_a_float32_head_takes_logp_old_from_a_forward(tiny_assets, tmp_path):
    """The cast tied weight is the policy's first parameter, but the layers are bf16: the sampler's cached log-probs
    are not the training forward's, so a generation that outlives a step gets logp_old from a forward."""
    trainer = trainer_of(tiny_assets, tmp_path, dtype="bfloat16", cast_lm_head_to_fp32=True, num_iterations=2)
    assert next(trainer.policy.parameters()).dtype == torch.float32
    batch = generation(trainer)
    forward = trainer.generation.logprobs(
        trainer.policy, batch.input_ids, batch.attention_mask, batch.prompt_width, batch.completion_ids
    )
    torch.testing.assert_close(batch.old_logprobs, forward, atol=0, rtol=0)


def test_cast_lm_head_to_fp32_casts_a_model_object_too(tiny_assets, tmp_path):
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    model = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft", dtype=torch.bfloat16)
    args = grpo_config(tiny_assets, tmp_path, cast_lm_head_to_fp32=True, max_steps=1)
    trainer = GRPOTrainer(model, grpo_rewards.recorded_length, args, train_dataset=dataset["train"])
    assert trainer.policy.lm_head.weight.dtype == torch.float32
    assert trainer.policy.model.embed_tokens(torch.tensor([[1, 2]])).dtype == torch.bfloat16  # the layers' input
    trainer.train()


# ---- pad_to_multiple_of ----


def test_pad_to_multiple_of_pads_the_training_forward_and_changes_no_log_prob(tiny_assets, tmp_path):
    trainer = trainer_of(tiny_assets, tmp_path, per_device_train_batch_size=8, gradient_accumulation_steps=1, beta=0.1)
    plain = generation(trainer)
    trainer.args.pad_to_multiple_of = 16
    padded = generation(trainer)
    assert padded.prompt_width % 16 == 0 and padded.completion_ids.shape[1] % 16 == 0
    assert padded.prompt_width > plain.prompt_width and padded.completion_ids.shape[1] > plain.completion_ids.shape[1]
    assert padded.completions == plain.completions  # the sampler is not affected
    T = plain.completion_ids.shape[1]
    assert not padded.loss_mask[:, T:].any() and torch.equal(padded.loss_mask[:, :T], plain.loss_mask)
    torch.testing.assert_close(padded.advantages, plain.advantages, atol=0, rtol=0)
    lp = {}
    for name, batch in (("plain", plain), ("padded", padded)):
        lp[name] = trainer.generation.logprobs(
            trainer.policy, batch.input_ids, batch.attention_mask, batch.prompt_width, batch.completion_ids
        )[:, :T]
    mask = plain.loss_mask
    torch.testing.assert_close(lp["padded"][mask], lp["plain"][mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded.ref_logprobs[:, :T][mask], plain.ref_logprobs[mask], atol=1e-5, rtol=1e-5)
    plain_loss, plain_grads = gradients(trainer, plain)
    padded_loss, padded_grads = gradients(trainer, padded)
    assert padded_loss == pytest.approx(plain_loss, abs=1e-6)
    assert_same_gradients(padded_grads, plain_grads, atol=1e-6)


def test_a_run_with_pad_to_multiple_of_trains(tiny_assets, tmp_path):
    trainer = trainer_of(tiny_assets, tmp_path, pad_to_multiple_of=8, num_iterations=2)
    rows = train_and_read(trainer)
    assert trainer.generation.batch.input_ids.shape[1] % 8 == 0 and all(math.isfinite(r["loss"]) for r in rows)


# ---- generation_kwargs ----


def test_generation_kwargs_are_the_flags_of_the_same_name(tiny_assets, tmp_path):
    """top_k / top_p / repetition_penalty in generation_kwargs, with do_sample, temperature and max_new_tokens
    repeating the flags, sample exactly what the flags sample."""
    flags = trainer_of(tiny_assets, tmp_path / "flags", top_k=5, top_p=0.9, repetition_penalty=1.2)
    kwargs = trainer_of(
        tiny_assets, tmp_path / "kwargs", generation_kwargs={"do_sample": True, "temperature": 1.0,
        "max_new_tokens": 8, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.2},
    )  # fmt: skip
    a, b = generation(flags), generation(kwargs)
    assert a.completions == b.completions
    torch.testing.assert_close(a.sampling_logprobs, b.sampling_logprobs)


@pytest.mark.filterwarnings("ignore:rlhfkit. the lean KV-cache decoding loop does not implement")
def test_generation_kwargs_beyond_the_lean_loop_train_through_model_generate(tiny_assets, tmp_path):
    trainer = trainer_of(tiny_assets, tmp_path, generation_kwargs={"num_beams": 2, "suppress_tokens": [3]})
    rows = train_and_read(trainer)
    batch = trainer.generation.batch
    assert not (batch.completion_ids[batch.loss_mask] == 3).any()  # suppressed
    assert all(math.isfinite(r["loss"]) for r in rows)
