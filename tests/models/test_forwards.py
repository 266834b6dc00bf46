"""rlhfkit/models/forwards.py, the forwards the losses read: logits of the response positions only, log-probs and
entropies with the LM head in chunks of positions, padding-free batches."""

import functools
import warnings

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhfkit import ops
from rlhfkit.errors import ConfigError
from rlhfkit.models import (
    cast_lm_head_to_fp32,
    completion_logits,
    completion_token_stats,
    enable_gradient_checkpointing,
    policy_logits,
    takes_logits_to_keep,
)
from rlhfkit.sampling import left_pad
from tests.models.common import Wrapper, bf16_model


class NoLogitsToKeep(nn.Module):
    """A causal LM whose forward has no logits_to_keep (remote code, older architectures)."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


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
    got = completion_logits(wrap(model), ids, attention, width)
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
    got = completion_logits(Wrapper(legacy), ids, attention, width)
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
        completion_logits(lora, ids, attention, width),
        policy_logits(lora, ids, attention)[:, width - 1 : -1],
        atol=1e-5,
        rtol=0,
    )


# ---- completion_token_stats: log-probs and entropies with the LM head in chunks of positions ----


def float64_model(tiny_assets, tied: bool = True):
    """The built-in task's tiny Llama in float64 (tied embeddings), or an untied copy with a head of its own."""
    model = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft", dtype=torch.float64)
    if not tied:
        config = model.config
        config.tie_word_embeddings = False
        untied = AutoModelForCausalLM.from_config(config, dtype=torch.float64)
        untied.load_state_dict(model.state_dict(), strict=False)
        untied.lm_head.weight.data.normal_(generator=torch.Generator().manual_seed(0))
        model = untied
    return model.eval()  # no dropout: the two paths must see the same network


def full_logits_stats(model, ids, attention, width, tokens, temperature):
    """What rlhfkit computed before the chunked head: the (B, T, V) logits, then the ops."""
    logits = completion_logits(model, ids, attention, width)
    return ops.logprobs_from_logits(logits, tokens, temperature), ops.entropy_from_logits(logits, temperature)


def values_and_gradients(model, stats_fn, mask):
    """Log-probs, entropies, and the gradient of every trainable parameter of a loss that uses both."""
    model.zero_grad(set_to_none=True)
    stats = stats_fn()
    logprobs, entropy = stats[0], stats[1]  # a TokenStats or the reference's pair
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(logprobs.shape, generator=g, dtype=logprobs.dtype)
    ((weights * logprobs - 0.1 * entropy) * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    return logprobs.detach(), entropy.detach(), grads


def assert_same_numbers(model, ids, attention, width, temperature, atol, wrap=lambda m: m):
    tokens = ids[:, width:]
    mask = attention[:, width:]
    chunked = values_and_gradients(
        model,
        lambda: completion_token_stats(wrap(model), ids, attention, width, tokens, temperature, True, True),
        mask,
    )
    full = values_and_gradients(
        model, lambda: full_logits_stats(model, ids, attention, width, tokens, temperature), mask
    )
    torch.testing.assert_close(chunked[0] * mask, full[0] * mask, atol=atol, rtol=0)
    torch.testing.assert_close(chunked[1] * mask, full[1] * mask, atol=atol, rtol=0)
    assert chunked[2].keys() == full[2].keys() and len(full[2]) > 0
    for name in full[2]:
        torch.testing.assert_close(chunked[2][name], full[2][name], atol=atol, rtol=0, msg=name)


@pytest.fixture
def two_position_chunks(monkeypatch):
    """Chunks of 2 positions at the tiny vocabulary, so every batch is computed in several."""
    from rlhfkit.ops import logprobs as module

    monkeypatch.setattr(module, "HIDDEN_CHUNK_ELEMENTS", 2 * 64)
    monkeypatch.setattr(module, "positions_per_chunk", lambda vocab_size: 2)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("wrap", [lambda m: m, Wrapper], ids=["plain", "wrapped"])
def test_token_stats_equal_the_full_logits_path(tiny_assets, batch, two_position_chunks, temperature, tied, wrap):
    """Values and every parameter's gradient, float64: tied embeddings, an own head, temperature, a DDP-like
    wrapper."""
    _, ids, attention, width = batch
    assert_same_numbers(float64_model(tiny_assets, tied), ids, attention, width, temperature, 1e-10, wrap)


def test_token_stats_with_gradient_checkpointing(tiny_assets, batch, two_position_chunks):
    _, ids, attention, width = batch
    model = float64_model(tiny_assets)
    enable_gradient_checkpointing(model)
    model.train()  # checkpointing acts in training mode only; the tiny model has no dropout
    assert_same_numbers(model, ids, attention, width, 0.7, 1e-10)


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
@pytest.mark.parametrize(
    "lora",
    [{"target_modules": ["q_proj", "lm_head"]}, {"target_modules": ["q_proj"], "modules_to_save": ["lm_head"]}],
    ids=["adapter on the head", "head trained in full"],
)
def test_token_stats_with_lora(tiny_assets, batch, two_position_chunks, lora):
    """Adapters on the head (and beside it): the gradients of the adapters' weights, through the chunks."""
    peft = pytest.importorskip("peft")
    _, ids, attention, width = batch
    model = peft.get_peft_model(
        float64_model(tiny_assets, tied=False), peft.LoraConfig(r=2, init_lora_weights=False, **lora)
    )
    model.eval()
    assert_same_numbers(model, ids, attention, width, 0.7, 1e-10)
    with model.disable_adapter():  # the reference of a LoRA run
        tokens = ids[:, width:]
        with torch.no_grad():
            got = completion_token_stats(model, ids, attention, width, tokens, 0.7).logprobs
            expected = full_logits_stats(model, ids, attention, width, tokens, 0.7)[0]
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("cast", [False, True], ids=["bf16 head", "cast_lm_head_to_fp32"])
def test_token_stats_in_bf16_equal_the_full_path_and_the_float64_reference(
    tiny_assets, batch, two_position_chunks, cast
):
    """A bf16 model: the chunked numbers are the full path's (the same bf16 products, upcast the same way), and
    both are the float64 model's within bf16 rounding."""
    _, ids, attention, width = batch
    model = bf16_model(tiny_assets, tied=True)
    if cast:
        cast_lm_head_to_fp32(model)
    tokens, mask = ids[:, width:], attention[:, width:]
    chunked = completion_token_stats(model, ids, attention, width, tokens, 0.7, True, True)
    full = full_logits_stats(model, ids, attention, width, tokens, 0.7)
    assert chunked.logprobs.dtype == torch.float32
    torch.testing.assert_close(chunked.logprobs * mask, full[0] * mask, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked.entropy * mask, full[1] * mask, atol=1e-5, rtol=0)
    chunked_grad = torch.autograd.grad((chunked.logprobs * mask).sum(), model.lm_head.weight)[0]
    full_grad = torch.autograd.grad((full[0] * mask).sum(), model.lm_head.weight)[0]
    torch.testing.assert_close(chunked_grad.float(), full_grad.float(), atol=2e-2, rtol=1e-2)
    reference = completion_token_stats(float64_model(tiny_assets), ids, attention, width, tokens, 0.7)
    torch.testing.assert_close(chunked.logprobs.double() * mask, reference.logprobs * mask, atol=0.1, rtol=0)


class ScaledLogits(nn.Module):
    """A causal LM whose forward multiplies the head's output (Cohere's logit_scale, Granite's logits_scaling)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(self, logits_to_keep=0, **kwargs):
        out = self.model(logits_to_keep=logits_to_keep, **kwargs)
        out.logits = out.logits * 0.5
        return out


def test_a_forward_that_changes_the_heads_output_is_computed_the_full_way_and_said_once(tiny_assets, batch):
    _, ids, attention, width = batch
    model = ScaledLogits(float64_model(tiny_assets))
    tokens = ids[:, width:]
    with pytest.warns(UserWarning, match="ScaledLogits's forward changes the LM head's output"):
        got = completion_token_stats(model, ids, attention, width, tokens, 1.0, entropy=True)
    expected = full_logits_stats(model, ids, attention, width, tokens, 1.0)
    torch.testing.assert_close(got.logprobs, expected[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(got.entropy, expected[1].detach(), atol=1e-12, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        completion_token_stats(model, ids, attention, width, tokens, 1.0)


def test_token_stats_keep_no_batch_by_vocabulary_tensor_for_the_backward():
    """A vocabulary much wider than the model: the full path saves the (B, T, V) logits for the backward; the
    chunked path saves nothing of that size beyond the head's weight itself (the largest saved tensors are the
    model's own activations)."""
    from transformers import Qwen2Config

    config = Qwen2Config(
        vocab_size=4096, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=False,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4096, (4, 24), generator=g)
    attention = torch.ones_like(ids, dtype=torch.bool)
    width, tokens = 8, ids[:, 8:]
    batch_logits = 4 * 16 * 4096
    saved = []

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def keep(t):  # what autograd keeps beyond the parameters themselves (saved as they are, no copy)
        if t.untyped_storage().data_ptr() not in weights:
            saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        completion_token_stats(model, ids, attention, width, tokens, 0.7, entropy=True, entropy_grad=True)
    chunked_max = max(saved)
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        full_logits_stats(model, ids, attention, width, tokens, 0.7)
    assert max(saved) >= batch_logits
    assert chunked_max < batch_logits / 16


# ---- padding-free forwards ----


def ragged_batch(tiny_assets):
    """Queries of different lengths (left-padded) and responses of different lengths (right-padded)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "sft")
    prompts = ("sort 4312=", "sort 12=", "sort 987654=")
    queries, mask = left_pad([tokenizer(p)["input_ids"] for p in prompts], tokenizer.pad_token_id)
    response = torch.tensor([[5, 6, 7, 1, 0], [8, 1, 0, 0, 0], [9, 9, 8, 7, 6]])
    response_mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    return torch.cat([queries, response], 1), torch.cat([mask, response_mask], 1), queries.shape[1]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient checkpointing"])
def test_a_padding_free_forward_gives_the_padded_numbers(tiny_assets, two_position_chunks, checkpointing):
    """Log-probs, entropies and every gradient (float64) of the packed forward equal the padded one's over the real
    response tokens; the packed forward runs on the real tokens only, in one row."""
    ids, attention, width = ragged_batch(tiny_assets)
    model = float64_model(tiny_assets)
    if checkpointing:
        enable_gradient_checkpointing(model)
        model.train()
    tokens, mask = ids[:, width:], attention[:, width:]
    rows = []
    handle = model.model.register_forward_pre_hook(lambda m, a, k: rows.append(k["input_ids"].shape), with_kwargs=True)
    results = []
    for packed in (False, True):
        stats = functools.partial(
            completion_token_stats, model, ids, attention, width, tokens, 0.7, True, True, padding_free=packed
        )
        results.append(values_and_gradients(model, stats, mask))
    handle.remove()
    assert rows == [ids.shape, (1, int(attention.sum()))]
    padded, packed = results
    torch.testing.assert_close(packed[0] * mask, padded[0] * mask, atol=1e-10, rtol=0)
    torch.testing.assert_close(packed[1] * mask, padded[1] * mask, atol=1e-10, rtol=0)
    for name in padded[2]:
        torch.testing.assert_close(packed[2][name], padded[2][name], atol=1e-10, rtol=0, msg=name)
    assert (packed[0][~mask] == 0).all()  # padding scores nothing


def test_padding_free_is_refused_where_the_attention_cannot_tell_sequences_apart(tiny_assets):
    from rlhfkit.models import padding_free_refused

    model = float64_model(tiny_assets)
    assert padding_free_refused(model) is None and padding_free_refused(Wrapper(model)) is None
    model.config._attn_implementation = "paged_attention"
    assert "attention implementation is 'paged_attention'" in padding_free_refused(model)
    ids, attention, width = ragged_batch(tiny_assets)
    with pytest.raises(ConfigError, match="padding_free.*paged_attention"):
        completion_token_stats(model, ids, attention, width, ids[:, width:], 1.0, padding_free=True)
