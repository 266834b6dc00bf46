"""Tiny random checkpoints of every common decoder family, sized to a given tokenizer and saved with
save_pretrained as a user's checkpoints would be (the architecture matrix, and hub-id stand-ins)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

# Shared by the Llama-like configs. 2 layers so the KV cache spans layers (and Gemma's sliding/global alternation
# exists); a sliding window of 4 (smaller than prompt + response) where the architecture has one, so the cached
# decode and the full training forward must agree on windowed attention too.
LLAMA_LIKE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
GQA = dict(num_key_value_heads=2)


class Arch(NamedTuple):
    config: str  # the transformers config class
    causal_lm: str  # the class AutoModelForCausalLM builds
    seq_cls: str  # the class AutoModelForSequenceClassification builds (value and reward heads)
    settings: dict  # tiny sizes (token ids and max positions are added from the tokenizer)
    positions_key: str = "max_position_embeddings"


ARCHITECTURES = {
    "llama": Arch("LlamaConfig", "LlamaForCausalLM", "LlamaForSequenceClassification", {**LLAMA_LIKE, **GQA}),
    "gpt_neox": Arch("GPTNeoXConfig", "GPTNeoXForCausalLM", "GPTNeoXForSequenceClassification", LLAMA_LIKE),
    "gpt2": Arch(
        "GPT2Config",
        "GPT2LMHeadModel",
        "GPT2ForSequenceClassification",
        dict(n_embd=32, n_layer=2, n_head=4),
        positions_key="n_positions",
    ),
    "qwen2": Arch(
        "Qwen2Config",
        "Qwen2ForCausalLM",
        "Qwen2ForSequenceClassification",
        {**LLAMA_LIKE, **GQA, "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
    ),
    "qwen3": Arch("Qwen3Config", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification", {**LLAMA_LIKE, **GQA}),
    "mistral": Arch(
        "MistralConfig",
        "MistralForCausalLM",
        "MistralForSequenceClassification",
        {**LLAMA_LIKE, **GQA, "sliding_window": 4},
    ),
    "gemma2": Arch(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        "Gemma2ForSequenceClassification",
        {**LLAMA_LIKE, **GQA, "head_dim": 8, "sliding_window": 4},
    ),
    "gemma3": Arch(
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        "Gemma3TextForSequenceClassification",
        {
            **LLAMA_LIKE,
            **GQA,
            "head_dim": 8,
            "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "opt": Arch(
        "OPTConfig",
        "OPTForCausalLM",
        "OPTForSequenceClassification",
        dict(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4, word_embed_proj_dim=32),
    ),
    "phi3": Arch(
        "Phi3Config", "Phi3ForCausalLM", "Phi3ForSequenceClassification", {**LLAMA_LIKE, **GQA, "sliding_window": 4}
    ),
}


def save_tiny_models(name: str, tokenizer, out: Path, max_positions: int = 128) -> tuple[Path, Path]:
    """A random causal LM and a 1-label sequence-classification model of architecture `name`, sized to `tokenizer`
    (vocabulary and pad/eos/bos ids), each saved with the tokenizer: (causal LM directory, seq-cls directory)."""
    arch = ARCHITECTURES[name]
    ids = dict(
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id
    )
    config = getattr(transformers, arch.config)(
        vocab_size=len(tokenizer), **{arch.positions_key: max_positions}, **ids, **arch.settings
    )
    torch.manual_seed(0)
    causal = AutoModelForCausalLM.from_config(config)
    config.num_labels = 1  # from_config takes no num_labels keyword
    seq_cls = AutoModelForSequenceClassification.from_config(config)
    assert (type(causal).__name__, type(seq_cls).__name__) == (arch.causal_lm, arch.seq_cls)
    paths = out / f"{name}-causal", out / f"{name}-seq_cls"
    for model, path in zip((causal, seq_cls), paths):
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return paths
