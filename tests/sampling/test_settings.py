"""What to sample: the GenerationConfig built from TRL's options."""

import pytest
from transformers import GenerationConfig

from rlhfkit.sampling import sampling_config


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


def test_generation_kwargs_set_what_the_flags_of_the_same_name_set():
    """GRPOConfig accepts top_k, top_p, min_p and repetition_penalty in generation_kwargs as the flags: the same
    GenerationConfig, so the same sampler."""
    flags = sampling_config(10, 0.7, 0, [1], 0.9, 5, min_p=0.05, repetition_penalty=1.2)
    kwargs = sampling_config(
        10, 0.7, 0, [1],
        generation_kwargs={"top_p": 0.9, "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2, "do_sample": True,
                           "temperature": 0.7, "max_new_tokens": 10},
    )  # fmt: skip
    assert kwargs.to_dict() == flags.to_dict()
