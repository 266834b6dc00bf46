"""Real-shape models for the memory bench (bench/real_shapes.py): real vocabularies and widths, few layers.

Each shape is a transformers config copied from the public model's config.json (vocabulary, hidden size, heads,
key-value heads, head dimension, intermediate size, tied embeddings), with ``num_hidden_layers`` scaled down (1 by
default). Nothing is downloaded: the models are built from these configs with random weights (memory does not depend
on their values) and saved in float32 under ``bench/.cache/real-shapes/<shape>-L<layers>/``, once:

``policy/``     the causal LM (also the reference: TRL loads it from this path, rlhfkit copies it);
``reward/``     a sequence-classification model of the same config with one label (PPO's reward model and, as in
                TRL's example script, the value model's initialisation);
``tokenizer/``  the tokenizer, in a directory of its own: beside a Qwen2/Qwen3 config.json, transformers 5's
                AutoTokenizer would load it as Qwen2Tokenizer (a byte-level BPE) instead of the word-level one saved;
``prompts/``    a ``datasets`` dataset of 64 prompts of exactly ``PROMPT_TOKENS`` tokens each (no padding anywhere);
``shape.json``  the shape, the parameter counts and the token ids below.

The tokenizer is a word-level ``PreTrainedTokenizerFast`` whose words ``t0 ... t{V-1}`` are exactly the model's V
token ids, plus ``<eos>`` (id V) and ``<pad>`` (id V + 1) beyond the embeddings. Neither can ever be sampled (the
LM head has V outputs), so every completion runs to ``max_completion_length`` / ``response_length`` in both
libraries: the same number of generated tokens, nothing truncated, no padding inside a completion. A pad id beyond
the embeddings is what TRL's PPO example does too ("[PAD]" added to the tokenizer); both libraries' forwards only
ever see it where the attention mask is 0, and there is none here (all prompts have the same length).

Run as a script by bench/real_shapes.py in a child process (the driver stays small, see bench/memory.py), or::

    .venv/bin/python bench/real_shapes_assets.py qwen2.5-0.5b --layers 1
"""

from __future__ import annotations

import json
import os
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
CACHE = BENCH_DIR / ".cache" / "real-shapes"
PROMPT_TOKENS = 16
NUM_PROMPTS = 64

# From each model's config.json on the hub (public), depth left out (num_hidden_layers is the bench's choice).
SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": {  # Qwen/Qwen2.5-0.5B
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
    },
    "qwen3-1.7b": {  # Qwen/Qwen3-1.7B
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
    },
    "llama-3.2-1b": {  # meta-llama/Llama-3.2-1B (its llama3 rope scaling left out: no effect on memory)
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
    },
    # The same code paths in seconds (the driver's --quick): a small vocabulary and width.
    "tiny": {
        "model_type": "qwen2",
        "vocab_size": 1024,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
    },
}


def shape_dir(shape: str, layers: int) -> Path:
    return CACHE / f"{shape}-L{layers}"


def make_config(shape: str, layers: int, **extra):
    from transformers import AutoConfig

    fields = dict(SHAPES[shape])
    model_type = fields.pop("model_type")
    vocab = fields["vocab_size"]
    config = AutoConfig.for_model(
        model_type,
        num_hidden_layers=layers,
        bos_token_id=None,
        eos_token_id=vocab,  # beyond the LM head: never sampled (module docstring)
        pad_token_id=None,  # the tokenizer's <pad> (V + 1) is beyond the embeddings; the models need none
        **fields,
        **extra,
    )
    if hasattr(config, "layer_types"):  # Qwen2/Qwen3 list one attention type per layer
        config.layer_types = ["full_attention"] * layers
    return config


def make_tokenizer(vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    words["<eos>"], words["<pad>"], words["<unk>"] = vocab, vocab + 1, vocab + 2
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", padding_side="left"
    )


def build(shape: str, layers: int) -> dict:
    """Build (or reuse) the shape's assets; returns shape.json's content (paths included)."""
    root = shape_dir(shape, layers)
    meta_path = root / "shape.json"
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    torch.manual_seed(0)
    config = make_config(shape, layers)
    vocab = config.vocab_size
    tok = make_tokenizer(vocab)
    root.mkdir(parents=True, exist_ok=True)
    paths = {name: str(root / name) for name in ("policy", "reward", "tokenizer", "prompts")}
    tok.save_pretrained(paths["tokenizer"])
    policy = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    policy.generation_config.eos_token_id = vocab
    policy.generation_config.pad_token_id = vocab + 1  # what both libraries set from the tokenizer anyway
    policy.generation_config.bos_token_id = None
    policy.save_pretrained(paths["policy"])
    policy_params = sum(p.numel() for p in policy.parameters())
    del policy
    reward_config = make_config(shape, layers, num_labels=1)
    reward = AutoModelForSequenceClassification.from_config(reward_config, dtype=torch.float32)
    reward.save_pretrained(paths["reward"])
    reward_params = sum(p.numel() for p in reward.parameters())
    del reward
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (NUM_PROMPTS, PROMPT_TOKENS), generator=g).tolist()
    prompts = [" ".join(f"t{i}" for i in row) for row in ids]
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(paths["tokenizer"])  # as the runner loads it
    assert all(loaded(p)["input_ids"] == row for p, row in zip(prompts, ids)), "the tokenizer does not round-trip"
    Dataset.from_dict({"prompt": prompts}).save_to_disk(paths["prompts"])
    meta = {
        "shape": shape,
        "layers": layers,
        "config": {**SHAPES[shape], "num_hidden_layers": layers},
        "policy_parameters": policy_params,
        "reward_parameters": reward_params,
        "embedding_parameters": vocab * SHAPES[shape]["hidden_size"],
        "eos_token_id": vocab,
        "pad_token_id": vocab + 1,
        "prompt_tokens": PROMPT_TOKENS,
        "paths": paths,
    }
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def logits_gb(batch: int, tokens: int, vocab: int, bytes_per: int = 4) -> float:
    """Size of a (batch, tokens, vocab) tensor in GB (10^9 bytes)."""
    return batch * tokens * vocab * bytes_per / 1e9


def model_gb(parameters: int, bytes_per: int = 4) -> float:
    return parameters * bytes_per / 1e9


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="Build (or reuse) a real-shape model's assets; prints shape.json.")
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("--layers", type=int, default=1)
    ns = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(json.dumps(build(ns.shape, ns.layers)))
