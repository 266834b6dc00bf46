"""A mixture-of-experts policy trains with its routers' load-balancing loss (TRL 1.16's router_aux_loss_coef): on a
tiny Qwen3-MoE the run logs aux_loss and the routers move differently from the same run with the coefficient at 0;
aux_loss is transformers' own load-balancing loss of the training forward; a coefficient for a model without routers
exits 2."""

import os

import pytest
import torch
from datasets import load_from_disk
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from rlhfkit import GRPOTrainer
from rlhfkit.errors import ConfigError
from rlhfkit.models import completion_token_stats
from tests.trainers.test_grpo import grpo_config, read_jsonl


def tiny_moe(tok, seed: int = 0) -> Qwen3MoeForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=128, router_aux_loss_coef=0.5, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )  # fmt: skip
    return Qwen3MoeForCausalLM(config)


def length(completions, **kwargs) -> list[float]:
    return [len(c) / 10 for c in completions]


def routers(model) -> list[torch.Tensor]:
    return [layer.mlp.gate.weight.detach().clone() for layer in model.model.layers]


def train_one_step(tiny_assets, tmp_path, name, coef):
    tok = AutoTokenizer.from_pretrained(tiny_assets / "sft")
    model = tiny_moe(tok)
    args = grpo_config(tiny_assets, tmp_path, output_dir=str(tmp_path / name), max_steps=1, learning_rate=0.05,
                       router_aux_loss_coef=coef)  # fmt: skip
    train = load_from_disk(str(tiny_assets / "prompts"))["train"]
    trainer = GRPOTrainer(model, length, args, train_dataset=train, processing_class=tok)
    before = routers(trainer.policy)
    trainer.train()
    rows = [r for r in read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")) if "loss" in r]
    return trainer, before, routers(trainer.policy), rows


def test_the_routers_load_balancing_loss_is_trained_and_logged(tiny_assets, tmp_path):
    weighted, before, after, rows = train_one_step(tiny_assets, tmp_path, "aux", None)  # the config's 0.5
    assert weighted.aux_loss_enabled and weighted.router_aux_loss_coef == 0.5
    assert rows[0]["aux_loss"] > 0
    off, before_off, after_off, rows_off = train_one_step(tiny_assets, tmp_path, "off", 0.0)
    assert not off.aux_loss_enabled and "aux_loss" not in rows_off[0]
    assert all(torch.equal(a, b) for a, b in zip(before, before_off))  # the same start
    assert any(not torch.equal(a, b) for a, b in zip(after, after_off))  # the loss moved the routers


def test_aux_loss_is_transformers_load_balancing_loss_of_the_forward(tiny_assets):
    tok = AutoTokenizer.from_pretrained(tiny_assets / "sft")
    model = tiny_moe(tok).eval()
    ids = torch.tensor([tok("sort 4213=")["input_ids"] + tok("1234")["input_ids"]] * 2)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :2] = False  # padding in the second row: left out of the balance, as transformers leaves it
    width = len(tok("sort 4213=")["input_ids"])
    stats = completion_token_stats(model, ids, mask, width, ids[:, width:], 1.0, router_aux=True)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask.long(), output_router_logits=True)
    expected = load_balancing_loss_func(out.router_logits, 4, 2, mask.long())
    torch.testing.assert_close(stats.aux_loss, expected)
    assert completion_token_stats(model, ids, mask, width, ids[:, width:], 1.0).aux_loss is None


def test_a_coefficient_for_a_model_without_routers_exits_2(tiny_assets, tmp_path):
    args = grpo_config(tiny_assets, tmp_path, max_steps=1, router_aux_loss_coef=0.01)
    model = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft")
    with pytest.raises(
        ConfigError, match=r"--router_aux_loss_coef 0.01: LlamaForCausalLM is not a mixture of experts"
    ):
        GRPOTrainer(model, length, args, train_dataset=load_from_disk(str(tiny_assets / "prompts"))["train"])
