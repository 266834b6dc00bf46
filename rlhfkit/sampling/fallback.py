"""When the lean loop cannot sample, and sampling with ``model.generate`` instead.

Three things send generation to ``model.generate``: a model whose forward does not take the loop's arguments
(decoders.LEAN_LOOP_ARGS: custom remote code, older architectures), a GenerationConfig with an active option the
loop does not implement (beams, n-gram bans, bad words...: anything beyond LEAN_LOOP_OPTIONS), and a ``generate``
other than transformers' own (set on the model object, defined by its class, or patched into transformers): TRL
samples with ``model.generate``, so a script or test that replaces it expects the trainer to call it. Each switch is
said once, per model class or per option. :func:`hf_generate` returns what the lean loop returns: the tokens cut
after the stop token and the log-probs of the full softmax(logits / temperature).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import warnings
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig

from rlhfkit import ops
from rlhfkit.models import completion_token_stats
from rlhfkit.sampling.decoders import CACHE_ARGS, LEAN_LOOP_ARGS, Generated
from rlhfkit.sampling.settings import generation_config_fields, stop_ids, temperature_of

# Model classes known not to take the lean loop, with the reason (filled on first contact; the notice is said once).
_NO_LEAN_LOOP: dict[type, str] = {}


# GenerationConfig fields the lean loop implements...
LEAN_LOOP_OPTIONS = frozenset(
    {"max_new_tokens", "pad_token_id", "eos_token_id", "do_sample", "temperature", "top_k", "top_p", "min_p"}
    | {"repetition_penalty"}
)


# ...and those that change neither the tokens nor their log-probs (how generate runs or what else it returns).
_NO_EFFECT_OPTIONS = frozenset(
    {"bos_token_id", "use_cache", "cache_implementation", "cache_config", "max_cache_len", "compile_config"}
    | {"disable_compile", "output_attentions", "output_hidden_states", "output_scores", "output_logits"}
    | {"return_dict_in_generate"}
)


# Values at which other options do nothing, where a transformers release's default is None instead.
_INACTIVE_VALUES: dict[str, Any] = {
    "num_beams": 1,
    "num_beam_groups": 1,
    "num_return_sequences": 1,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "min_length": 0,
    "min_new_tokens": 0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "encoder_repetition_penalty": 1.0,
    "guidance_scale": 1.0,
    "diversity_penalty": 0.0,
    "length_penalty": 1.0,
    "early_stopping": False,
    "renormalize_logits": False,
    "remove_invalid_values": False,
}


# Generation options already announced as sending generation to model.generate (each is said once).
_ANNOUNCED_OPTIONS: set[str] = set()

_ANNOUNCED_GENERATE: set[type] = set()


def _is_transformers_generate(generate) -> bool:
    """Whether `generate` is transformers' GenerationMixin.generate, told by where it was defined (importing
    transformers.generation.utils here would cost every command a second): a patch, a mock or a class's own
    generate is defined elsewhere."""
    function = getattr(generate, "__func__", generate)
    return (
        getattr(function, "__module__", None) == "transformers.generation.utils"
        and getattr(function, "__qualname__", None) == "GenerationMixin.generate"
    )


def own_generate(model: nn.Module) -> str | None:
    """Why `model` samples with its own ``generate`` (None: transformers' is the one it has, or none): one set on the
    object (``model.generate = ...``, ``unittest.mock.patch.object``) or defined by its class, or transformers' own
    replaced since rlhfkit was imported. A PEFT wrapper's generate, which calls its base model's, counts as the base
    model's. Said once per model class."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    generate = getattr(type(base), "generate", None)
    if "generate" in vars(model) or "generate" in vars(base):
        reason = "its generate is set on the model object"
    elif callable(generate) and not _is_transformers_generate(generate):
        reason = f"{type(base).__name__}.generate is not transformers' GenerationMixin.generate"
    else:
        return None
    if type(model) not in _ANNOUNCED_GENERATE:
        _ANNOUNCED_GENERATE.add(type(model))
        warnings.warn(
            f"rlhfkit: sampling with the model's own generate ({reason}) instead of the lean KV-cache decoding loop, "
            "as TRL samples with model.generate. Said once per model class.",
            stacklevel=3,
        )
    return reason


def lean_loop_refusal(model: nn.Module) -> str | None:
    """Why the lean loop cannot drive `model` (None when it can, as far as the forward's signature tells)."""
    cls = type(model)
    if cls in _NO_LEAN_LOOP:
        return _NO_LEAN_LOOP[cls]
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):  # no signature to read: let the first forward call decide
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None  # **kwargs: the signature cannot tell; the first forward call decides
    names = {p.name for p in params}
    if any(name in names for name in CACHE_ARGS):
        names.add("past_key_values")  # the cache by its newer name counts
    missing = [name for name in LEAN_LOOP_ARGS if name not in names]
    if not missing:
        return None
    return remember_refusal(model, f"its forward takes no {', '.join(missing)}")


def remember_refusal(model: nn.Module, reason: str) -> str:
    cls = type(model)
    if cls not in _NO_LEAN_LOOP:
        _NO_LEAN_LOOP[cls] = reason
        warnings.warn(
            f"rlhfkit: {cls.__name__} cannot use the lean KV-cache decoding loop ({reason}); generating with "
            "model.generate instead (same tokens and log-probs, slower). Said once per model class.",
            stacklevel=2,
        )
    return _NO_LEAN_LOOP[cls]


def options_beyond_the_lean_loop(config: GenerationConfig) -> list[str]:
    """The active GenerationConfig options that the lean loop does not implement (a few attribute reads)."""
    found = []
    for name, default in _generation_defaults().items():
        if name in LEAN_LOOP_OPTIONS or name in _NO_EFFECT_OPTIONS:
            continue
        value = getattr(config, name, default)
        if (
            value is None
            or _same(value, default)
            or (name in _INACTIVE_VALUES and _same(value, _INACTIVE_VALUES[name]))
        ):
            continue
        found.append(name)
    return found


@functools.cache
def _generation_defaults() -> dict[str, Any]:
    defaults = GenerationConfig()
    return {name: getattr(defaults, name, None) for name in sorted(generation_config_fields())}


def _same(value: Any, default: Any) -> bool:
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # a tensor or an object without a plain equality: count it as set
        return False


def announce_options(options: list[str]) -> str:
    reason = f"it does not implement {', '.join(options)}"
    new = [name for name in options if name not in _ANNOUNCED_OPTIONS]
    if new:
        _ANNOUNCED_OPTIONS.update(new)
        warnings.warn(
            f"rlhfkit: the lean KV-cache decoding loop does not implement the generation option(s) "
            f"{', '.join(new)}; generating with model.generate instead (same kind of outputs: tokens cut after the "
            "stop token, log-probs of the full softmax(logits / temperature); slower). Said once per option.",
            stacklevel=3,
        )
    return reason


def hf_generate(
    model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, config: GenerationConfig
) -> Generated:
    """The lean loop's outputs from ``model.generate``: tokens padded after the first stop token, and each sampled
    token's log-prob under softmax(logits / temperature) of the full distribution (no repetition penalty, no
    truncation), from generate's raw logits, or from one forward where beam search leaves them unaligned."""
    B = prompt_ids.shape[0]
    if not config.max_new_tokens:
        return Generated(prompt_ids.new_zeros(B, 0), None)
    config = copy.deepcopy(config)
    config.output_logits = True
    config.return_dict_in_generate = True
    with _own_generation_defaults_hidden(model):
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask.long(), generation_config=config)
    if isinstance(out, torch.Tensor):  # a generate of the caller's may return the sequences alone
        out = SimpleNamespace(sequences=out, logits=())
    raw = out.sequences[:, prompt_ids.shape[1] :]
    # generate already pads finished rows; cutting here as well keeps the lean loop's contract for any generate.
    tokens = ops.truncate_after_stop_token(raw, stop_ids(config), config.pad_token_id)
    if not config.do_sample:
        return Generated(tokens, None)
    temperature = temperature_of(config)
    if len(out.logits) == raw.shape[1] and out.logits[0].shape[0] == B:
        logits = torch.stack(out.logits, dim=1).float()  # (B, T', V), raw: before temperature and any processor
        # After a row's stop token the lean loop's log-probs are of a discarded draw; here of the padding: both are
        # outside the completion mask, which every caller applies.
        return Generated(tokens, ops.logprobs_from_logits(logits, raw, temperature))
    # Beam search keeps num_beams rows per prompt and reorders them, so its logits do not line up with the returned
    # sequences (and a generate of the caller's may return none): score the returned tokens with one forward instead
    # (as TRL computes all its log-probs). Causal attention: the tokens after a stop token change nothing before it.
    input_ids = torch.cat([prompt_ids, raw], dim=1)
    attention_mask = torch.cat([prompt_mask.bool(), torch.ones_like(raw, dtype=torch.bool)], dim=1)
    return Generated(
        tokens,
        completion_token_stats(model, input_ids, attention_mask, prompt_ids.shape[1], raw, temperature).logprobs,
    )


@contextlib.contextmanager
def _own_generation_defaults_hidden(model: nn.Module):
    """``generate`` fills every field our config leaves unset from the model's own generation_config (a checkpoint's
    repetition_penalty, min_p, suppress_tokens...), which the lean loop never applies. Hide the model's defaults for
    the call, so both paths sample from the same distribution."""
    own = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = own
