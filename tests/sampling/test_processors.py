"""The next token from the logits: rlhfkit's processors against transformers' own warpers and processor list."""

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from rlhfkit.sampling import sampling_config
from rlhfkit.sampling.processors import mark_seen, pick, processed_logits, tokens_seen


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (3, 1.0), (0, 0.6), (4, 0.8)])
def test_sampling_distribution_matches_transformers_warpers(top_k, top_p):
    """The support and probabilities _pick samples from are those of HF's temperature/top-k/top-p warpers."""
    torch.manual_seed(0)
    logits = torch.randn(1, 7) * 2
    config = GenerationConfig(do_sample=True, temperature=0.8, top_k=top_k, top_p=top_p)
    z = logits / 0.8
    if top_k:
        z = TopKLogitsWarper(top_k)(None, z)
    if top_p < 1:
        z = TopPLogitsWarper(top_p)(None, z)
    expected = torch.softmax(z, dim=-1)[0]
    draws = torch.stack([pick(logits.expand(4000, 7), config)[0] for _ in range(5)]).flatten()
    freq = torch.bincount(draws, minlength=7).double() / draws.numel()
    assert set(freq.nonzero().flatten().tolist()) == set(expected.nonzero().flatten().tolist())
    torch.testing.assert_close(freq, expected.double(), atol=0.015, rtol=0)


OPTIONS = [
    dict(temperature=1.0, min_p=0.2),
    dict(temperature=1.0, repetition_penalty=1.7),
    dict(temperature=1.0, repetition_penalty=0.6),  # < 1 rewards repetition
    dict(temperature=None, repetition_penalty=1.7),  # greedy applies the penalty too
    dict(temperature=0.7, top_k=12, top_p=0.8, min_p=0.1, repetition_penalty=1.3),
    dict(temperature=1.4, top_p=0.9, min_p=0.05, repetition_penalty=1.2),
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_processed_logits_match_transformers_processors(sft, options):
    """The scores _pick draws from (or takes the argmax of) are those of the processor list transformers' generate
    builds for the same config (its own order), on the same logits and input ids: left-padded prompts plus
    generated tokens. Identical -inf masks and identical probabilities."""
    tokenizer, model, _, _ = sft
    options = dict(options)
    temperature = options.pop("temperature")
    config = sampling_config(4, temperature, tokenizer.pad_token_id, [tokenizer.eos_token_id], **options)
    torch.manual_seed(0)
    B, Lq, T, V = 8, 7, 3, model.config.vocab_size
    real = torch.randint(2, V, (B, Lq + T))  # never the pad token (0), so padding is the only place it occurs
    padding = torch.randint(0, Lq, (B,))
    query_mask = torch.arange(Lq)[None, :] >= padding[:, None]
    input_ids = real.clone()
    input_ids[:, :Lq] = real[:, :Lq].masked_fill(~query_mask, tokenizer.pad_token_id)
    logits = torch.randn(B, V) * 3
    processors = model._get_logits_processor(
        config, input_ids_seq_length=Lq, device="cpu", model_kwargs={"attention_mask": query_mask.long()}
    )
    theirs = processors(input_ids, logits.clone())

    seen = None
    if config.repetition_penalty is not None:
        seen = tokens_seen(input_ids[:, :Lq], query_mask, V)
        for t in range(Lq, Lq + T):
            mark_seen(seen, input_ids[:, t])
        seen = seen[:, :-1]
    ours = processed_logits(logits, config, seen)

    assert torch.equal(ours.isneginf(), theirs.isneginf())
    assert torch.equal(torch.softmax(ours, dim=-1), torch.softmax(theirs, dim=-1))
    if temperature is None:
        assert torch.equal(pick(logits, config, seen)[0], theirs.argmax(dim=-1))
    if config.min_p:
        assert ours.isneginf().any()  # the restriction is exercised
    if config.repetition_penalty is not None:
        assert not torch.equal(ours, processed_logits(logits, sampling_config(4, temperature, 0, [1])))


@pytest.mark.parametrize(
    "options", OPTIONS[:3] + OPTIONS[4:], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
)
def test_pick_returns_the_unpenalised_unrestricted_logprob(options):
    """Whatever penalty and restrictions shaped the draw, the log-prob is that of softmax(logits / temperature)."""
    options = dict(options)
    temperature = options.pop("temperature")
    config = sampling_config(4, temperature, 0, [1], **options)
    torch.manual_seed(0)
    logits = torch.randn(64, 20) * 3
    seen = torch.rand(64, 20) < 0.3 if config.repetition_penalty is not None else None
    token, logprob = pick(logits, config, seen)
    expected = torch.log_softmax(logits / temperature, dim=-1).gather(-1, token[:, None]).squeeze(-1)
    torch.testing.assert_close(logprob, expected, atol=1e-6, rtol=0)
    assert processed_logits(logits, config, seen).gather(-1, token[:, None]).isfinite().all()
