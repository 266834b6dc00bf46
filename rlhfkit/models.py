"""Every model and tokenizer rlhfkit trains or scores with is loaded here (both trainers, the CLI builders and the
judges call these functions), plus the forward passes that read log-probs, values and scores from them.

A name is whatever ``from_pretrained`` takes: a local directory written by ``save_pretrained``, or a hub id
(``ORG/NAME``, at --model_revision), downloaded once or read from the hub cache (offline with HF_HUB_OFFLINE=1).
A name that cannot be loaded is a ModelLoadError naming the flag and what to do.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import os
import sys
import types
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedTokenizerBase,
)

from rlhfkit import ops
from rlhfkit.errors import ConfigError, ModelLoadError
from rlhfkit.lora import lora_config


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

    @classmethod
    def from_args(cls, args) -> Hub:
        """The options of a training config (TrainConfig)."""
        return cls(args.model_revision, args.trust_remote_code, args.attn_implementation)


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
            f"{where} ships its own modelling code, which transformers runs only when told to trust it. If you trust "
            "it, pass --trust_remote_code (in Python: trust_remote_code=True in the config, or in "
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


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Left padding shifts real tokens right, so positions must count real tokens only, as generation does."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def enable_gradient_checkpointing(model: nn.Module, kwargs: dict | None = None) -> None:
    """Recompute activations in the backward pass (transformers' activation_checkpointing_enable, named
    gradient_checkpointing_enable before 5.24). use_reentrant is off unless `kwargs` say otherwise, as TRL sets it:
    the non-reentrant variant needs no gradient on the inputs, so frozen embeddings and adapters work, and it gives
    the same gradients (tested)."""
    kwargs = {"use_reentrant": False, **(kwargs or {})}
    enable = getattr(model, "activation_checkpointing_enable", None)  # its name from transformers 5.24 on
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def token_values(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scalar head applied at every position of a sequence-classification model. Returns (B, L) float."""
    if is_peft_model(model):  # the transformers model inside, its adapter layers (and score head copy) in place
        model = model.get_base_model()
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,  # no decoding here; and gradient checkpointing refuses a cache
    ).last_hidden_state
    return _score_head(model)(hidden).squeeze(-1).float()


def policy_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L, V) logits at every position."""
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).logits


def response_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, query_width: int
) -> torch.Tensor:
    """(B, T, V) logits at the T = L - query_width positions that predict the response tokens (query_width - 1 to
    L - 2), the only ones the losses read.

    The LM head runs on those positions only (transformers' ``logits_to_keep``, as TRL's GRPO does) where the
    model's forward takes it, else on every position and the rest is cut. With a large vocabulary the prompt's
    logits are a large share of a forward's memory (Qwen2's 152k: 0.6 MB per position in fp32) and of its LM-head
    arithmetic."""
    keep = input_ids.shape[1] - query_width + 1
    if not takes_logits_to_keep(model):
        return policy_logits(model, input_ids, attention_mask)[:, query_width - 1 : -1]
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        logits_to_keep=keep,
    ).logits[:, :-1]


class TokenStats(NamedTuple):
    """What the losses read of a forward: the completion tokens' log-probs and, when asked, the entropies."""

    logprobs: torch.Tensor  # (B, T) float32 (float64 for a float64 model), log softmax(logits / temperature)
    entropy: torch.Tensor | None  # (B, T) the entropy of softmax(logits / temperature), or None


def response_token_stats(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    query_width: int,
    completion_ids: torch.Tensor,
    temperature: float,
    entropy: bool = False,
    entropy_grad: bool = False,
    padding_free: bool = False,
) -> TokenStats:
    """Log-probs (and entropies) of the response tokens `completion_ids` (B, T) of sequences `input_ids` (B, L) whose
    first `query_width` positions are the query: what response_logits then ops.logprobs_from_logits and
    ops.entropy_from_logits give, without the (B, T, V) logits.

    The model's own forward runs with its LM head standing in for the statistics: the head receives the last hidden
    states and returns the (B, T, 1 or 2) statistics, computed in chunks of positions (recomputed in the backward),
    so at a 152k vocabulary one chunk's logits exist instead of the batch's, in the forward and in the gradient: a
    plain linear head through ops.logprobs_from_linear (its weight gradient in one buffer), any other head through
    ops.logprobs_from_hidden (checkpointed chunks of the head's own forward). Running inside the model's forward keeps what the forward does around its head: DeepSpeed ZeRO-3
    and FSDP2 have the head's weight gathered, a LoRA adapter on the head and cast_lm_head_to_fp32 apply, and the
    logits_to_keep cut still saves the query's positions.

    A forward that changes the head's output before returning it (a logit scale or soft-capping: Cohere, Granite,
    Gemma 2) or a torch.compile'd model is computed the plain way instead, said once per model class (the plain
    way is what rlhfkit did before: the numbers are the same, the memory is not; that way the batch stays padded).
    entropy_grad: the entropy keeps its gradient (GRPO's entropy bonus), else it is detached. padding_free: the
    forward runs on the batch's real tokens packed into one row (_packed_forward; padding_free_refused says where it
    cannot); the statistics are the same.
    """
    reason = _chunked_head_refused(model)
    if reason is None:
        request = (input_ids, attention_mask, query_width, completion_ids, temperature, entropy, entropy_grad)
        if padding_free and (why := padding_free_refused(model)) is not None:
            raise ConfigError(
                f"padding_free: {type(_unwrapped(model)).__name__} cannot take a padding-free batch: {why}."
            )
        chunked = _forward_with_stats_head(model, *request, padding_free)
        if chunked is not None:
            return chunked
        inner = _unwrapped(model)
        reason = (
            f"{type(inner).__name__}'s forward changes the LM head's output before returning it (a logit scale or "
            "soft-capping)"
        )
        _CHUNKED_HEAD_REFUSED[type(inner)] = reason
    _say_plain_head_once(reason)
    logits = response_logits(model, input_ids, attention_mask, query_width)
    logprobs = ops.logprobs_from_logits(logits, completion_ids, temperature)
    if not entropy:
        return TokenStats(logprobs, None)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        return TokenStats(logprobs, ops.entropy_from_logits(logits if entropy_grad else logits.detach(), temperature))


_CHUNKED_HEAD_REFUSED: dict[type, str] = {}  # model class -> why its forward cannot take the chunked head


def _unwrapped(model: nn.Module) -> nn.Module:
    """The transformers model inside DDP, DeepSpeed, peft and torch.compile wrappers."""
    inner = model
    while True:
        if is_peft_model(inner):
            inner = inner.get_base_model()
            continue
        wrapped = getattr(inner, "module", None) or getattr(inner, "_orig_mod", None)
        if not isinstance(wrapped, nn.Module):
            return inner
        inner = wrapped


def _chunked_head_refused(model: nn.Module) -> str | None:
    """Why the model's forward cannot compute with the chunked head, or None."""
    probe = model
    while isinstance(probe, nn.Module):
        if getattr(probe, "_orig_mod", None) is not None:
            return "the model is torch.compile'd (its graph has the plain LM head in it)"
        probe = getattr(probe, "module", None)
    inner = _unwrapped(model)
    if type(inner) in _CHUNKED_HEAD_REFUSED:
        return _CHUNKED_HEAD_REFUSED[type(inner)]
    getter = getattr(inner, "get_output_embeddings", None)
    if getter is None or not isinstance(getter(), nn.Module):
        return f"{type(inner).__name__} has no output embedding module (get_output_embeddings() is None)"
    return None


_SAID_PLAIN_HEAD: set[str] = set()


def _say_plain_head_once(reason: str) -> None:
    if reason not in _SAID_PLAIN_HEAD:
        _SAID_PLAIN_HEAD.add(reason)
        warnings.warn(
            f"Log-probs are computed from the full [batch x length x vocabulary] logits, not in chunks of positions: "
            f"{reason}. The numbers are the same; the memory is that of the logits.",
            stacklevel=3,
        )


class _Forward(NamedTuple):
    """One forward response_token_stats asks of a model: its inputs, the tokens to score, and how the LM head's
    input lines up with them and the result with the caller's (B, T)."""

    inputs: dict  # the model's keyword arguments
    tokens: torch.Tensor  # (B', T') the tokens scored
    select: Callable[[torch.Tensor], torch.Tensor]  # the head's input (B', X, H) -> (B', T', H), aligned with tokens
    unpack: Callable[[torch.Tensor], torch.Tensor]  # the statistics (B', T', k) -> (B, T, k)


def _padded_forward(model, input_ids, attention_mask, query_width, completion_ids) -> _Forward:
    """The batch as it is: (B, L) rows, left-padded queries, right-padded responses, an attention mask."""
    width = completion_ids.shape[1]
    inputs = dict(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    )
    if takes_logits_to_keep(model):
        inputs["logits_to_keep"] = input_ids.shape[1] - query_width + 1
    # The head gets the kept positions (or all of them); the last predicts nothing.
    return _Forward(inputs, completion_ids, lambda h: h[:, h.shape[1] - width - 1 : h.shape[1] - 1], lambda s: s)


def _packed_forward(model, input_ids, attention_mask, query_width, completion_ids) -> _Forward:
    """The batch padding-free (TRL's padding_free): every row's real tokens one after another in a single row,
    position ids restarting at 0 for each sequence and no attention mask, which transformers' attention reads as
    separate sequences (flash attention's variable-length kernels; a block-diagonal mask for sdpa, eager and flex).
    The head runs on the positions that predict a real response token only; the others score 0."""
    real = attention_mask.bool()
    packed_index = (real.flatten().cumsum(0) - 1).view(real.shape)  # (b, column) -> its index in the packed row
    scored = real[:, query_width:]  # the real response tokens
    predicting = packed_index[:, query_width - 1 : -1][scored]  # the packed positions whose next token they are
    inputs = dict(input_ids=input_ids[real][None], position_ids=position_ids_from_mask(attention_mask)[real][None])
    keeps = takes_logits_to_keep(model)
    if keeps:
        inputs["logits_to_keep"] = predicting

    def unpack(stats: torch.Tensor) -> torch.Tensor:
        out = stats.new_zeros(*scored.shape, stats.shape[-1])
        out[scored] = stats[0]
        return out

    return _Forward(
        inputs, completion_ids[scored][None], (lambda h: h) if keeps else (lambda h: h[:, predicting]), unpack
    )


ATTENTION_THAT_PACKS = ("flash_attention_2", "flash_attention_3", "sdpa", "eager", "flex_attention")


def _plain_linear(head: nn.Module) -> bool:
    """Whether `head` computes nothing but hidden @ weight.T + bias (nn.Linear's own forward, or
    cast_lm_head_to_fp32's float32 one), so ops.logprobs_from_linear can take its weight and bias."""
    if not isinstance(head, nn.Linear) or type(head).forward is not nn.Linear.forward:
        return False
    return "forward" not in head.__dict__ or getattr(head, "_rlhfkit_fp32_logits", False)


def padding_free_refused(model: nn.Module) -> str | None:
    """Why `model`'s forward cannot take a padding-free batch, or None. It can where its attention reads separate
    sequences from position ids alone: transformers' attention implementations above, in a model whose modeling
    code builds its masks with transformers' masking_utils (create_causal_mask), which detects packed rows."""
    inner = _unwrapped(model)
    implementation = getattr(getattr(inner, "config", None), "_attn_implementation", None)
    if implementation not in ATTENTION_THAT_PACKS:
        return (
            f"its attention implementation is {implementation!r}; padding-free batches need one of "
            f"{', '.join(ATTENTION_THAT_PACKS)} (--attn_implementation)"
        )
    if not hasattr(sys.modules.get(type(inner).__module__), "create_causal_mask"):
        return f"{type(inner).__name__}'s modeling code does not build its attention masks with transformers' masking_utils"
    return None


def _forward_with_stats_head(
    model, input_ids, attention_mask, query_width, completion_ids, temperature, entropy, entropy_grad, padding_free
) -> TokenStats | None:
    """One forward of `model` whose LM head returns the token statistics (response_token_stats): they, or None where
    the forward changed the head's output (what it returns as logits is not what the head returned)."""
    plan = (_packed_forward if padding_free else _padded_forward)(
        model, input_ids, attention_mask, query_width, completion_ids
    )
    inner = _unwrapped(model)
    head = inner.get_output_embeddings()
    vocab = getattr(head, "out_features", 0) or getattr(getattr(inner, "config", None), "vocab_size", 0) or 1
    original = head.forward
    own = head.__dict__.get("forward")  # cast_lm_head_to_fp32 sets an instance forward; restore it as it was
    returned = []

    linear = _plain_linear(head)

    def stats_head(hidden: torch.Tensor) -> torch.Tensor:
        if linear:  # the weight's gradient accumulated in one buffer
            float32_head = getattr(head, "_rlhfkit_fp32_logits", False)
            request = (plan.tokens, temperature, entropy, entropy_grad, float32_head)
            logprobs, ent = ops.logprobs_from_linear(plan.select(hidden), head.weight, head.bias, *request)
        else:  # any other head (a LoRA adapter on it): checkpointed chunks of its own forward
            logprobs, ent = ops.logprobs_from_hidden(
                plan.select(hidden), original, plan.tokens, temperature, entropy, entropy_grad, vocab
            )
        returned.append(torch.stack([logprobs] if ent is None else [logprobs, ent], -1))
        return returned[-1]

    head.forward = stats_head
    try:
        out = model(**plan.inputs, use_cache=False).logits
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own
    if len(returned) != 1 or out is not returned[0]:
        return None
    out = plan.unpack(out)
    # Copies, not views of `out`: a wrapper's output (FSDP2's) must not be a view an in-place op could change.
    logprobs = out[..., 0].clone()
    if not entropy:
        return TokenStats(logprobs, None)
    return TokenStats(logprobs, out[..., 1].clone() if entropy_grad else out[..., 1].detach().clone())


def takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether the forward of `model` (inside DDP, DeepSpeed, peft or torch.compile wrappers) lists transformers'
    ``logits_to_keep``; remote code and older architectures may not."""
    return _forward_lists_logits_to_keep(type(_unwrapped(model)))


@functools.cache
def _forward_lists_logits_to_keep(cls: type) -> bool:
    """Read once per model class: response_logits asks on every micro-batch."""
    try:
        return "logits_to_keep" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------------------------------
# LoRA adapters (peft, imported only with --use_peft) and quantised base weights (--load_in_4bit / --load_in_8bit)
# ---------------------------------------------------------------------------------------------------------------------


def no_split_modules(model: nn.Module) -> list[str]:
    """The class names of `model`'s transformer layers (transformers' _no_split_modules, through a peft wrapper):
    the units FSDP shards and a device map keeps whole."""
    if is_peft_model(model):
        model = model.get_base_model()
    return list(getattr(model, "_no_split_modules", None) or [])


def is_peft_model(model: nn.Module) -> bool:
    """Whether `model` is a peft PeftModel (peft is not imported for it: a model can only be one once it was)."""
    import sys

    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def with_lora(model: nn.Module, args, task_type: str = "CAUSAL_LM") -> nn.Module:
    """`model` wrapped in a peft PeftModel with a fresh LoRA adapter built from TRL's flags (`args`: a TrainConfig).

    peft freezes the base weights in place and adds the adapter's small matrices beside them, so the model with its
    adapter disabled *is* the base model: the reference of PPO and GRPO, without a second copy. The adapter starts
    as a no-op (lora_B = 0): training starts from the base model exactly. task_type SEQ_CLS (PPO's value model):
    peft also trains the score head in full (its modules_to_save). The adapters' dropout is off while
    --disable_dropout is on (the default), like every other dropout, so PPO's first ratio stays exactly 1.
    """
    try:
        from peft import get_peft_model
    except ImportError as e:
        raise ModelLoadError("--use_peft needs peft: pip install 'rlhfkit[peft]' (or pip install peft).") from e
    config = lora_config(
        args,
        task_type,
        lora_dropout=0.0 if args.disable_dropout else args.lora_dropout,
        modules_to_save=args.lora_modules_to_save if task_type == "CAUSAL_LM" else None,
        revision=args.model_revision,  # recorded in adapter_config.json, so loaders fetch the same base
    )
    try:
        with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing: not ours
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return get_peft_model(model, config)
    except ValueError as e:  # no module matches lora_target_modules, or peft knows no default for the architecture
        raise ModelLoadError(
            f"--use_peft cannot put a LoRA adapter on {type(model).__name__}: {e} Pass --lora_target_modules with "
            "the names of its linear layers (or all-linear)."
        ) from e


class adapter_disabled:  # a context manager: `with adapter_disabled(model):`
    """The base model of a PeftModel for the block: adapters (and modules_to_save copies) off, eval mode (as a frozen
    reference copy is); the mode is restored afterwards."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self) -> nn.Module:
        self.was_training = self.model.training
        self.model.eval()
        self.context = self.model.disable_adapter()
        self.context.__enter__()
        return self.model

    def __exit__(self, *exc) -> None:
        self.context.__exit__(*exc)
        self.model.train(self.was_training)


def write_merged(model: nn.Module, tokenizer, directory: str) -> None:
    """A plain transformers model in `directory`: a copy of the PeftModel `model` with its adapter merged into the
    base weights, and the tokenizer. `model` keeps its adapter; the copy costs one more set of weights meanwhile.
    Written into `directory`.tmp and renamed once complete, replacing an earlier `directory`."""
    import shutil

    tmp = directory.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    del merged
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)


def check_lora_setup(args) -> None:
    """What --use_peft and --load_in_4bit / --load_in_8bit need from this machine (peft; bitsandbytes and a CUDA
    GPU), checked before anything loads: a ModelLoadError (exit 2) that says what is missing."""
    import importlib.util

    if args.use_peft and importlib.util.find_spec("peft") is None:
        raise ModelLoadError("--use_peft needs peft: pip install 'rlhfkit[peft]' (or pip install peft).")
    quantization_config(args)


def quantization_config(args, dtype: torch.dtype | str | None = None):
    """transformers' BitsAndBytesConfig for --load_in_4bit / --load_in_8bit, as TRL's get_quantization_config builds
    it, or None. Where bitsandbytes or a CUDA GPU is missing: a ModelLoadError (exit 2), raised before any model
    loads (the builders call this first)."""
    flag = "load_in_4bit" if args.load_in_4bit else "load_in_8bit" if args.load_in_8bit else None
    if flag is None:
        return None
    import importlib.util

    missing = [
        what
        for what, present in (
            ("no CUDA GPU", torch.cuda.is_available()),
            ("no bitsandbytes", importlib.util.find_spec("bitsandbytes") is not None),
        )
        if not present
    ]
    if missing:
        raise ModelLoadError(
            f"--{flag} needs bitsandbytes and a CUDA GPU (pip install bitsandbytes); this machine has "
            f"{' and '.join(missing)}. Leave --{flag} out to train the LoRA adapter on unquantised weights."
        )
    from transformers import BitsAndBytesConfig

    if args.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_compute_dtype=dtype if isinstance(dtype, torch.dtype) else None,
        bnb_4bit_quant_type=args.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=args.use_bnb_nested_quant,
        bnb_4bit_quant_storage=args.bnb_4bit_quant_storage,
    )


def load_quantized_policy(name: str, dtype, args, flag: str = "sft_model_path", hub: Hub = DEFAULT_HUB) -> nn.Module:
    """A causal LM with quantised base weights (bitsandbytes) on this process's GPU, prepared for adapter training
    (peft's prepare_model_for_kbit_training: base frozen, norms in fp32; gradient checkpointing is left to
    --gradient_checkpointing). Needs a CUDA GPU: not exercised by rlhfkit's CPU tests."""
    from accelerate import PartialState
    from peft import prepare_model_for_kbit_training

    quantization = quantization_config(args, dtype)
    model = _from_pretrained(
        AutoModelForCausalLM,
        name,
        flag,
        hub,
        dtype=dtype,
        quantization_config=quantization,
        device_map={"": PartialState().local_process_index},
        **_build_options(hub),
    )
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def load_trained_policy(name: str, args, flag: str, hub: Hub = DEFAULT_HUB) -> nn.Module:
    """The policy a run trains, from a hub id or local directory (`args`: a TrainConfig): with --load_in_4bit /
    --load_in_8bit its base weights quantised (QLoRA: a CUDA GPU and bitsandbytes), else in --dtype's weights
    (float32 by default, the master weights of --bf16 / --fp16 mixed precision). Both trainers load it here. With
    GRPO's cast_lm_head_to_fp32 its LM head is cast at once, before an adapter, a reference copy or an engine's
    wrapper is made from it."""
    dtype = weight_dtype(args.dtype)
    if args.load_in_4bit or args.load_in_8bit:
        model = load_quantized_policy(name, dtype, args, flag, hub)
    else:
        model = load_policy(name, dtype, flag, hub)
    if getattr(args, "cast_lm_head_to_fp32", False):  # a GRPOConfig field; PPOConfig has none
        cast_lm_head_to_fp32(model)
    return model
