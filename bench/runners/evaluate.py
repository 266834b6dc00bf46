"""Final task success, computed the same way for every library (imports torch, transformers, datasets only).

Greedy completions of the test prompts by a saved policy, cut at the task's real end-of-answer token (``<eos>``,
id 1 of rlhfkit's character tokenizer; the benchmark's fixed-length view declares another EOS so that training
always generates the full length, see bench/assets.py). A completion is correct when the text before that token,
stripped, equals the sorted digits of the prompt, and the token is there.

    python bench/runners/evaluate.py MODEL_DIR TOKENIZER_DIR PROMPTS_DIR [--max_new_tokens 48]
"""

from __future__ import annotations

import json
import sys

PREFIX, SUFFIX = "sort ", "="
REAL_EOS_ID = 1


def answer(prompt: str) -> str:
    body = prompt.strip()
    return "".join(sorted(body[len(PREFIX) : -len(SUFFIX)]))


def task_success(
    model_dir: str,
    tokenizer_dir: str,
    prompts_dir: str,
    max_new_tokens: int = 48,
    batch_size: int = 128,
    split: str = "test",
) -> dict:
    import torch
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(tokenizer_dir, padding_side="left")
    assert tok.eos_token_id == REAL_EOS_ID, (tokenizer_dir, tok.eos_token_id)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = list(load_from_disk(prompts_dir)[split]["prompt"])
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=REAL_EOS_ID, pad_token_id=tok.pad_token_id
    )
    correct = ended = 0
    with torch.inference_mode():
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i : i + batch_size]
            enc = tok(chunk, return_tensors="pt", padding=True)
            out = model.generate(**enc, generation_config=config)[:, enc["input_ids"].shape[1] :]
            for prompt, row in zip(chunk, out.tolist()):
                if REAL_EOS_ID not in row:
                    continue
                ended += 1
                text = tok.decode(row[: row.index(REAL_EOS_ID)], skip_special_tokens=True)
                correct += text.strip() == answer(prompt)
    n = len(prompts)
    return {"task_success": correct / n, "ended": ended / n, "eval_prompts": n}


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("tokenizer_dir")
    p.add_argument("prompts_dir")
    p.add_argument("--max_new_tokens", type=int, default=48)
    ns = p.parse_args()
    print(json.dumps(task_success(ns.model_dir, ns.tokenizer_dir, ns.prompts_dir, ns.max_new_tokens)))
    sys.exit(0)
