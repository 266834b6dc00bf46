"""Offline stand-ins for the hub models and datasets TRL's GRPO test file loads (bench/trl_tests/run.py).

TRL's tests load tiny random models from the hub organisation ``trl-internal-testing`` and its ``zen`` dataset. This
machine has no hub, so this module builds models of the same names, families and tokenizers, with random weights,
and places them where ``from_pretrained`` looks under ``HF_HUB_OFFLINE=1`` (the hub cache layout of
tests/hub_cache.py):

* **Tokenizers** carry Qwen's real byte-level BPE vocabulary (151,643 tokens, read from the ``qwen.tiktoken`` file
  that the ``dashscope`` wheel on PyPI ships) with Qwen2.5's and Qwen3's special tokens at their real ids. TRL's tool
  tests script completions as Qwen token ids (``151657`` is ``<tool_call>``, ``4913`` is ``{"``): they decode here
  to the same text. The other families get the same vocabulary with their own special tokens added.
* **Chat templates** are the families' original templates as TRL 1.16 ships them (``trl/chat_templates/``), read
  from the installed TRL: TRL recognises a model's template by exact comparison to pick its tool-call parser.
* **Models** are built from each family's transformers config with 2 layers and hidden size 16 (MoE: 4 experts, 2
  active); sequence classifiers have one label. ``tiny-RemoteForCausalLM`` is a remote-code model: its
  configuration and modeling files live in the snapshot and subclass Qwen2's.
* **zen** is the Zen of Python (``import this``), 17 training lines and 2 test lines, as the configs the test file
  reads: ``standard_prompt_only`` (a line's beginning) and ``conversational_prompt_only`` (a user turn asking for
  it). run.py's conftest serves ``load_dataset("trl-internal-testing/zen", ...)`` from these files, streaming too.

Vision-language models (``tiny-*ForConditionalGeneration``) and the ``zen-image`` datasets are not built: rlhfkit
trains text-only models, and their tests count on neither side.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORG = "trl-internal-testing"
DASHSCOPE = "dashscope==1.20.0"  # any release with dashscope/resources/qwen.tiktoken
QWEN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Qwen2.5's added tokens in id order from 151643; Qwen3 appends the last four.
QWEN25_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]  # fmt: skip
QWEN25_PLAIN = [
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
]  # fmt: skip
QWEN3_PLAIN = ["<tool_response>", "</tool_response>", "<think>", "</think>"]

MISTRAL_TEMPLATE = (  # Mistral-7B-Instruct-v0.2's [INST] format (TRL ships no Mistral template)
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)

# name -> (model_type, architecture, TRL template file or None, bos, eos, pad, extra config)
_DIMS = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
FAMILIES: dict[str, tuple] = {
    "tiny-Qwen2ForCausalLM-2.5": ("qwen2", "Qwen2ForCausalLM", "qwen2_5", None, "<|im_end|>", "<|endoftext|>", {}),
    "tiny-Qwen2ForSequenceClassification-2.5": (
        "qwen2",
        "Qwen2ForSequenceClassification",
        "qwen2_5",
        None,
        "<|im_end|>",
        "<|endoftext|>",
        {},
    ),
    "tiny-Qwen3ForCausalLM": (
        "qwen3",
        "Qwen3ForCausalLM",
        "qwen3",
        None,
        "<|im_end|>",
        "<|endoftext|>",
        {"head_dim": 8},
    ),
    "tiny-Qwen3ForSequenceClassification": (
        "qwen3",
        "Qwen3ForSequenceClassification",
        "qwen3",
        None,
        "<|im_end|>",
        "<|endoftext|>",
        {"head_dim": 8},
    ),
    "tiny-Qwen3MoeForCausalLM": (
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        "qwen3",
        None,
        "<|im_end|>",
        "<|endoftext|>",
        {"head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    ),
    "tiny-LlamaForCausalLM-3.2": (
        "llama",
        "LlamaForCausalLM",
        "llama3_2",
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|finetune_right_pad_id|>",
        {},
    ),
    "tiny-LlamaForSequenceClassification-3.2": (
        "llama",
        "LlamaForSequenceClassification",
        "llama3_2",
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|finetune_right_pad_id|>",
        {},
    ),
    "tiny-MistralForCausalLM-0.2": ("mistral", "MistralForCausalLM", None, "<s>", "</s>", "</s>", {}),
    "tiny-Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM", "gemma", "<bos>", "<eos>", "<pad>", {"head_dim": 8}),
    "tiny-Cohere2ForCausalLM": (
        "cohere2",
        "Cohere2ForCausalLM",
        "cohere2",
        "<BOS_TOKEN>",
        "<|END_OF_TURN_TOKEN|>",
        "<PAD>",
        {},
    ),
    "tiny-Glm4MoeForCausalLM": (
        "glm4_moe",
        "Glm4MoeForCausalLM",
        "glm4moe",
        None,
        "<|endoftext|>",
        "<|endoftext|>",
        {
            "head_dim": 8,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
        },
    ),  # fmt: skip
    "tiny-GptOssForCausalLM": (
        "gpt_oss",
        "GptOssForCausalLM",
        "gptoss",
        "<|startoftext|>",
        "<|return|>",
        "<|endoftext|>",
        {
            "head_dim": 8,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),  # fmt: skip
    "tiny-NemotronHForCausalLM-nano": (
        "nemotron_h",
        "NemotronHForCausalLM",
        "nemotron_3_nano",
        "<s>",
        "<|im_end|>",
        "<unk>",
        {
            "hybrid_override_pattern": "M*",
            "mamba_num_heads": 4,
            "mamba_head_dim": 8,
            "ssm_state_size": 8,
            "n_groups": 1,
            "head_dim": 8,
            "num_hidden_layers": 2,
        },
    ),  # fmt: skip
    "tiny-RemoteForCausalLM": ("qwen2", "Qwen2ForCausalLM", "qwen2_5", None, "<|im_end|>", "<|endoftext|>", {}),
}

REMOTE_CONFIGURATION = """from transformers import Qwen2Config


class RemoteConfig(Qwen2Config):
    model_type = "remote"
"""
REMOTE_MODELING = """from transformers import Qwen2ForCausalLM

from .configuration_remote import RemoteConfig


class RemoteForCausalLM(Qwen2ForCausalLM):
    config_class = RemoteConfig
"""


def qwen_vocabulary(cache: Path) -> Path:
    """Qwen's BPE ranks (``qwen.tiktoken``), taken once from the dashscope wheel on PyPI."""
    target = cache / "qwen.tiktoken"
    if not target.exists():
        wheels = cache / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", DASHSCOPE, "--no-deps", "-q", "-d", str(wheels)], check=True
        )
        (wheel,) = wheels.glob("dashscope-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            target.write_bytes(archive.read("dashscope/resources/qwen.tiktoken"))
    return target


def qwen_bpe(vocabulary: Path):
    """A ``tokenizers.Tokenizer`` with Qwen's byte-level BPE: ids 0-151642 are Qwen's."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(path):
            ranks = {}
            for line in Path(path).read_bytes().splitlines():
                if line.strip():
                    token, rank = line.split()
                    ranks[base64.b64decode(token)] = int(rank)
            return ranks

    return Converter(str(vocabulary), pattern=QWEN_PATTERN).converted()


def template_tokens(template: str) -> list[str]:
    """The special-looking markers a chat template writes literally (``<|im_start|>``, ``<think>``, ``[INST]``)."""
    found = re.findall(r"<\|[A-Za-z0-9_]+\|>|</?[A-Za-z_]+>|\[/?[A-Za-z_]+\]", template)
    return list(dict.fromkeys(found))


def build_tokenizer(vocabulary: Path, template: str, bos, eos, pad, qwen3: bool):
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    bpe = qwen_bpe(vocabulary)
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN25_SPECIAL])
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN25_PLAIN])
    if qwen3:
        bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_PLAIN])
    family = [t for t in [bos, eos, pad, *template_tokens(template)] if t and bpe.token_to_id(t) is None]
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(family)])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=bos, eos_token=eos, pad_token=pad, chat_template=template
    )


def build_model(name: str, tokenizer, spec: tuple, target: Path) -> None:
    import torch
    import transformers
    from transformers import AutoConfig, GenerationConfig

    model_type, architecture, _, _, _, _, extra = spec
    vocab_size = -(-len(tokenizer) // 64) * 64
    ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    config = AutoConfig.for_model(model_type, **{**_DIMS, **extra}, vocab_size=vocab_size, **ids)
    if architecture.endswith("SequenceClassification"):
        config.num_labels = 1
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    if not architecture.endswith("SequenceClassification"):
        GenerationConfig(**ids).save_pretrained(target)
    if name == "tiny-RemoteForCausalLM":
        (target / "configuration_remote.py").write_text(REMOTE_CONFIGURATION)
        (target / "modeling_remote.py").write_text(REMOTE_MODELING)
        saved = json.loads((target / "config.json").read_text())
        saved.update(
            model_type="remote",
            architectures=["RemoteForCausalLM"],
            auto_map={
                "AutoConfig": "configuration_remote.RemoteConfig",
                "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
            },
        )
        (target / "config.json").write_text(json.dumps(saved, indent=2))


def zen_rows() -> dict[str, dict[str, list]]:
    """The configs of ``trl-internal-testing/zen`` the test file reads, as split -> column -> values."""
    import codecs
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        import this
    lines = [line for line in codecs.decode(this.s, "rot13").splitlines()[2:] if line.strip()]
    prompts = [line.rsplit(" ", 2)[0] for line in lines]
    standard = {"train": {"prompt": prompts[:17]}, "test": {"prompt": prompts[17:19]}}
    conversational = {
        split: {"prompt": [[{"role": "user", "content": f"Complete the line: {p}"}] for p in cols["prompt"]]}
        for split, cols in standard.items()
    }
    return {"standard_prompt_only": standard, "conversational_prompt_only": conversational}


def build(cache: Path, only: list[str] | None = None) -> dict[str, str]:
    """Build every stand-in into ``cache`` (skipping those already there); return family -> error for failures."""
    from datasets import Dataset

    sys.path.insert(0, str(REPO))
    import trl

    from tests.hub_cache import cache_model

    templates = Path(trl.__file__).parent / "chat_templates"
    vocabulary = qwen_vocabulary(cache)
    hub = cache / "hub"
    failed = {}
    for name, spec in FAMILIES.items():
        if (only and name not in only) or (hub / f"models--{ORG}--{name}").exists():
            continue
        template = (templates / f"{spec[2]}.jinja").read_text() if spec[2] else MISTRAL_TEMPLATE
        scratch = cache / "scratch" / name
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            tokenizer = build_tokenizer(vocabulary, template, *spec[3:6], qwen3=spec[2] != "qwen2_5")
            build_model(name, tokenizer, spec, scratch)
        except Exception as error:  # a family this transformers cannot build counts on neither side
            failed[name] = f"{type(error).__name__}: {error}"
            continue
        cache_model(hub, f"{ORG}/{name}", scratch)
        shutil.rmtree(scratch)
    for config, splits in zen_rows().items():
        for split, columns in splits.items():
            path = cache / "datasets" / "zen" / config / split
            if not path.exists():
                Dataset.from_dict(columns).save_to_disk(str(path))
    return failed


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "bench" / ".cache" / "trl-tests"
    print(json.dumps(build(out), indent=2))
