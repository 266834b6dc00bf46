"""Generation: the lean KV-cache loop against transformers' own generate and its logits warpers."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from rlhfkit.data import left_pad
from rlhfkit.rollout import _pick, generate, sampling_config, terminator_ids, truncate_responses


@pytest.fixture(scope="module")
def sft(tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "sft", padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft").eval()
    prompts = [tokenizer(p)["input_ids"] for p in ("sort 4312=", "sort 999901=", "sort 12=", "sort 55555=")]
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    return tokenizer, model, ids, mask


def test_greedy_matches_transformers_generate(sft):
    """Same tokens as model.generate for left-padded prompts of different lengths, up to and after the EOS."""
    tokenizer, model, ids, mask = sft
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(10, None, tokenizer.pad_token_id, stop)
    ours = generate(model, ids, mask, config).tokens
    theirs = model.generate(input_ids=ids, attention_mask=mask.long(), generation_config=config)[:, ids.shape[1] :]
    ours_t, theirs_t = truncate_responses(ours, stop, 0), truncate_responses(theirs, stop, 0)
    assert torch.equal(ours_t.ids, theirs_t.ids) and torch.equal(ours_t.mask, theirs_t.mask)


def test_sampling_stops_and_pads_after_the_stop_token(sft):
    tokenizer, model, ids, mask = sft
    torch.manual_seed(0)
    stop = terminator_ids(tokenizer, model)
    raw = generate(
        model, ids.repeat(8, 1), mask.repeat(8, 1), sampling_config(12, 1.0, tokenizer.pad_token_id, stop)
    ).tokens
    assert raw.shape[1] <= 12
    for row in raw.tolist():
        if any(t in stop for t in row):
            end = next(i for i, t in enumerate(row) if t in stop)
            assert all(t == tokenizer.pad_token_id for t in row[end + 1 :])


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
    draws = torch.stack([_pick(logits.expand(4000, 7), config)[0] for _ in range(5)]).flatten()
    freq = torch.bincount(draws, minlength=7).double() / draws.numel()
    assert set(freq.nonzero().flatten().tolist()) == set(expected.nonzero().flatten().tolist())
    torch.testing.assert_close(freq, expected.double(), atol=0.015, rtol=0)


def test_sampling_logprobs_match_a_full_forward(sft):
    """The log-probs returned with the samples are those a training forward computes (full distribution at the
    sampling temperature), up to float rounding between cached decoding and one full pass."""
    from rlhfkit.models import policy_logits
    from rlhfkit.rollout import complete, response_logprobs

    tokenizer, model, ids, mask = sft
    torch.manual_seed(1)
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(10, 0.7, tokenizer.pad_token_id, stop, top_k=5)
    prompts = [row[m].tolist() for row, m in zip(ids, mask)]
    (chunk,) = complete(model, prompts, config, stop, tokenizer.pad_token_id, batch_size=8)
    logits = policy_logits(model, chunk.input_ids, chunk.attention_mask)
    expected = response_logprobs(logits, chunk.query_ids.shape[1], chunk.responses.ids, 0.7)
    m = chunk.responses.mask
    torch.testing.assert_close(chunk.logprobs[m], expected[m], atol=1e-5, rtol=0)
    assert (chunk.logprobs[~m] == 0).all()
