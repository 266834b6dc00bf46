"""Generation: the lean KV-cache loop against transformers' own generate and its logits warpers."""

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from rlhfkit import rollout
from rlhfkit.data import left_pad
from rlhfkit.rollout import _pick, generate, sampling_config, terminator_ids, truncate_responses
from tests.helpers import full_forward_logprobs


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
    from rlhfkit.rollout import complete

    tokenizer, model, ids, mask = sft
    torch.manual_seed(1)
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(10, 0.7, tokenizer.pad_token_id, stop, top_k=5)
    prompts = [row[m].tolist() for row, m in zip(ids, mask)]
    (chunk,) = complete(model, prompts, config, stop, tokenizer.pad_token_id, batch_size=8)
    expected = full_forward_logprobs(model, chunk, 0.7)
    m = chunk.responses.mask
    torch.testing.assert_close(chunk.logprobs[m], expected[m], atol=1e-5, rtol=0)
    assert (chunk.logprobs[~m] == 0).all()


# ------------------------------------------------------------------------------------------------
# The model.generate fallback, for models whose forward refuses the lean loop's arguments
# ------------------------------------------------------------------------------------------------


class RaisesOnLogitsToKeep(LlamaForCausalLM):
    """Like remote code that passes **kwargs on to a layer which does not know logits_to_keep."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        if "logits_to_keep" in kwargs:
            raise TypeError("LlamaModel.forward() got an unexpected keyword argument 'logits_to_keep'")
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)


def listed_forward(model, cache, past_key_values, **arguments):
    """LlamaForCausalLM's forward for a subclass that lists its arguments: the KV cache, passed by either name, goes
    on under the name the installed transformers takes ('cache' from 5.24 on)."""
    cache = cache if cache is not None else past_key_values
    name = "cache" if rollout._transformers_names_it_cache() else "past_key_values"
    return LlamaForCausalLM.forward(model, **arguments, **{name: cache})


class NoLogitsToKeepInSignature(LlamaForCausalLM):
    """Like an older architecture whose forward lists its arguments and has no logits_to_keep (nor **kwargs)."""

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        cache=None,  # the KV cache's name since transformers 5.24, which its generate passes
        use_cache=None,
        return_dict=None,
    ):
        return listed_forward(
            self, cache, past_key_values, input_ids=input_ids, attention_mask=attention_mask,
            position_ids=position_ids, use_cache=use_cache, return_dict=return_dict,
        )  # fmt: skip


class NoCachePosition(LlamaForCausalLM):
    """A forward that lists the lean loop's arguments but not cache_position (what the static cache needs)."""

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, cache=None,
        use_cache=None, logits_to_keep=0,
    ):  # fmt: skip
        return listed_forward(
            self, cache, past_key_values, input_ids=input_ids, attention_mask=attention_mask,
            position_ids=position_ids, use_cache=use_cache, logits_to_keep=logits_to_keep,
        )  # fmt: skip


class UnrelatedTypeError(LlamaForCausalLM):
    def forward(self, **kwargs):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")


@pytest.fixture
def fresh_notices(monkeypatch):
    """Each test starts with no model class known to refuse the lean loop and no generation option announced (so
    their notices are said again)."""
    monkeypatch.setattr(rollout, "_NO_LEAN_LOOP", {})
    monkeypatch.setattr(rollout, "_ANNOUNCED_OPTIONS", set())


def fallback_notices(caught, cls) -> list[str]:
    return [str(w.message) for w in caught if cls.__name__ in str(w.message) and "model.generate" in str(w.message)]


@pytest.mark.parametrize("cls", [RaisesOnLogitsToKeep, NoLogitsToKeepInSignature], ids=["raises", "signature"])
def test_fallback_greedy_tokens_equal_the_lean_loop_and_generate(sft, tiny_assets, fresh_notices, cls):
    """Greedy tokens from the fallback equal the lean loop's on the same weights, and model.generate's; the model's
    own generation_config (here a suppressed token the greedy answer needs) is not applied, as in the lean loop."""
    tokenizer, model, ids, mask = sft
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(10, None, tokenizer.pad_token_id, stop)
    lean = generate(model, ids, mask, config).tokens
    refusing = cls.from_pretrained(tiny_assets / "sft").eval()
    theirs = refusing.generate(input_ids=ids, attention_mask=mask.long(), generation_config=config)
    theirs = truncate_responses(theirs[:, ids.shape[1] :], stop, tokenizer.pad_token_id).ids
    refusing.generation_config.suppress_tokens = [int(lean[0, 0])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = generate(refusing, ids, mask, config)
        generate(refusing, ids, mask, config)
    assert torch.equal(ours.tokens, lean) and ours.logprobs is None
    assert torch.equal(ours.tokens, theirs)
    assert refusing.generation_config.suppress_tokens == [int(lean[0, 0])]  # restored after the call
    (notice,) = fallback_notices(caught, cls)  # said once for two calls
    assert "logits_to_keep" in notice
    assert type(refusing) in rollout._NO_LEAN_LOOP and type(model) not in rollout._NO_LEAN_LOOP


@pytest.mark.parametrize("cls", [RaisesOnLogitsToKeep, NoLogitsToKeepInSignature], ids=["raises", "signature"])
def test_fallback_sampling_logprobs_match_a_full_forward(sft, tiny_assets, fresh_notices, cls):
    """The fallback's sampled log-probs are the full temperature-scaled distribution's, as the lean loop's are."""
    from rlhfkit.rollout import complete

    tokenizer, _, ids, mask = sft
    model = cls.from_pretrained(tiny_assets / "sft").eval()
    torch.manual_seed(1)
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(10, 0.7, tokenizer.pad_token_id, stop, top_k=5)
    prompts = [row[m].tolist() for row, m in zip(ids.repeat(4, 1), mask.repeat(4, 1))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (chunk,) = complete(model, prompts, config, stop, tokenizer.pad_token_id, batch_size=16)
    assert len(fallback_notices(caught, cls)) == 1
    expected = full_forward_logprobs(model, chunk, 0.7)
    m = chunk.responses.mask
    assert m.sum() > 16 and chunk.responses.terminated.any()  # several real tokens, some rows stopped early
    torch.testing.assert_close(chunk.logprobs[m], expected[m], atol=1e-5, rtol=0)
    # Padded after the first stop token, exactly as the lean loop leaves its rows.
    assert (chunk.responses.ids[~m] == tokenizer.pad_token_id).all()


def test_an_unrelated_type_error_is_not_swallowed(sft, tiny_assets, fresh_notices):
    tokenizer, _, ids, mask = sft
    model = UnrelatedTypeError.from_pretrained(tiny_assets / "sft").eval()
    with pytest.raises(TypeError, match="unsupported operand"):
        generate(model, ids, mask, sampling_config(4, None, tokenizer.pad_token_id, [tokenizer.eos_token_id]))
    assert UnrelatedTypeError not in rollout._NO_LEAN_LOOP


# ------------------------------------------------------------------------------------------------
# TRL's further sampling options: min_p, repetition_penalty, generation_kwargs
# ------------------------------------------------------------------------------------------------


def test_sampling_config_defaults_are_unchanged_and_generation_kwargs_override():
    sampled = sampling_config(10, 0.7, 0, [1, 2], 0.9, 5)
    assert (
        sampled.to_dict()
        == GenerationConfig(
            do_sample=True, temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=10, pad_token_id=0, eos_token_id=[1, 2]
        ).to_dict()
    )
    greedy = sampling_config(10, None, 0, [1])
    assert (
        greedy.to_dict()
        == GenerationConfig(do_sample=False, max_new_tokens=10, pad_token_id=0, eos_token_id=[1]).to_dict()
    )
    config = sampling_config(
        10, 0.7, 0, [1], top_k=5, min_p=0.1, repetition_penalty=2, generation_kwargs={"top_k": 3, "num_beams": 2}
    )
    assert (config.top_k, config.min_p, config.repetition_penalty, config.num_beams) == (3, 0.1, 2.0, 2)
    assert sampling_config(10, None, 0, [1], min_p=0.1, repetition_penalty=1.5).repetition_penalty == 1.5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(generation_kwargs={"num_beam": 2, "top_k": 3}), "unknown GenerationConfig field.*'num_beam'"),
        (dict(generation_kwargs={"num_return_sequences": 4}), "num_return_sequences=4"),
        (dict(repetition_penalty=0.0), "repetition_penalty=0.0"),
        (dict(min_p=1.5), "min_p=1.5"),
    ],
)
def test_sampling_config_rejects_what_it_cannot_honour(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sampling_config(10, 0.7, 0, [1], **kwargs)


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
        seen = rollout._tokens_seen(input_ids[:, :Lq], query_mask, V)
        for t in range(Lq, Lq + T):
            rollout._mark_seen(seen, input_ids[:, t])
        seen = seen[:, :-1]
    ours = rollout._processed_logits(logits, config, seen)

    assert torch.equal(ours.isneginf(), theirs.isneginf())
    assert torch.equal(torch.softmax(ours, dim=-1), torch.softmax(theirs, dim=-1))
    if temperature is None:
        assert torch.equal(_pick(logits, config, seen)[0], theirs.argmax(dim=-1))
    if config.min_p:
        assert ours.isneginf().any()  # the restriction is exercised
    if config.repetition_penalty is not None:
        assert not torch.equal(ours, rollout._processed_logits(logits, sampling_config(4, temperature, 0, [1])))


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
    token, logprob = _pick(logits, config, seen)
    expected = torch.log_softmax(logits / temperature, dim=-1).gather(-1, token[:, None]).squeeze(-1)
    torch.testing.assert_close(logprob, expected, atol=1e-6, rtol=0)
    assert rollout._processed_logits(logits, config, seen).gather(-1, token[:, None]).isfinite().all()


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
        m.setattr(rollout, "_hf_generate", None)  # the lean loop, nothing else
        lean = generate(model, ids, mask, config)
    assert lean.logprobs is None
    theirs = model.generate(input_ids=ids, attention_mask=mask.long(), generation_config=config)[:, ids.shape[1] :]
    refusing = RaisesOnLogitsToKeep.from_pretrained(tiny_assets / "sft").eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fallback = generate(refusing, ids, mask, config).tokens
    unpenalised = generate(model, ids, mask, sampling_config(12, None, tokenizer.pad_token_id, stop)).tokens
    lean_t, theirs_t, fallback_t, unpenalised_t = (
        truncate_responses(t, stop, tokenizer.pad_token_id).ids for t in (lean.tokens, theirs, fallback, unpenalised)
    )
    assert torch.equal(lean_t, theirs_t) and torch.equal(fallback_t, theirs_t)
    assert not torch.equal(lean_t, unpenalised_t)


def test_sampled_logprobs_with_penalty_and_min_p_are_the_plain_tempered_ones(sft):
    """Sampling with repetition_penalty and min_p returns the log-probs of the unpenalised softmax(logits / T), as a
    separate training forward computes them (TRL's log-probs), not those of the distribution sampled from."""
    from rlhfkit.rollout import complete

    tokenizer, model, ids, mask = sft
    torch.manual_seed(2)
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(10, 0.7, tokenizer.pad_token_id, stop, top_k=8, min_p=0.05, repetition_penalty=1.5)
    prompts = [row[m].tolist() for row, m in zip(ids.repeat(2, 1), mask.repeat(2, 1))]
    (chunk,) = complete(model, prompts, config, stop, tokenizer.pad_token_id, batch_size=8)
    expected = full_forward_logprobs(model, chunk, 0.7)
    m = chunk.responses.mask
    torch.testing.assert_close(chunk.logprobs[m], expected[m], atol=1e-5, rtol=0)
    # The penalty was in play: some response tokens repeat a real token before them (prompt or response).
    Lq = chunk.query_ids.shape[1]
    before = [
        chunk.input_ids[b, : Lq + t][chunk.attention_mask[b, : Lq + t]].tolist() for b, t in m.nonzero().tolist()
    ]
    assert any(int(chunk.responses.ids[b, t]) in seen for (b, t), seen in zip(m.nonzero().tolist(), before))


def option_notices(caught, option) -> list[str]:
    return [str(w.message) for w in caught if option in str(w.message) and "model.generate" in str(w.message)]


@pytest.mark.parametrize(
    "generation_kwargs, option",
    [({"no_repeat_ngram_size": 2}, "no_repeat_ngram_size"), ({"num_beams": 3}, "num_beams")],
)
def test_an_option_the_lean_loop_lacks_goes_through_generate_once(sft, fresh_notices, generation_kwargs, option):
    """Greedy with no_repeat_ngram_size / beam search: the tokens are model.generate's, and the switch is said once."""
    tokenizer, model, ids, mask = sft
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(12, None, tokenizer.pad_token_id, stop, generation_kwargs=generation_kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = generate(model, ids, mask, config)
        again = generate(model, ids, mask, config)
    (notice,) = option_notices(caught, option)
    assert "lean" in notice
    theirs = model.generate(input_ids=ids, attention_mask=mask.long(), generation_config=config)[:, ids.shape[1] :]
    theirs = truncate_responses(theirs, stop, tokenizer.pad_token_id).ids
    assert torch.equal(ours.tokens, theirs) and torch.equal(again.tokens, theirs) and ours.logprobs is None
    lean = generate(model, ids, mask, sampling_config(12, None, tokenizer.pad_token_id, stop)).tokens
    assert not torch.equal(truncate_responses(lean, stop, tokenizer.pad_token_id).ids, theirs)  # the option acted
    assert type(model) not in rollout._NO_LEAN_LOOP  # the model itself still takes the lean loop


@pytest.mark.parametrize("generation_kwargs", [{"bad_words_ids": "digit"}, {"num_beams": 2}])
def test_generate_fallback_for_options_samples_with_full_distribution_logprobs(sft, fresh_notices, generation_kwargs):
    """Sampling through model.generate for an option the loop lacks: tokens cut after the stop token, log-probs of
    the full softmax(logits / T) (a separate forward where beam search leaves generate's logits unaligned)."""
    from rlhfkit.rollout import complete

    tokenizer, model, ids, mask = sft
    stop = terminator_ids(tokenizer, model)
    banned = tokenizer.convert_tokens_to_ids("9")
    if "bad_words_ids" in generation_kwargs:
        generation_kwargs = {"bad_words_ids": [[banned]]}
    config = sampling_config(10, 0.7, tokenizer.pad_token_id, stop, generation_kwargs=generation_kwargs)
    torch.manual_seed(3)
    prompts = [row[m].tolist() for row, m in zip(ids.repeat(2, 1), mask.repeat(2, 1))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (chunk,) = complete(model, prompts, config, stop, tokenizer.pad_token_id, batch_size=8)
    assert len(option_notices(caught, next(iter(generation_kwargs)))) == 1
    expected = full_forward_logprobs(model, chunk, 0.7)
    m = chunk.responses.mask
    assert m.sum() > 8 and chunk.responses.terminated.any()
    torch.testing.assert_close(chunk.logprobs[m], expected[m], atol=1e-5, rtol=0)
    assert (chunk.logprobs[~m] == 0).all() and (chunk.responses.ids[~m] == tokenizer.pad_token_id).all()
    if "bad_words_ids" in generation_kwargs:
        assert banned not in chunk.responses.ids[m].tolist()


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
        torch.testing.assert_close(shared.logprobs, unshared.logprobs, atol=1e-6, rtol=0)


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


@pytest.fixture
def fresh_static(monkeypatch):
    """No model class refused the static cache yet, and no compiled step is kept from another test."""
    import weakref

    monkeypatch.setattr(rollout, "_NO_STATIC", {})
    monkeypatch.setattr(rollout, "_STATIC_STEPS", weakref.WeakKeyDictionary())


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
            torch.testing.assert_close(static.logprobs, dynamic.logprobs, atol=1e-5, rtol=0)
    width = -(-(ids.shape[1] + 10) // rollout.STATIC_WIDTH_MULTIPLE) * rollout.STATIC_WIDTH_MULTIPLE
    assert list(rollout._STATIC_STEPS[model]) == [(4, width, ids.device, torch.float32)]  # one cache, one graph
    assert not rollout._NO_STATIC


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
