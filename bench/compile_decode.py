"""Does a compiled one-token decode step with a static KV cache pay on CPU? (issue 16, item 1)

Times rlhfkit's eager lean decoding loop (rlhfkit.rollout.generate) against the same sampling with transformers'
StaticCache and `torch.compile(fullgraph=True)` of the one-token step, on the bench model's shape (Llama, hidden 256,
intermediate 1024, 3 layers, 4 heads, vocabulary 49, random weights: speed does not depend on them), batch 16, a
12-token prompt and 48 new tokens, one thread. Prints the compile time (paid once per run) and the time per
generation of each path.

    .venv/bin/python bench/compile_decode.py
"""

import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

from rlhfkit.rollout import generate, sampling_config

B, PROMPT, NEW, REPEATS = 16, 12, 48, 3


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49, hidden_size=256, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, tie_word_embeddings=True, max_position_embeddings=128,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 49, (B, PROMPT))
    sampling = sampling_config(NEW, 1.0, 0, [2])  # id 2 is never sampled here often enough to stop every row early

    def eager():
        with torch.inference_mode():
            return generate(model, ids, torch.ones_like(ids, dtype=torch.bool), sampling)

    width = PROMPT + NEW
    cache = StaticCache(config=config, max_batch_size=B, max_cache_len=width)

    def step(token, position, cache_position, attention):
        out = model(
            input_ids=token, position_ids=position, cache_position=cache_position, past_key_values=cache,
            attention_mask=attention, use_cache=True,
        )  # fmt: skip
        return out.logits[:, -1, :]

    compiled_step = torch.compile(step, dynamic=False, fullgraph=True)

    def compiled():
        with torch.inference_mode():
            cache.reset()
            attention = torch.zeros(B, width, dtype=torch.long)
            attention[:, :PROMPT] = 1
            position = torch.arange(PROMPT)[None].expand(B, -1)
            logits = step(ids, position, torch.arange(PROMPT), attention)  # prefill, eager
            tokens = []
            for t in range(NEW):
                token = torch.multinomial(torch.softmax(logits.float(), -1), 1)
                tokens.append(token)
                if t == NEW - 1:
                    break
                attention[:, PROMPT + t] = 1
                at = torch.tensor([PROMPT + t])
                logits = compiled_step(token, at.expand(B, 1) + 0, at, attention)
            return torch.cat(tokens, 1)

    for name, run in (("eager lean loop", eager), ("static cache + torch.compile", compiled)):
        start = time.perf_counter()
        run()
        first = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(REPEATS):
            run()
        each = (time.perf_counter() - start) / REPEATS
        print(f"{name}: first call {first:.2f} s (compilation included), then {each:.3f} s per generation")


if __name__ == "__main__":
    main()
