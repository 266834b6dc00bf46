"""Padding ids a model can embed: TRL's examples/scripts/ppo/ppo.py adds a [PAD] token without resizing the
embeddings, and padded ids reach forwards (masked, but embedded). Both sampling paths, and the pure helpers."""

import pytest
import torch

from rlhfkit.sampling import Chunk, complete, embeddable_ids, left_pad, model_pad_id, right_pad, sampling_config


@pytest.fixture
def beyond(sft):
    """The SFT model's tokenizer with TRL's [PAD] added past the model's embeddings."""
    tokenizer, model, _, _ = sft
    rows = model.get_input_embeddings().num_embeddings
    tokenizer = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    assert tokenizer.pad_token_id == rows
    return tokenizer, model, rows


def test_pad_ids_the_model_embeds_are_kept_and_others_become_0(beyond):
    tokenizer, model, rows = beyond
    assert model_pad_id(model, rows - 1) == rows - 1 and model_pad_id(model, rows) == 0
    assert model_pad_id(model, None) is None
    ids = torch.tensor([[rows, rows, 5, 6], [7, 8, rows - 1, rows]])
    mask = torch.tensor([[False, False, True, True], [True, True, False, False]])
    assert embeddable_ids(model, ids, mask).tolist() == [[0, 0, 5, 6], [7, 8, rows - 1, 0]]
    real_beyond = torch.tensor([[rows]])  # a real token the model cannot embed stays: that is a real error
    assert embeddable_ids(model, real_beyond, torch.tensor([[True]])).tolist() == [[rows]]


@pytest.mark.parametrize("path", ["lean loop", "model.generate"])
def test_both_sampling_paths_pad_with_an_id_the_model_embeds(beyond, fresh_notices, path):
    """Left-padded prompts and rows that stop early are fed to the model; with [PAD] beyond the embeddings they are
    padded with 0 instead, and the masks still say what is real."""
    tokenizer, model, rows = beyond
    prompts = [tokenizer(p)["input_ids"] for p in ("sort 4312=", "sort 999901=", "sort 12=", "sort 55555=")]
    options = {"no_repeat_ngram_size": 50} if path == "model.generate" else {}  # only generate implements it
    config = sampling_config(
        10, 1.0, tokenizer.pad_token_id, [tokenizer.eos_token_id], generation_kwargs=options
    )  # no-op n-gram ban: same distribution, but generate's path
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="no_repeat_ngram_size") if options else _nothing():
        (chunk,) = complete(model, prompts, config, 4)
    assert int(chunk.input_ids.max()) < rows
    assert [row[m].tolist() for row, m in zip(chunk.prompt_ids, chunk.prompt_mask)] == prompts
    assert not chunk.prompt_mask.all() and (chunk.prompt_ids[~chunk.prompt_mask] == 0).all()
    assert (chunk.completion_ids[~chunk.completion_mask] == 0).all()
    assert config.pad_token_id == tokenizer.pad_token_id  # the caller's config is left as it was


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("multiple", [1, 4, 16])
def test_a_chunk_padded_to_a_multiple_keeps_every_token_and_mask(multiple):
    """TRL's pad_to_multiple_of: prompts widened on the left, completions on the right, with padding masked out."""
    prompt_ids, prompt_mask = left_pad([[5, 6, 7], [8]], 0)
    completion_ids, completion_mask = right_pad([[1, 2, 3, 4, 9], [3]], 0)
    logprobs = torch.where(completion_mask, -torch.rand(completion_mask.shape), 0.0)
    chunk = Chunk(prompt_ids, prompt_mask, completion_ids, completion_mask, torch.tensor([True, False]), logprobs)
    padded = chunk.padded_to_multiple(multiple, pad_token_id=11)
    Lp, T = padded.prompt_ids.shape[1], padded.completion_ids.shape[1]
    assert Lp % multiple == 0 and T % multiple == 0 and Lp - 3 < multiple and T - 5 < multiple
    assert torch.equal(padded.prompt_ids[:, Lp - 3 :], prompt_ids) and (padded.prompt_ids[:, : Lp - 3] == 11).all()
    assert torch.equal(padded.prompt_mask[:, Lp - 3 :], prompt_mask) and not padded.prompt_mask[:, : Lp - 3].any()
    assert torch.equal(padded.completion_ids[:, :5], completion_ids) and (padded.completion_ids[:, 5:] == 11).all()
    assert torch.equal(padded.completion_mask[:, :5], completion_mask) and not padded.completion_mask[:, 5:].any()
    assert torch.equal(padded.sampling_logprobs[:, :5], logprobs) and (padded.sampling_logprobs[:, 5:] == 0).all()
    assert torch.equal(padded.terminated, chunk.terminated)
    assert chunk._replace(sampling_logprobs=None).padded_to_multiple(multiple, 11).sampling_logprobs is None
