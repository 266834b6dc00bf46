"""The model.generate fallback: for models whose forward refuses the lean loop's arguments, for generation options
the loop does not implement, and for a model with a generate of its own."""

import warnings
from unittest.mock import patch

import pytest
import torch
from transformers.generation.utils import GenerationMixin

from rlhfkit.sampling import complete, fallback, generate, sampling_config, terminator_ids, truncate_completions
from tests.helpers import full_forward_logprobs
from tests.sampling.fakes import NoLogitsToKeepInSignature, RaisesOnLogitsToKeep, UnrelatedTypeError


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
    theirs = truncate_completions(theirs[:, ids.shape[1] :], stop, tokenizer.pad_token_id).ids
    refusing.generation_config.suppress_tokens = [int(lean[0, 0])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = generate(refusing, ids, mask, config)
        generate(refusing, ids, mask, config)
    assert torch.equal(ours.tokens, lean) and ours.sampling_logprobs is None
    assert torch.equal(ours.tokens, theirs)
    assert refusing.generation_config.suppress_tokens == [int(lean[0, 0])]  # restored after the call
    (notice,) = fallback_notices(caught, cls)  # said once for two calls
    assert "logits_to_keep" in notice
    assert type(refusing) in fallback._NO_LEAN_LOOP and type(model) not in fallback._NO_LEAN_LOOP


@pytest.mark.parametrize("cls", [RaisesOnLogitsToKeep, NoLogitsToKeepInSignature], ids=["raises", "signature"])
def test_fallback_sampling_logprobs_match_a_full_forward(sft, tiny_assets, fresh_notices, cls):
    """The fallback's sampled log-probs are the full temperature-scaled distribution's, as the lean loop's are."""

    tokenizer, _, ids, mask = sft
    model = cls.from_pretrained(tiny_assets / "sft").eval()
    torch.manual_seed(1)
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(10, 0.7, tokenizer.pad_token_id, stop, top_k=5)
    prompts = [row[m].tolist() for row, m in zip(ids.repeat(4, 1), mask.repeat(4, 1))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (chunk,) = complete(model, prompts, config, batch_size=16)
    assert len(fallback_notices(caught, cls)) == 1
    expected = full_forward_logprobs(model, chunk, 0.7)
    m = chunk.completion_mask
    assert m.sum() > 16 and chunk.terminated.any()  # several real tokens, some rows stopped early
    torch.testing.assert_close(chunk.sampling_logprobs[m], expected[m], atol=1e-5, rtol=0)
    # Padded after the first stop token, exactly as the lean loop leaves its rows.
    assert (chunk.completion_ids[~m] == tokenizer.pad_token_id).all()


def test_an_unrelated_type_error_is_not_swallowed(sft, tiny_assets, fresh_notices):
    tokenizer, _, ids, mask = sft
    model = UnrelatedTypeError.from_pretrained(tiny_assets / "sft").eval()
    with pytest.raises(TypeError, match="unsupported operand"):
        generate(model, ids, mask, sampling_config(4, None, tokenizer.pad_token_id, [tokenizer.eos_token_id]))
    assert UnrelatedTypeError not in fallback._NO_LEAN_LOOP


# ------------------------------------------------------------------------------------------------
# TRL's further sampling options: min_p, repetition_penalty, generation_kwargs
# ------------------------------------------------------------------------------------------------


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
    theirs = truncate_completions(theirs, stop, tokenizer.pad_token_id).ids
    assert torch.equal(ours.tokens, theirs) and torch.equal(again.tokens, theirs) and ours.sampling_logprobs is None
    lean = generate(model, ids, mask, sampling_config(12, None, tokenizer.pad_token_id, stop)).tokens
    assert not torch.equal(truncate_completions(lean, stop, tokenizer.pad_token_id).ids, theirs)  # the option acted
    assert type(model) not in fallback._NO_LEAN_LOOP  # the model itself still takes the lean loop


@pytest.mark.parametrize("generation_kwargs", [{"bad_words_ids": "digit"}, {"num_beams": 2}])
def test_generate_fallback_for_options_samples_with_full_distribution_logprobs(sft, fresh_notices, generation_kwargs):
    """Sampling through model.generate for an option the loop lacks: tokens cut after the stop token, log-probs of
    the full softmax(logits / T) (a separate forward where beam search leaves generate's logits unaligned)."""

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
        (chunk,) = complete(model, prompts, config, batch_size=8)
    assert len(option_notices(caught, next(iter(generation_kwargs)))) == 1
    expected = full_forward_logprobs(model, chunk, 0.7)
    m = chunk.completion_mask
    assert m.sum() > 8 and chunk.terminated.any()
    torch.testing.assert_close(chunk.sampling_logprobs[m], expected[m], atol=1e-5, rtol=0)
    assert (chunk.sampling_logprobs[~m] == 0).all() and (chunk.completion_ids[~m] == tokenizer.pad_token_id).all()
    if "bad_words_ids" in generation_kwargs:
        assert banned not in chunk.completion_ids[m].tolist()


def scripted_generate(completion: list[int]):
    """A generate of the caller's, as TRL's tests patch one in: every row gets `completion`; the sequences alone."""

    def generate(input_ids, **kwargs):
        return torch.cat([input_ids, torch.tensor([completion] * len(input_ids))], dim=1)

    return generate


def test_a_generate_set_on_the_model_samples(sft, fresh_notices):
    """TRL samples with model.generate, so a generate set on the model object (unittest.mock's patch.object) is what
    samples, returning the sequences alone: its tokens, cut after the stop token, scored by one forward."""
    tokenizer, model, ids, mask = sft
    stop = terminator_ids(tokenizer, model)
    config = sampling_config(6, 0.7, tokenizer.pad_token_id, stop)
    script = [5, 6, stop[0], 7]
    prompts = [row[m].tolist() for row, m in zip(ids, mask)]
    with warnings.catch_warnings(record=True) as caught, patch.object(model, "generate", scripted_generate(script)):
        warnings.simplefilter("always")
        (chunk,) = complete(model, prompts, config, batch_size=4)
        complete(model, prompts, config, batch_size=4)
    assert chunk.completion_ids.tolist() == [[5, 6, stop[0], tokenizer.pad_token_id]] * 4
    assert chunk.completion_mask.tolist() == [[True, True, True, False]] * 4 and chunk.terminated.all()
    expected = full_forward_logprobs(model, chunk, 0.7)
    m = chunk.completion_mask
    torch.testing.assert_close(chunk.sampling_logprobs[m], expected[m], atol=1e-5, rtol=0)
    notices = [str(w.message) for w in caught if "own generate" in str(w.message)]
    assert len(notices) == 1 and "set on the model object" in notices[0]  # said once
    # Without the patch, the lean loop samples again (nothing was remembered against the class).
    assert fallback.own_generate(model) is None and type(model) not in fallback._NO_LEAN_LOOP


def test_transformers_generate_patched_or_a_class_s_own_samples(sft, fresh_notices):
    tokenizer, model, ids, mask = sft
    with patch.object(GenerationMixin, "generate", scripted_generate([4])):  # TRL's tests patch transformers' own
        assert "is not transformers' GenerationMixin.generate" in fallback.own_generate(model)

    class OwnGenerate(type(model)):
        def generate(self, *args, **kwargs):
            return super().generate(*args, **kwargs)

    assert "OwnGenerate.generate" in fallback.own_generate(OwnGenerate(model.config))
    assert fallback.own_generate(model) is None
    # A LoRA adapter's PeftModel has a generate that calls its base model's: the lean loop still samples.
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(type(model)(model.config), LoraConfig(r=2, target_modules=["q_proj"]))
    assert fallback.own_generate(lora) is None
