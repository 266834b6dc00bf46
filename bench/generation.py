"""Three measurements behind issue 16's choices, on the bench model's shape (Llama, hidden 256, intermediate 1024,
3 layers, 4 heads, vocabulary 49, random weights: speed does not depend on them), one thread, median of 5:

1. shared prompt prefixes: rlhfkit's decoder with GRPO's layout (2 prompts x 8 completions, 48 new tokens), each
   prompt encoded once (the default) against every row encoded; and the same for 512-token prompts;
2. the KV cache: transformers' DynamicCache (what the lean loop uses) against a StaticCache, both eager, greedy;
3. padding-free training forwards: forward + backward of 16 left-padded sequences against the same tokens packed
   into one row (position ids restarting per sequence, no attention mask: transformers then builds a
   block-diagonal mask for SDPA), for the bench's lengths and for GRPO-like completions of 20-256 tokens.

    .venv/bin/python bench/generation.py
"""

import functools
import statistics
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache

from rlhfkit.sampling import generate, left_pad, sampling_config

REPEATS = 5


def median_seconds(fn, repeats: int = REPEATS) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=49, hidden_size=256, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, tie_word_embeddings=True, max_position_embeddings=1024, attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config)


def shared_prefixes(model: LlamaForCausalLM) -> None:
    sampling = sampling_config(48, 1.0, 0, [2])

    def run(ids, mask, share):
        with torch.inference_mode():
            generate(model, ids, mask, sampling, share_prefixes=share)

    for prompt_length in (12, 512):
        prompts = [torch.randint(3, 49, (prompt_length - k,)).tolist() for k in range(2)]
        ids, mask = left_pad([p for p in prompts for _ in range(8)], 0)
        for share in (True, False):
            label = "each prompt once" if share else "every row"
            seconds = median_seconds(functools.partial(run, ids, mask, share))
            print(f"  {prompt_length}-token prompts, {label}: {seconds:.3f} s per generation")


def kv_cache(model: LlamaForCausalLM) -> None:
    B, P, N = 16, 12, 48
    ids = torch.randint(3, 49, (B, P))

    def decode(static: bool) -> None:
        with torch.inference_mode():
            width = P + N
            cache = StaticCache(config=model.config, max_cache_len=width) if static else DynamicCache()
            attention = torch.ones(B, width if static else P, dtype=torch.long)
            attention[:, P:] = 0
            step = dict(attention_mask=attention, use_cache=True, cache_position=torch.arange(P))
            out = model(input_ids=ids, cache=cache, logits_to_keep=1, **step)
            for t in range(N - 1):
                token = out.logits[:, -1].argmax(-1, keepdim=True)
                if static:
                    attention[:, P + t] = 1
                else:
                    attention = torch.cat([attention, attention.new_ones(B, 1)], dim=1)
                position = torch.full((B, 1), P + t)
                out = model(
                    input_ids=token, attention_mask=attention, cache=cache, use_cache=True, position_ids=position,
                    cache_position=torch.tensor([P + t]),
                )  # fmt: skip

    for static in (False, True):
        name = "StaticCache" if static else "DynamicCache"
        print(f"  {name}: {median_seconds(lambda static=static: decode(static)):.3f} s per generation")


def forward_backward(model, ids, mask, position) -> None:
    model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=False).logits.mean().backward()


def packing(model: LlamaForCausalLM) -> None:
    lengths_of = {
        "bench (prompts 9-14 + 48 tokens)": [n + 48 for n in (9, 10, 11, 12, 13, 14, 9, 10, 11, 12, 13, 14, 12, 11)],
        "GRPO-like (32 + 20-256 tokens)": [32 + int(n) for n in torch.randint(20, 257, (16,))],
    }
    for name, lengths in lengths_of.items():
        width = max(lengths)
        ids = torch.randint(3, 49, (len(lengths), width))
        mask = torch.zeros_like(ids)
        for i, n in enumerate(lengths):
            mask[i, width - n :] = 1
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        packed_ids = ids[mask.bool()][None]
        packed_position = torch.cat([torch.arange(n) for n in lengths])[None]

        padded = functools.partial(forward_backward, model, ids, mask, position)
        packed = functools.partial(forward_backward, model, packed_ids, None, packed_position)
        padded_s, packed_s = median_seconds(padded), median_seconds(packed)
        print(
            f"  {name}: padded {ids.numel()} tokens {padded_s:.3f} s, packed {packed_ids.numel()} tokens "
            f"{packed_s:.3f} s ({packed_s / padded_s:.2f}x)"
        )


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = bench_model().eval()
    print("1. shared prompt prefixes (GRPO layout: 2 prompts x 8 completions, 48 new tokens)")
    shared_prefixes(model)
    print("2. KV cache, eager, greedy (16 rows, 12-token prompts, 48 new tokens)")
    kv_cache(model)
    print("3. padding-free training forward + backward")
    packing(model.train())


if __name__ == "__main__":
    main()
