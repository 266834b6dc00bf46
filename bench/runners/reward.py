"""The GRPO reward of the benchmark, one file used as is by both libraries (standard library only).

``correctness(prompts, completions, completion_ids, **kwargs) -> list[float]``: 1.0 when the completion's tokens
before the task's real end-of-answer token (``<eos>``, id 1) spell the sorted digits of the prompt, else 0.0 (also
0.0 when the completion has no such token). It reads ``completion_ids`` (both TRL and rlhfkit pass them) because the
text they decode drops special tokens, and in the fixed-length benchmark the SFT model writes filler after its
``<eos>`` (see bench/assets.py). Token ids map to characters through the vocabulary of the tokenizer.json named by
$BENCH_TOKENIZER_JSON.
"""

from __future__ import annotations

import json
import os

PREFIX, SUFFIX = "sort ", "="
REAL_EOS_ID = 1
_ID_TO_TEXT: dict[int, str] | None = None


def _vocab() -> dict[int, str]:
    global _ID_TO_TEXT
    if _ID_TO_TEXT is None:
        with open(os.environ["BENCH_TOKENIZER_JSON"]) as f:
            data = json.load(f)
        special = {t["id"] for t in data.get("added_tokens", []) if t.get("special")}
        _ID_TO_TEXT = {i: ("" if i in special else s) for s, i in data["model"]["vocab"].items()}
    return _ID_TO_TEXT


def answer(prompt: str) -> str:
    body = prompt.strip()
    return "".join(sorted(body[len(PREFIX) : -len(SUFFIX)]))


def correctness(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
    vocab = _vocab()
    out = []
    for prompt, ids in zip(prompts, completion_ids):
        ids = [int(i) for i in ids]
        if REAL_EOS_ID not in ids:
            out.append(0.0)
            continue
        text = "".join(vocab.get(i, "") for i in ids[: ids.index(REAL_EOS_ID)])
        out.append(float(text.strip() == answer(prompt)))
    return out
