"""sampling.complete_texts: chunking does not change what is generated, and each chunk is reported as it is done."""

from rlhfkit.sampling import complete_texts

PROMPTS = ["sort 4312=", "sort 999901=", "sort 12=", "sort 55555=", "sort 7=", "sort 31=", "sort 8080="]


def test_each_chunk_is_reported_and_chunking_changes_no_completion(sft):
    tokenizer, model, _, _ = sft
    reported = []
    chunked = complete_texts(model, tokenizer, PROMPTS, 6, batch_size=3, on_chunk=reported.append)
    assert reported == [3, 3, 1]  # the chunks of 3 prompts, as each finishes
    whole = complete_texts(model, tokenizer, PROMPTS, 6, batch_size=len(PROMPTS))
    assert chunked == whole and len(whole.texts) == len(PROMPTS)  # greedy: the split changes nothing
