"""The lean decoding loop against transformers' own generate: tokens, log-probs, shared prompt prefixes, the static
cache."""

import warnings

import pytest
import torch

from rlhfkit.sampling import (
    complete,
    completions,
    decoders,
    generate,
    sampling_config,
    terminator_ids,
    truncate_completions,
)
from tests.helpers import full_forward_logprobs
from tests.sampling.fakes import NoCachePosition, RaisesOnLogitsToKeep


def test_greedy_matches_transformers_generate(sft):
    """Same tokens as model.generate for left-padded prompts of different lengths, up to and after the EOS."""
    tokenizer, model, ids, mask = sft
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(10, None, tokenizer.pad_token_id, stop)
    ours = generate(model, ids, mask, config).tokens
    theirs = model.generate(input_ids=ids, attention_mask=mask.long(), generation_config=config)[:, ids.shape[1] :]
    ours_t, theirs_t = truncate_completions(ours, stop, 0), truncate_completions(theirs, stop, 0)
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


def test_sampling_logprobs_match_a_full_forward(sft):
    """The log-probs returned with the samples are those a training forward computes (full distribution at the
    sampling temperature), up to float rounding between cached decoding and one full pass."""

    tokenizer, model, ids, mask = sft
    torch.manual_seed(1)
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(10, 0.7, tokenizer.pad_token_id, stop, top_k=5)
    prompts = [row[m].tolist() for row, m in zip(ids, mask)]
    (chunk,) = complete(model, prompts, config, batch_size=8)
    expected = full_forward_logprobs(model, chunk, 0.7)
    m = chunk.completion_mask
    torch.testing.assert_close(chunk.sampling_logprobs[m], expected[m], atol=1e-5, rtol=0)
    assert (chunk.sampling_logprobs[~m] == 0).all()


@pytest.mark.parametrize("penalty", [1.5, 0.7])
def test_greedy_with_repetition_penalty_lean_loop_equals_generate(
    sft, tiny_assets, fresh_notices, monkeypatch, penalty
):
    """Greedy tokens with a repetition penalty: the lean loop, model.generate itself, and the fallback agree exactly,
    for left-padded prompts of different lengths (and the penalty changes the answer)."""
    tokenizer, model, ids, mask = sft
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(12, None, tokenizer.pad_token_id, stop, repetition_penalty=penalty)
    with monkeypatch.context() as m:
        m.setattr(completions, "hf_generate", None)  # the lean loop, nothing else
        lean = generate(model, ids, mask, config)
    assert lean.sampling_logprobs is None
    theirs = model.generate(input_ids=ids, attention_mask=mask.long(), generation_config=config)[:, ids.shape[1] :]
    refusing = RaisesOnLogitsToKeep.from_pretrained(tiny_assets / "sft").eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fallback = generate(refusing, ids, mask, config).tokens
    unpenalised = generate(model, ids, mask, sampling_config(12, None, tokenizer.pad_token_id, stop)).tokens
    lean_t, theirs_t, fallback_t, unpenalised_t = (
        truncate_completions(t, stop, tokenizer.pad_token_id).ids for t in (lean.tokens, theirs, fallback, unpenalised)
    )
    assert torch.equal(lean_t, theirs_t) and torch.equal(fallback_t, theirs_t)
    assert not torch.equal(lean_t, unpenalised_t)


def test_sampled_logprobs_with_penalty_and_min_p_are_the_plain_tempered_ones(sft):
    """Sampling with repetition_penalty and min_p returns the log-probs of the unpenalised softmax(logits / T), as a
    separate training forward computes them (TRL's log-probs), not those of the distribution sampled from."""

    tokenizer, model, ids, mask = sft
    torch.manual_seed(2)
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(10, 0.7, tokenizer.pad_token_id, stop, top_k=8, min_p=0.05, repetition_penalty=1.5)
    prompts = [row[m].tolist() for row, m in zip(ids.repeat(2, 1), mask.repeat(2, 1))]
    (chunk,) = complete(model, prompts, config, batch_size=8)
    expected = full_forward_logprobs(model, chunk, 0.7)
    m = chunk.completion_mask
    torch.testing.assert_close(chunk.sampling_logprobs[m], expected[m], atol=1e-5, rtol=0)
    # The penalty was in play: some response tokens repeat a real token before them (prompt or response).
    Lq = chunk.prompt_ids.shape[1]
    before = [
        chunk.input_ids[b, : Lq + t][chunk.attention_mask[b, : Lq + t]].tolist() for b, t in m.nonzero().tolist()
    ]
    assert any(int(chunk.completion_ids[b, t]) in seen for (b, t), seen in zip(m.nonzero().tolist(), before))


# ------------------------------------------------------------------------------------------------
# Shared prompt prefixes: consecutive identical prompts are encoded once
# ------------------------------------------------------------------------------------------------


def prefill_batch_sizes(model) -> tuple[list[int], object]:
    """Record the batch size of every forward that encodes more than one token per row (the prefills)."""
    sizes: list[int] = []

    def hook(module, args, kwargs):
        ids = kwargs["input_ids"]
        if ids.shape[1] > 1:
            sizes.append(ids.shape[0])

    return sizes, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize(
    "temperature, penalty", [(0.7, 1.0), (None, 1.0), (1.0, 1.3)], ids=["sampled", "greedy", "penalty"]
)
def test_shared_prefixes_give_the_unshared_tokens_and_logprobs(sft, temperature, penalty):
    """GRPO's layout (each prompt repeated in a run of rows, one run cut short as where a group spans processes):
    the prompts are encoded once each and the tokens and log-probs are those of encoding every row."""
    tokenizer, model, ids, mask = sft
    runs = [4, 4, 1, 3]
    index = torch.arange(4).repeat_interleave(torch.tensor(runs))
    query_ids, query_mask = ids[index], mask[index]
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(10, temperature, tokenizer.pad_token_id, stop, repetition_penalty=penalty)
    results, prefills = [], []
    for share in (True, False):
        sizes, handle = prefill_batch_sizes(model)
        torch.manual_seed(3)
        results.append(generate(model, query_ids, query_mask, config, share_prefixes=share))
        handle.remove()
        prefills.append(sizes)
    assert prefills == [[4], [12]]
    shared, unshared = results
    assert torch.equal(shared.tokens, unshared.tokens)
    assert len(set(map(tuple, shared.tokens.tolist()))) > 4 or temperature is None  # the copies sampled apart
    if temperature is not None:
        torch.testing.assert_close(shared.sampling_logprobs, unshared.sampling_logprobs, atol=1e-6, rtol=0)


def test_a_cache_without_reorder_cache_is_encoded_in_full(sft, monkeypatch):
    """A cache that cannot be expanded (custom code): the prompts are encoded again, one row each, same result."""
    import transformers

    tokenizer, model, ids, mask = sft
    query_ids, query_mask = ids.repeat_interleave(2, dim=0), mask.repeat_interleave(2, dim=0)
    config = sampling_config(8, None, tokenizer.pad_token_id, terminator_ids(tokenizer, model))
    expected = generate(model, query_ids, query_mask, config, share_prefixes=False).tokens
    monkeypatch.setattr(transformers.cache_utils.Cache, "reorder_cache", None)
    sizes, handle = prefill_batch_sizes(model)
    tokens = generate(model, query_ids, query_mask, config).tokens
    handle.remove()
    assert sizes == [4, 8]
    assert torch.equal(tokens, expected)


# ------------------------------------------------------------------------------------------------
# --cache_implementation static: a StaticCache and a compiled one-token step
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_static_cache_with_a_compiled_step_samples_what_the_dynamic_cache_does(sft, fresh_static):
    """Greedy (with a repetition penalty) and seeded sampling, on left-padded prompts of different lengths: the same
    tokens and log-probs as the eager DynamicCache loop; the second generation of the same shape reuses the graph."""
    tokenizer, model, ids, mask = sft
    stop = terminator_ids(tokenizer, model)
    for temperature, penalty in ((None, 1.3), (0.7, 1.0)):
        results = []
        for implementation in ("dynamic", "static", "static"):
            config = sampling_config(
                10, temperature, tokenizer.pad_token_id, stop, repetition_penalty=penalty,
                generation_kwargs={"cache_implementation": implementation},
            )  # fmt: skip
            torch.manual_seed(5)
            results.append(generate(model, ids, mask, config))
        dynamic, static, again = results
        assert torch.equal(static.tokens, dynamic.tokens) and torch.equal(again.tokens, dynamic.tokens)
        if temperature is not None:
            torch.testing.assert_close(static.sampling_logprobs, dynamic.sampling_logprobs, atol=1e-5, rtol=0)
    width = -(-(ids.shape[1] + 10) // decoders.STATIC_WIDTH_MULTIPLE) * decoders.STATIC_WIDTH_MULTIPLE
    assert list(decoders._STATIC_STEPS[model]) == [(4, width, ids.device, torch.float32)]  # one cache, one graph
    assert not decoders._NO_STATIC


def test_a_step_that_does_not_compile_is_decoded_eagerly_and_said_once(sft, fresh_static, monkeypatch):
    tokenizer, model, ids, mask = sft
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(
        8, None, tokenizer.pad_token_id, stop, generation_kwargs={"cache_implementation": "static"}
    )
    expected = generate(model, ids, mask, sampling_config(8, None, tokenizer.pad_token_id, stop)).tokens

    def refuse(*args, **kwargs):
        raise RuntimeError("inductor: no C++ compiler found")

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = generate(model, ids, mask, config).tokens  # finishes eagerly over its static cache
        second = generate(model, ids, mask, config).tokens  # the dynamic cache from then on
    said = [str(w.message) for w in caught if "cache_implementation static" in str(w.message)]
    assert len(said) == 1 and "no C++ compiler found" in said[0] and type(model).__name__ in said[0]
    assert torch.equal(first, expected) and torch.equal(second, expected)


def test_a_forward_without_cache_position_uses_the_dynamic_cache(sft, tiny_assets, fresh_static, fresh_notices):
    """A forward without cache_position: said once, then the lean loop over the dynamic cache."""
    tokenizer, model, ids, mask = sft
    legacy = NoCachePosition.from_pretrained(tiny_assets / "sft").eval()
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(
        8, None, tokenizer.pad_token_id, stop, generation_kwargs={"cache_implementation": "static"}
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokens = generate(legacy, ids, mask, config).tokens
    said = [str(w.message) for w in caught if "cache_implementation static" in str(w.message)]
    assert len(said) == 1 and "no cache_position" in said[0]
    expected = generate(model, ids, mask, sampling_config(8, None, tokenizer.pad_token_id, stop)).tokens
    assert torch.equal(tokens, expected)
