"""Every model and tokenizer rlhfkit trains or scores with is loaded here (both trainers, the CLI builders and the
judges call these functions), and the changes made to a model as it is loaded (dropout off, a float32 LM head, a value
model started from the policy).

A name is whatever ``from_pretrained`` takes: a local directory written by ``save_pretrained``, or a hub id
(``ORG/NAME``, at --model_revision), downloaded once or read from the hub cache (offline with HF_HUB_OFFLINE=1).
A name that cannot be loaded is a ModelLoadError naming the flag and what to do.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import sys
import types
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

from rlhfkit.errors import ConfigError, ModelLoadError
from rlhfkit.models.adapters import NOT_QUANTIZED, Quantization, quantization_config


def native_dtype() -> torch.dtype:
    """What the device computes fast: bf16 on a CUDA GPU with bf16 units, fp32 elsewhere (bf16 on a CPU without
    bf16 units is ~9x slower than fp32, measured). For models that are only run, never trained (eval, judges)."""
    return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32


def weight_dtype(dtype: str | None) -> torch.dtype | str:
    """The dtype trained models load in: --dtype (TRL's ModelConfig; "auto" keeps the checkpoint's), else float32,
    the master weights that --bf16 / --fp16 mixed precision computes over."""
    return "auto" if dtype == "auto" else getattr(torch, dtype or "float32")


def mixed_precision(bf16: bool | None, fp16: bool) -> str:
    """accelerate's mixed_precision for --bf16 / --fp16 ("bf16", "fp16" or "no"): autocast over the weights, with
    loss scaling for fp16. --bf16 unset: the accelerate launch config's choice (ACCELERATE_MIXED_PRECISION), else
    bf16 on a CUDA GPU with bf16 units and no mixed precision elsewhere."""
    if fp16:
        return "fp16"
    if bf16 is None:
        launched = os.environ.get("ACCELERATE_MIXED_PRECISION")
        if launched:
            return launched
        bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return "bf16" if bf16 else "no"


class Hub(NamedTuple):
    """How models are fetched and built: TRL's --model_revision, --trust_remote_code and --attn_implementation."""

    revision: str = "main"  # branch, tag or commit of a hub id (ignored for local directories)
    trust_remote_code: bool = False  # run the modelling code a checkpoint ships (off unless asked, as in TRL)
    attn_implementation: str | None = None  # transformers' choice when None


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
    if os.path.isfile(os.path.join(name, "adapter_config.json")):  # a LoRA run's output_dir or checkpoint
        return (
            f"{where} holds a LoRA adapter, which transformers loads onto its base model only with peft installed and "
            f"the base model (base_model_name_or_path in its adapter_config.json) reachable ({error}). Install peft "
            "(pip install 'rlhfkit[peft]'), or pass the merged model (output_dir/merged with --merge_adapter)."
        )
    causes = []
    cause: BaseException | None = error
    while cause is not None:
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    if not hub.trust_remote_code and (_ships_code(name, hub) or any("trust_remote_code" in str(c) for c in causes)):
        return (
            f"{where} ships custom code (its own modelling files), which transformers runs only when told to trust "
            "it. If you trust it, pass --trust_remote_code (in Python: trust_remote_code=True in the config, or in "
            "model_init_kwargs)."
        )
    if os.path.isdir(name):
        return (
            f"{where} is a directory but not a model saved with save_pretrained ({error}). Pass the directory that "
            "holds config.json and the weights (and the tokenizer files for the policy), or a hub id."
        )
    if not is_hub_id(name):
        return f"{where} is neither a local directory nor a hub model id (ORG/NAME): check the path."
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


def _ships_code(name: str, hub: Hub) -> bool:
    """Whether the model's config.json (its directory's, or the hub cache's copy) maps its classes to modelling code
    of its own (``auto_map``), which transformers does not run without trust_remote_code."""
    from huggingface_hub import try_to_load_from_cache

    if os.path.isdir(name):
        path = os.path.join(name, "config.json")
    elif is_hub_id(name):
        path = try_to_load_from_cache(name, "config.json", revision=hub.revision)
    else:
        return False
    try:
        with open(path) as f:
            return "auto_map" in json.load(f)
    except (TypeError, OSError, ValueError):  # not cached (None or a sentinel), unreadable, not JSON
        return False


def _build_options(hub: Hub) -> dict:
    return {"attn_implementation": hub.attn_implementation} if hub.attn_implementation else {}


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
    return _from_pretrained(AutoModelForCausalLM, name, flag, hub, dtype=dtype, **_build_options(hub))


def load_scalar_model(name: str, dtype: torch.dtype, flag: str, hub: Hub = DEFAULT_HUB) -> nn.Module:
    """A sequence-classification model with one label (reward or value model), from a local directory or hub id.

    A causal LM checkpoint gets a fresh score head (TRL's smoke-test default for a missing reward model)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "newly initialized score weights" is expected for the smoke-test default
        model = _from_pretrained(
            AutoModelForSequenceClassification, name, flag, hub, num_labels=1, dtype=dtype, **_build_options(hub)
        )
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


def value_model_from_policy(policy: nn.Module) -> nn.Module:
    """A value model started from a causal LM's weights: its architecture's sequence-classification class (1 label)
    with the policy's backbone weights copied and a fresh score head set to 0, so every value starts at 0.

    PPO's value model when there is no reward model to start from (reward functions alone), as verl and OpenRLHF
    start their critic from the actor's weights; a zero head, rather than a random one, adds no noise to the first
    advantages and lets the value loss fit the returns' scale from the first update."""
    if getattr(policy, "hf_quantizer", None) is not None:
        raise ModelLoadError(
            "the value model would start from the policy's weights, but they are quantised (--load_in_4bit / "
            "--load_in_8bit): pass --value_model_path (a sequence-classification model) or --reward_model_path."
        )
    config = copy.deepcopy(policy.config)
    config.num_labels = 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value_model = AutoModelForSequenceClassification.from_config(config, dtype=policy.dtype)
    except ValueError as e:  # the architecture has no sequence-classification class
        raise ModelLoadError(
            f"the value model would start from the policy's weights, but {type(policy).__name__} has no "
            f"sequence-classification class ({e}). Pass --value_model_path (a sequence-classification model with "
            "the policy's vocabulary)."
        ) from None
    backbone = getattr(policy, policy.base_model_prefix)
    getattr(value_model, value_model.base_model_prefix).load_state_dict(backbone.state_dict())
    head = _score_head(value_model)
    nn.init.zeros_(head.weight)
    if getattr(head, "bias", None) is not None:
        nn.init.zeros_(head.bias)
    return value_model.to(next(policy.parameters()).device)


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


def cast_lm_head_to_fp32(model: nn.Module) -> nn.Module:
    """TRL's cast_lm_head_to_fp32 (the ScaleRL recipe, arXiv 2510.13786), in place: the LM head's weights become
    float32, and it computes its logits in float32 from float32 hidden states, outside autocast, so the softmax the
    log-probs and the sampler read is not rounded to bf16 (a bf16 logit of 20 is off by up to 0.06). Every forward
    of the model uses it: the training forward, the sampler and, for a reference copied from it, the reference's.

    Tied word embeddings (the head's weight is the input embedding's): that one weight becomes float32, and the
    embedding's output is cast back to the dtype it had, so the layers above it see what they saw before (as TRL
    does). A head that carries a LoRA adapter is refused, as in TRL: the adapter's own output would not be float32.
    Calling it again changes nothing. Returns `model`."""
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "_rlhfkit_fp32_logits", False):
        return model
    peft = sys.modules.get("peft.tuners.tuners_utils")
    if peft is not None and isinstance(head, peft.BaseTunerLayer):
        raise ConfigError(
            "cast_lm_head_to_fp32 with a LoRA adapter on the LM head (lora_target_modules names lm_head): the "
            "adapter's output would not be float32. Leave lm_head out of lora_target_modules, or leave "
            "cast_lm_head_to_fp32 off."
        )
    # peft's lora_modules_to_save=["lm_head"] wraps the head: the base head and the trained copy are both cast
    heads = [head.original_module, *head.modules_to_save.values()] if hasattr(head, "modules_to_save") else [head]
    if not all(isinstance(h, nn.Linear) for h in heads):
        raise ConfigError(
            f"cast_lm_head_to_fp32: {type(model).__name__}'s output embedding is a {type(head).__name__}, not a "
            "linear LM head rlhfkit can compute in float32. Leave cast_lm_head_to_fp32 off for this model."
        )
    embedding = model.get_input_embeddings()
    for linear in heads:
        was = linear.weight.dtype
        tied = embedding is not None and getattr(embedding, "weight", None) is linear.weight
        linear.float()  # in place: the Parameter objects stay (the optimizer's, and a tied embedding's)
        linear.forward = types.MethodType(_float32_linear, linear)
        linear._rlhfkit_fp32_logits = True
        if tied and was != torch.float32:
            embedding.register_forward_hook(functools.partial(_cast_output, dtype=was))
    return model


def _float32_linear(head: nn.Linear, hidden_states: torch.Tensor) -> torch.Tensor:
    """The forward of a head cast by cast_lm_head_to_fp32 (autocast would compute the product in bf16 again)."""
    with torch.autocast(hidden_states.device.type, enabled=False):
        bias = None if head.bias is None else head.bias.float()
        return nn.functional.linear(hidden_states.float(), head.weight.float(), bias)


def _cast_output(module: nn.Module, args, output: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return output.to(dtype)


def _score_head(model: nn.Module) -> nn.Module | None:
    return getattr(model, "score", None) or getattr(model, "classifier", None)


def load_quantized_policy(
    name: str, dtype, quantization: Quantization, flag: str = "sft_model_path", hub: Hub = DEFAULT_HUB
) -> nn.Module:
    """A causal LM with quantised base weights (bitsandbytes) on this process's GPU, prepared for adapter training
    (peft's prepare_model_for_kbit_training: base frozen, norms in fp32; gradient checkpointing is left to
    --gradient_checkpointing). Needs a CUDA GPU: not exercised by rlhfkit's CPU tests."""
    from accelerate import PartialState
    from peft import prepare_model_for_kbit_training

    model = _from_pretrained(
        AutoModelForCausalLM,
        name,
        flag,
        hub,
        dtype=dtype,
        quantization_config=quantization_config(quantization, dtype),
        device_map={"": PartialState().local_process_index},
        **_build_options(hub),
    )
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def load_trained_policy(
    name: str,
    flag: str,
    hub: Hub = DEFAULT_HUB,
    *,
    dtype: str | None,
    quantization: Quantization = NOT_QUANTIZED,
    lm_head_fp32: bool = False,
) -> nn.Module:
    """The policy a run trains, from a hub id or local directory: with --load_in_4bit / --load_in_8bit
    (`quantization`) its base weights quantised (QLoRA: a CUDA GPU and bitsandbytes), else in --dtype's weights
    (`dtype`; float32 by default, the master weights of --bf16 / --fp16 mixed precision). Both trainers load it here.
    With lm_head_fp32 (GRPO's cast_lm_head_to_fp32) its LM head is cast at once, before an adapter, a reference copy
    or an engine's wrapper is made from it."""
    weights = weight_dtype(dtype)
    if quantization.load_in_4bit or quantization.load_in_8bit:
        model = load_quantized_policy(name, weights, quantization, flag, hub)
    else:
        model = load_policy(name, weights, flag, hub)
    if lm_head_fp32:
        cast_lm_head_to_fp32(model)
    return model
