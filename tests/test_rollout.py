"""Generation: the lean KV-cache loop against transformers' own generate and its logits warpers."""

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from rlhfkit import rollout
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


# ------------------------------------------------------------------------------------------------
# The model.generate fallback, for models whose forward refuses the lean loop's arguments
# ------------------------------------------------------------------------------------------------


class RaisesOnLogitsToKeep(LlamaForCausalLM):
    """Like remote code that passes **kwargs on to a layer which does not know logits_to_keep."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
        if "logits_to_keep" in kwargs:
            raise TypeError("LlamaModel.forward() got an unexpected keyword argument 'logits_to_keep'")
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            **kwargs,
        )


class NoLogitsToKeepInSignature(LlamaForCausalLM):
    """Like an older architecture whose forward lists its arguments and has no logits_to_keep (nor **kwargs)."""

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        use_cache=None,
        return_dict=None,
    ):
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            return_dict=return_dict,
        )


class UnrelatedTypeError(LlamaForCausalLM):
    def forward(self, **kwargs):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")


@pytest.fixture
def fresh_notices(monkeypatch):
    """Each test starts with no model class known to refuse the lean loop (so its notice is said again)."""
    monkeypatch.setattr(rollout, "_NO_LEAN_LOOP", {})


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
    from rlhfkit.models import policy_logits
    from rlhfkit.rollout import complete, response_logprobs

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
    logits = policy_logits(model, chunk.input_ids, chunk.attention_mask)
    expected = response_logprobs(logits, chunk.query_ids.shape[1], chunk.responses.ids, 0.7)
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
