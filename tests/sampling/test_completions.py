"""sampling.complete_texts: chunking does not change what is generated, and each chunk is reported as it is done."""

import pytest
import torch

from rlhfkit.sampling import complete_texts

PROMPTS = ["sort 4312=", "sort 999901=", "sort 12=", "sort 55555=", "sort 7=", "sort 31=", "sort 8080="]


def test_each_chunk_is_reported_and_chunking_changes_no_completion(sft):
    tokenizer, model, _, _ = sft
    reported = []
    chunked = complete_texts(model, tokenizer, PROMPTS, 6, batch_size=3, on_chunk=reported.append)
    assert reported == [3, 3, 1]  # the chunks of 3 prompts, as each finishes
    whole = complete_texts(model, tokenizer, PROMPTS, 6, batch_size=len(PROMPTS))
    assert chunked == whole and len(whole.texts) == len(PROMPTS)  # greedy: the split changes nothing


@pytest.mark.parametrize("lean", [True, False])
def test_sampling_on_a_cpu_returns_the_freed_heap_with_trim_cpu_heap(tiny_assets, monkeypatch, lean):
    """With --trim_cpu_heap (perf.lean_heap) the decoding loop's freed logits rows and caches go back to the system
    after sampling on a CPU (completions.return_freed_heap: glibc's malloc_trim); without it, nothing is called."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhfkit.sampling import completions

    calls = []
    from rlhfkit import perf

    monkeypatch.setattr(perf, "_malloc_trim", lambda: calls.append)
    monkeypatch.setattr(perf, "_LEAN_HEAP", lean)
    model = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft").eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "sft")
    config = completions.sampling_config(4, 1.0, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    prompt = torch.tensor([tokenizer("sort 21=")["input_ids"]])
    completions.generate(model, prompt, torch.ones_like(prompt, dtype=torch.bool), config)
    assert calls == ([0] if lean else [])
