"""The forwards in rlhfkit.models that the losses read: logits of the response positions only."""

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhfkit.models import policy_logits, response_logits, takes_logits_to_keep
from rlhfkit.sampling import left_pad


@pytest.fixture(scope="module")
def batch(tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "sft")
    model = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft").eval()
    queries, mask = left_pad([tokenizer(p)["input_ids"] for p in ("sort 4312=", "sort 12=")], tokenizer.pad_token_id)
    response = torch.tensor([[5, 6, 7, 1], [8, 1, 0, 0]])
    ids = torch.cat([queries, response], dim=1)
    attention = torch.cat([mask, torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)], dim=1)
    return model, ids, attention, queries.shape[1]


class NoLogitsToKeep(nn.Module):
    """A causal LM whose forward has no logits_to_keep (remote code, older architectures)."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


class Wrapper(nn.Module):
    """Like DDP or a DeepSpeed engine: forward(*args, **kwargs) into .module."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def lm_head_rows(model) -> tuple[list[int], object]:
    rows: list[int] = []
    handle = model.lm_head.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[1]))
    return rows, handle


@pytest.mark.parametrize("wrap", [lambda m: m, Wrapper], ids=["plain", "wrapped"])
def test_response_logits_are_the_full_forwards_response_positions(batch, wrap):
    """The same values as slicing a full forward, with the LM head run on T + 1 positions only."""
    model, ids, attention, width = batch
    expected = policy_logits(model, ids, attention)[:, width - 1 : -1]
    rows, handle = lm_head_rows(model)
    got = response_logits(wrap(model), ids, attention, width)
    handle.remove()
    assert takes_logits_to_keep(wrap(model))
    assert rows == [ids.shape[1] - width + 1]
    assert got.shape == expected.shape == (2, 4, model.config.vocab_size)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_a_forward_without_logits_to_keep_gets_every_position_then_the_cut(batch):
    model, ids, attention, width = batch
    legacy = NoLogitsToKeep(model)
    assert not takes_logits_to_keep(legacy) and not takes_logits_to_keep(Wrapper(legacy))
    rows, handle = lm_head_rows(model)
    got = response_logits(Wrapper(legacy), ids, attention, width)
    handle.remove()
    assert rows == [ids.shape[1]]
    torch.testing.assert_close(got, policy_logits(model, ids, attention)[:, width - 1 : -1], atol=0, rtol=0)


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")  # peft reads transformers' old name
def test_a_peft_model_is_looked_into(batch):
    peft = pytest.importorskip("peft")
    model, ids, attention, width = batch
    lora = peft.get_peft_model(
        AutoModelForCausalLM.from_config(model.config), peft.LoraConfig(r=2, target_modules=["q_proj"])
    )
    assert takes_logits_to_keep(lora) and takes_logits_to_keep(Wrapper(lora))
    lora.eval()
    torch.testing.assert_close(
        response_logits(lora, ids, attention, width),
        policy_logits(lora, ids, attention)[:, width - 1 : -1],
        atol=1e-5,
        rtol=0,
    )
