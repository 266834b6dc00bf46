"""Every model and tokenizer rlhfkit trains or scores with is loaded here (both trainers and the CLI builders call
these functions), plus the forward passes that read log-probs, values and scores from them."""

from __future__ import annotations

import copy
import os
import warnings

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedTokenizerBase,
)


class ModelLoadError(ValueError):
    """A model or tokenizer path cannot be used; the message names the flag and what to do."""


def choose_dtype(bf16: bool | None, fp16: bool = False) -> torch.dtype:
    """Precision the device does natively: bf16 on CUDA with bf16 units, fp32 elsewhere.

    bf16 on a CPU without bf16 units is ~9x slower than fp32 (measured), so we never pick it on CPU by default.
    """
    if fp16:
        return torch.float16
    if bf16 is None:
        bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.bfloat16 if bf16 else torch.float32


def _check_path(path: str, flag: str) -> None:
    if not os.path.isdir(path):
        raise ModelLoadError(
            f"--{flag} {path!r} is not a directory. rlhfkit loads models from local checkpoints saved with "
            f"save_pretrained (no downloads): pass such a directory, or omit all model flags to use the built-in task."
        )


def load_tokenizer(
    path: str, flag: str = "model_name_or_path", trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    _check_path(path, flag)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left", trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        # Generation needs a pad token for batches; the EOS token is the usual stand-in. Masks are built from
        # lengths, not from pad ids, so pad == eos does not hide real EOS tokens.
        tokenizer.pad_token = tokenizer.eos_token
        warnings.warn(
            f"The tokenizer at {path} has no pad token; using its EOS token {tokenizer.eos_token!r} for padding.",
            stacklevel=2,
        )
    return tokenizer


def load_policy(
    path: str, dtype: torch.dtype, flag: str = "sft_model_path", trust_remote_code: bool = False
) -> nn.Module:
    _check_path(path, flag)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)


def load_scalar_model(path: str, dtype: torch.dtype, flag: str, trust_remote_code: bool = False) -> nn.Module:
    """A sequence-classification model with one label (reward or value model)."""
    _check_path(path, flag)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "newly initialized score weights" is expected for the smoke-test default
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=dtype, trust_remote_code=trust_remote_code
        )
    if _score_head(model) is None:
        raise ModelLoadError(f"--{flag} {path!r}: the model has no 'score' head to read scalar values from.")
    return model


def _with_tokenizer(model, tokenizer, load, dtype, trust_remote_code: bool, flag: str):
    """`model` loaded with `load` when it is a path; the tokenizer given, else the one saved with the model (the
    path it came from, as TRL does for a model object)."""
    path = model if isinstance(model, str) else model.config._name_or_path
    if isinstance(model, str):
        model = load(model, dtype, flag, trust_remote_code)
    return model, tokenizer or load_tokenizer(path, flag, trust_remote_code)


def load_policy_and_tokenizer(
    model: str | nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    dtype: torch.dtype,
    trust_remote_code: bool = False,
    flag: str = "model_name_or_path",
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """A causal LM (a path or a model object) and its tokenizer (given, or the one saved with the model)."""
    return _with_tokenizer(model, tokenizer, load_policy, dtype, trust_remote_code, flag)


def load_reward_model(
    model: str | nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    dtype: torch.dtype,
    trust_remote_code: bool = False,
    flag: str = "reward_model_path",
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """A reward model (sequence classification, 1 label; a path or a model object) and its tokenizer (given, or the
    one saved with the model). Its pad token id is set from the tokenizer when missing: batched scoring needs one."""
    model, tokenizer = _with_tokenizer(model, tokenizer, load_scalar_model, dtype, trust_remote_code, flag)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def check_same_vocabulary(tokenizer: PreTrainedTokenizerBase, path: str, model: nn.Module, flag: str) -> None:
    """PPO scores the policy's token ids with the reward model and trains a value model copied from it, so both
    must read the policy's vocabulary; a mismatch would silently score garbage. Refuse it with the way out."""
    try:
        own = AutoTokenizer.from_pretrained(path)
        same = own.get_vocab() == tokenizer.get_vocab()
    except (OSError, ValueError):  # no tokenizer saved with the model: compare embedding sizes
        size = getattr(model.config, "vocab_size", None)
        same = size is None or size >= len(tokenizer)
    if not same:
        raise ModelLoadError(
            f"--{flag} {path!r} uses a different vocabulary than the policy's tokenizer. PPO feeds the policy's token "
            "ids to the reward and value models, so they must share it: use a reward model trained on the policy's "
            "tokenizer, or GRPO (rlhfkit grpo --reward_model_path), which re-tokenises text for each reward model."
        )


def frozen_copy(model: nn.Module) -> nn.Module:
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    return ref.eval()


def disable_dropout(model: nn.Module) -> None:
    """PPO needs identical log-probs at rollout and at the first update step (ratio == 1)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


def _score_head(model: nn.Module) -> nn.Module | None:
    return getattr(model, "score", None) or getattr(model, "classifier", None)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Left padding shifts real tokens right, so positions must count real tokens only, as generation does."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_values(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scalar head applied at every position of a sequence-classification model. Returns (B, L) float."""
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    ).last_hidden_state
    return _score_head(model)(hidden).squeeze(-1).float()


def policy_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).logits
