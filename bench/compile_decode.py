"""Does --cache_implementation static (a StaticCache and a compiled one-token step) pay on this machine?

Times rlhfkit's decoder (rlhfkit.sampling.generate) with the dynamic cache (eager steps, the default) and with the
static cache (``torch.compile``d step), on the bench model's shape (Llama, hidden 256, intermediate 1024, 3 layers,
4 heads, vocabulary 49, random weights: speed does not depend on them), batch 16, 10- to 12-token prompts and 48 new
tokens, one thread, in two layouts: GRPO's (2 prompts x 8 completions, which the dynamic path encodes once per
prompt) and 16 distinct prompts (PPO's). Prints the first call (compilation included: paid once per batch shape and
run) and the median of the following calls.

    .venv/bin/python bench/compile_decode.py [--repeats 10]
"""

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlhfkit.sampling import generate, left_pad, sampling_config

B, PROMPT, NEW = 16, 12, 48


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10)
    repeats = p.parse_args().repeats
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49, hidden_size=256, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, tie_word_embeddings=True, max_position_embeddings=256,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    prompts = [torch.randint(3, 49, (PROMPT - k % 3,)).tolist() for k in range(B)]
    layouts = {"2 prompts x 8": [p for p in prompts[:2] for _ in range(B // 2)], "16 distinct prompts": prompts}
    for layout, rows in layouts.items():
        ids, mask = left_pad(rows, 0)
        for implementation in ("dynamic", "static"):
            # id 2 stands for the EOS: rarely drawn by random weights, so generations run their 48 tokens
            sampling = sampling_config(NEW, 1.0, 0, [2], generation_kwargs={"cache_implementation": implementation})
            times = []
            for _ in range(repeats + 1):
                start = time.perf_counter()
                generate(model, ids, mask, sampling)
                times.append(time.perf_counter() - start)
            print(
                f"{layout}, {implementation}: first call {times[0]:.2f} s, then {statistics.median(times[1:]):.3f} s "
                f"per generation (median of {repeats})"
            )


if __name__ == "__main__":
    main()
