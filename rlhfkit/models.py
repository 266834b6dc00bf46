"""Every model and tokenizer rlhfkit trains or scores with is loaded here (both trainers, the CLI builders and the
judges call these functions), plus the forward passes that read log-probs, values and scores from them.

A name is whatever ``from_pretrained`` takes: a local directory written by ``save_pretrained``, or a hub id
(``ORG/NAME``, at --model_revision), downloaded once or read from the hub cache (offline with HF_HUB_OFFLINE=1).
A name that cannot be loaded is a ModelLoadError naming the flag and what to do.
"""

from __future__ import annotations

import copy
import os
import warnings
from typing import NamedTuple

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedTokenizerBase,
)


class ModelLoadError(ValueError):
    """A model or tokenizer cannot be loaded; the message names the flag, the name and what to do."""


def choose_dtype(bf16: bool | None, fp16: bool = False) -> torch.dtype:
    """Precision the device does natively: bf16 on CUDA with bf16 units, fp32 elsewhere.

    bf16 on a CPU without bf16 units is ~9x slower than fp32 (measured), so we never pick it on CPU by default.
    """
    if fp16:
        return torch.float16
    if bf16 is None:
        bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.bfloat16 if bf16 else torch.float32


class Hub(NamedTuple):
    """How names that are not local directories are fetched: TRL's --model_revision and --trust_remote_code."""

    revision: str = "main"  # branch, tag or commit of a hub id (ignored for local directories)
    trust_remote_code: bool = False  # run the modelling code a checkpoint ships (off unless asked, as in TRL)


DEFAULT_HUB = Hub()


def _from_pretrained(auto_class, name: str, flag: str, hub: Hub, **kwargs):
    """`auto_class.from_pretrained` for a local directory or a hub id (downloaded, or read from the hub cache), with
    a ModelLoadError that names the flag, the name and what to do instead of the library's traceback."""
    try:
        return auto_class.from_pretrained(
            name, revision=hub.revision, trust_remote_code=hub.trust_remote_code, **kwargs
        )
    except (OSError, ValueError) as error:
        raise ModelLoadError(_why_not_loaded(name, flag, hub, error)) from error


def is_hub_id(name: str) -> bool:
    """Whether `name` is spelt like a hub repo id (NAME or ORG/NAME); a path such as ./x or /a/b is not."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _why_not_loaded(name: str, flag: str, hub: Hub, error: Exception) -> str:
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    where = f"--{flag} {name!r}"
    if os.path.isdir(name):
        return (
            f"{where} is a directory but not a model saved with save_pretrained ({error}). Pass the directory that "
            "holds config.json and the weights (and the tokenizer files for the policy), or a hub id."
        )
    if not is_hub_id(name):
        return f"{where} is neither a local directory nor a hub model id (ORG/NAME): check the path."
    causes = []
    cause: BaseException | None = error
    while cause is not None:
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(c, RevisionNotFoundError) for c in causes):
        return f"{where}: the hub has no revision {hub.revision!r} of it (--model_revision): pass a branch, tag or commit."
    if any(isinstance(c, GatedRepoError) for c in causes):
        return (
            f"{where} is gated on the hub: accept its terms on https://huggingface.co/{name} and log in "
            "(hf auth login, or HF_TOKEN), or pass a local directory."
        )
    if any(isinstance(c, RepositoryNotFoundError) for c in causes):
        return (
            f"{where}: the hub has no such model, or it is private. Check the id, or log in (hf auth login, or "
            "HF_TOKEN) if it is yours; or pass a local directory."
        )
    if constants.HF_HUB_OFFLINE:
        return (
            f"{where} is not in the hub cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE=1 forbids downloading "
            f"it. Download it once online (hf download {name}), unset HF_HUB_OFFLINE, or pass a local directory."
        )
    return (
        f"{where} could not be loaded from the hub ({type(error).__name__}: {error}). Check the connection and the "
        "id, log in (hf auth login) for private or gated models, or pass a local directory."
    )


def load_tokenizer(name: str, flag: str = "model_name_or_path", hub: Hub = DEFAULT_HUB) -> PreTrainedTokenizerBase:
    """The tokenizer of a local directory or hub id, padding on the left (as batched generation needs)."""
    tokenizer = _from_pretrained(AutoTokenizer, name, flag, hub, padding_side="left")
    if tokenizer.pad_token is None:
        # Generation needs a pad token for batches; the EOS token is the usual stand-in. Masks are built from
        # lengths, not from pad ids, so pad == eos does not hide real EOS tokens.
        tokenizer.pad_token = tokenizer.eos_token
        warnings.warn(
            f"The tokenizer of {name} has no pad token; using its EOS token {tokenizer.eos_token!r} for padding.",
            stacklevel=2,
        )
    return tokenizer


def load_policy(name: str, dtype: torch.dtype, flag: str = "sft_model_path", hub: Hub = DEFAULT_HUB) -> nn.Module:
    """A causal LM from a local directory or hub id."""
    return _from_pretrained(AutoModelForCausalLM, name, flag, hub, dtype=dtype)


def load_scalar_model(name: str, dtype: torch.dtype, flag: str, hub: Hub = DEFAULT_HUB) -> nn.Module:
    """A sequence-classification model with one label (reward or value model), from a local directory or hub id.

    A causal LM checkpoint gets a fresh score head (TRL's smoke-test default for a missing reward model)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "newly initialized score weights" is expected for the smoke-test default
        model = _from_pretrained(AutoModelForSequenceClassification, name, flag, hub, num_labels=1, dtype=dtype)
    if _score_head(model) is None:
        raise ModelLoadError(f"--{flag} {name!r}: the model has no 'score' head to read scalar values from.")
    return model


def _with_tokenizer(model, tokenizer, load, dtype, hub: Hub, flag: str):
    """`model` loaded with `load` when it is a name; the tokenizer given, else the one saved with the model (the
    name it came from, as TRL does for a model object)."""
    name = model if isinstance(model, str) else model.config._name_or_path
    if isinstance(model, str):
        model = load(model, dtype, flag, hub)
    return model, tokenizer or load_tokenizer(name, flag, hub)


def load_policy_and_tokenizer(
    model: str | nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    dtype: torch.dtype,
    hub: Hub = DEFAULT_HUB,
    flag: str = "model_name_or_path",
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """A causal LM (a name or a model object) and its tokenizer (given, or the one saved with the model)."""
    return _with_tokenizer(model, tokenizer, load_policy, dtype, hub, flag)


def load_reward_model(
    model: str | nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    dtype: torch.dtype,
    hub: Hub = DEFAULT_HUB,
    flag: str = "reward_model_path",
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """A reward model (sequence classification, 1 label; a name or a model object) and its tokenizer (given, or the
    one saved with the model). Its pad token id is set from the tokenizer when missing: batched scoring needs one."""
    model, tokenizer = _with_tokenizer(model, tokenizer, load_scalar_model, dtype, hub, flag)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def check_same_vocabulary(
    tokenizer: PreTrainedTokenizerBase, name: str, model: nn.Module, flag: str, hub: Hub = DEFAULT_HUB
) -> None:
    """PPO scores the policy's token ids with the reward model and trains a value model copied from it, so both
    must read the policy's vocabulary; a mismatch would silently score garbage. Refuse it with the way out."""
    try:
        own = load_tokenizer(name, flag, hub)
        same = own.get_vocab() == tokenizer.get_vocab()
    except ModelLoadError:  # no tokenizer saved with the model: compare embedding sizes
        size = getattr(model.config, "vocab_size", None)
        same = size is None or size >= len(tokenizer)
    if not same:
        raise ModelLoadError(
            f"--{flag} {name!r} uses a different vocabulary than the policy's tokenizer. PPO feeds the policy's token "
            "ids to the reward and value models, so they must share it: use a reward model trained on the policy's "
            "tokenizer, or GRPO (rlhfkit grpo --reward_model_path), which re-tokenises text for each reward model."
        )


def frozen_copy(model: nn.Module) -> nn.Module:
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    return ref.eval()


def disable_dropout(model: nn.Module) -> None:
    """PPO needs identical log-probs at rollout and at the first update step (ratio == 1), GRPO when a batch is
    reused. Dropout lives in nn.Dropout modules, and in float attributes that modules hand to
    nn.functional.dropout (OPT's decoder layers, attention_dropout of most attention modules, layerdrop)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if isinstance(value, float) and ("dropout" in name or name == "layerdrop"):
                setattr(module, name, 0.0)


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
