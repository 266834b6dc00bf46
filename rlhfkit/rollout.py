"""Sampling responses and turning them into masked token tensors.

Shapes: B sequences, Lq query tokens (left-padded), T response tokens (right-padded), V vocabulary.
Masks are bool, True = a real token.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

from rlhfkit import ops
from rlhfkit.data import left_pad
from rlhfkit.models import position_ids_from_mask


class Responses(NamedTuple):
    """Sampled responses, truncated after their first terminator token."""

    ids: torch.Tensor  # (B, T) long, pad_token_id after the end
    mask: torch.Tensor  # (B, T) bool, True up to and including the terminator
    terminated: torch.Tensor  # (B,) bool, True if the response ends with a terminator (EOS or the stop token)


def terminator_ids(
    tokenizer: PreTrainedTokenizerBase, model: nn.Module | None = None, stop_token_id: int | None = None
) -> list[int]:
    """Every token id that ends a response: all EOS ids of the tokenizer and generation config, plus the stop token.

    Models such as Phi-3.5 declare several EOS ids; counting only tokenizer.eos_token_id miscounts
    terminated responses (TRL PR #7039).
    """
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_config = getattr(model, "generation_config", None)
    eos = getattr(gen_config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, Iterable):
        ids.update(int(i) for i in eos)
    if stop_token_id is not None:
        ids.add(int(stop_token_id))
    return sorted(ids)


def sampling_config(
    max_new_tokens: int,
    temperature: float | None,
    pad_token_id: int,
    stop_ids: list[int],
    top_p: float = 1.0,
    top_k: int = 0,
    *,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    generation_kwargs: dict[str, Any] | None = None,
) -> GenerationConfig:
    """Sampling at `temperature` (the full distribution unless top_p < 1, top_k > 0 or min_p is set), or greedy
    when None; TRL's GRPOConfig options, with transformers' meanings.

    - min_p: drop the tokens whose probability is below min_p times the most likely token's (after temperature,
      top_k and top_p). Sampling only, as in transformers (ignored when greedy).
    - repetition_penalty: divide the positive raw logits (multiply the negative ones) of every token already in
      the sequence, prompt and response, before temperature (CTRL's penalty; transformers' generate decides
      whether a prompt's left padding counts, and both of rlhfkit's decoding paths follow it). Greedy decoding
      applies it too. 1.0: none.
    - generation_kwargs: extra GenerationConfig fields, overriding the ones above (as TRL does). The lean
      decoding loop implements the options above; any other active option (num_beams, no_repeat_ngram_size,
      bad_words_ids, ...) sends generation to ``model.generate``, with a notice said once. An unknown field name
      is a ValueError.

    The log-probs used in the losses are those of the temperature-scaled full distribution, without the
    repetition penalty or any truncation; with these options (or top_p/top_k) the sampler draws from another one
    (as TRL does), so keep them at their defaults for exact on-policy ratios.
    """
    fields: dict[str, Any] = dict(max_new_tokens=max_new_tokens, pad_token_id=pad_token_id, eos_token_id=stop_ids)
    if repetition_penalty != 1.0:
        fields["repetition_penalty"] = repetition_penalty
    if temperature is None:
        fields["do_sample"] = False
    else:
        fields.update(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
        if min_p is not None:
            fields["min_p"] = min_p
    if generation_kwargs:
        unknown = sorted(set(generation_kwargs) - _generation_config_fields())
        if unknown:
            raise ValueError(
                f"generation_kwargs: unknown GenerationConfig field(s) {', '.join(map(repr, unknown))} "
                f"(transformers {_transformers_version()})."
            )
        fields.update(generation_kwargs)
    penalty = fields.get("repetition_penalty")
    if penalty is not None:
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not penalty > 0:
            raise ValueError(f"repetition_penalty={penalty!r}: must be a number > 0 (1.0: no penalty).")
        fields["repetition_penalty"] = float(penalty)  # transformers' processor takes floats only
    if fields.get("min_p") is not None and not 0 <= fields["min_p"] <= 1:
        raise ValueError(f"min_p={fields['min_p']!r}: must be a number in [0, 1].")
    if fields.get("num_return_sequences") not in (None, 1):
        raise ValueError(
            f"generation_kwargs: num_return_sequences={fields['num_return_sequences']!r}: rlhfkit draws one "
            "completion per prompt row; repeat the prompts instead (as GRPO's num_generations does)."
        )
    return GenerationConfig(**fields)


@functools.cache
def _generation_config_fields() -> frozenset[str]:
    return frozenset(name for name in GenerationConfig().to_dict() if not name.startswith("_")) - {
        "transformers_version"
    }


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


class Generated(NamedTuple):
    """Raw sampled tokens and their log-probabilities."""

    tokens: torch.Tensor  # (B, T') long, pad_token_id after a row's stop token
    logprobs: torch.Tensor | None  # (B, T') float32 log-prob of each sampled token under softmax(logits / temperature)
    # (the full distribution, as the losses use it, even when top_k / top_p / min_p restricted the draw or a
    # repetition penalty reshaped it); None when greedy


# What the lean loop passes to the forward besides input_ids and attention_mask. A forward that rejects one of them
# (custom remote code, older architectures) sends the model to the `model.generate` fallback. The KV cache goes by
# either name (_cache_arg).
LEAN_LOOP_ARGS = ("position_ids", "past_key_values", "use_cache", "logits_to_keep")
CACHE_ARGS = ("cache", "past_key_values")


def _transformers_names_it_cache() -> bool:
    """Whether this transformers calls the KV cache `cache` (5.24 on; `past_key_values` before, an alias until 5.40)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {})


def _cache_arg(model: nn.Module) -> str:
    """The name `model`'s forward takes the KV cache by: the one its signature lists, else transformers' own."""
    try:
        names = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        names = {}
    for name in CACHE_ARGS:
        if name in names:
            return name
    return "cache" if _transformers_names_it_cache() else "past_key_values"


def _cache_of(out):
    """The KV cache a forward returned, under either name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


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


@torch.inference_mode()
def generate(
    model: nn.Module,
    query_ids: torch.Tensor,
    query_mask: torch.Tensor,
    config: GenerationConfig,
    *,
    share_prefixes: bool = True,
) -> Generated:
    """Sample up to max_new_tokens per row (generation stops when every row has ended).

    A lean decoding loop over the model's KV cache instead of ``model.generate``: for the small models of the
    built-in task HF's per-token machinery (logits processors, stopping criteria, input preparation) costs more
    than the forward pass itself. The sampling distribution is the same as ``generate``'s, step for step in
    transformers' order: the repetition penalty on the raw logits of every token already in the sequence, then
    softmax(logits / temperature), optionally restricted to the top_k tokens, then to the top_p probability mass,
    then to the tokens of at least min_p times the top token's probability; greedy (argmax of the penalised
    logits) when ``config.do_sample`` is False. Rows that have produced a stop token continue with
    ``pad_token_id``. The log-probs of the sampled tokens come for free from the same logits, so a trainer can skip
    a policy forward: they are those of the full softmax(logits / temperature), WITHOUT the repetition penalty or
    any truncation (the distribution the losses use).

    share_prefixes: consecutive rows with the same prompt (GRPO's groups) are encoded once and their KV cache is
    copied to each row (`_prefill`); False encodes every row (the reference the tests compare against).
    ``config.cache_implementation == "static"`` decodes over a StaticCache with a compiled one-token step
    (`_StaticDecoder`) instead of the DynamicCache's eager steps (`_DynamicDecoder`); same tokens and log-probs.

    A model whose forward does not take the loop's arguments (``LEAN_LOOP_ARGS``), or a config with an active
    option the loop does not implement (anything beyond ``LEAN_LOOP_OPTIONS``: beams, n-gram bans, bad words...),
    is generated with ``model.generate`` instead, with the same kind of outputs; the switch is announced once per
    model class or option.
    """
    options = _options_beyond_the_lean_loop(config)
    if options:
        reason = _announce_options(options)
    else:
        reason = _lean_loop_refusal(model)
        if reason is None:
            try:
                return _lean_generate(model, query_ids, query_mask, config, share_prefixes)
            except _LoopArgumentsRejected as e:
                reason = _remember_refusal(model, str(e))
    if not callable(getattr(model, "generate", None)):
        raise TypeError(f"{type(model).__name__} cannot use the lean decoding loop ({reason}) and has no generate().")
    return _hf_generate(model, query_ids, query_mask, config)


class _LoopArgumentsRejected(Exception):
    """The model's forward raised a TypeError naming one of LEAN_LOOP_ARGS."""


def _lean_loop_refusal(model: nn.Module) -> str | None:
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
    return _remember_refusal(model, f"its forward takes no {', '.join(missing)}")


def _remember_refusal(model: nn.Module, reason: str) -> str:
    cls = type(model)
    if cls not in _NO_LEAN_LOOP:
        _NO_LEAN_LOOP[cls] = reason
        warnings.warn(
            f"rlhfkit: {cls.__name__} cannot use the lean KV-cache decoding loop ({reason}); generating with "
            "model.generate instead (same tokens and log-probs, slower). Said once per model class.",
            stacklevel=2,
        )
    return _NO_LEAN_LOOP[cls]


def _options_beyond_the_lean_loop(config: GenerationConfig) -> list[str]:
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
    return {name: getattr(defaults, name, None) for name in sorted(_generation_config_fields())}


def _same(value: Any, default: Any) -> bool:
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # a tensor or an object without a plain equality: count it as set
        return False


def _announce_options(options: list[str]) -> str:
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


def _probe(model: nn.Module, **kwargs):
    """A forward call whose TypeError about one of the lean loop's arguments means "use the fallback"; any other
    error (a real bug, a wrong shape) propagates unchanged."""
    try:
        return model(**kwargs)
    except TypeError as e:
        named = [
            name for name in (*LEAN_LOOP_ARGS, *CACHE_ARGS, "cache_position") if name in kwargs and name in str(e)
        ]
        if not named:
            raise
        raise _LoopArgumentsRejected(f"its forward raised TypeError: {e}") from e


def _prefill(
    model: nn.Module,
    query_ids: torch.Tensor,
    attention: torch.Tensor,
    position: torch.Tensor,
    share_prefixes: bool,
) -> tuple[torch.Tensor, Any]:
    """The prompts' forward: (B, V) logits of each row's last position and the KV cache of all B rows.

    Consecutive identical prompts (GRPO's groups of num_generations completions) are encoded once: the forward runs
    on the distinct prompts, and the cache is expanded to every row with the cache's own ``reorder_cache`` (the
    method beam search uses, which every transformers cache layer implements). Rows are independent in a forward, so
    each row's cache and logits are those of the unshared forward (up to the last bit of a matrix product's
    blocking, which may depend on the batch size). A cache without ``reorder_cache`` (custom code returning tuples)
    is encoded again in full. The prefill is one of the calls that reveal a forward refusing the loop's arguments.
    """
    first = _first_of_each_run(query_ids, attention) if share_prefixes else None
    rows = slice(None) if first is None else first
    out = _probe(
        model,
        input_ids=query_ids[rows],
        attention_mask=attention[rows],
        position_ids=position[rows],
        use_cache=True,
        logits_to_keep=1,
    )
    logits, cache = out.logits[:, -1, :], _cache_of(out)
    if first is None:
        return logits, cache
    if not callable(getattr(cache, "reorder_cache", None)):
        return _prefill(model, query_ids, attention, position, share_prefixes=False)
    copy_of = first.long().cumsum(0) - 1  # each row's index among the distinct prompts
    cache.reorder_cache(copy_of)
    return logits.index_select(0, copy_of), cache


def _first_of_each_run(query_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor | None:
    """(B,) bool, True where a row's prompt differs from the row before it; None when no two consecutive rows
    share a prompt (nothing to share)."""
    same = (query_ids[1:] == query_ids[:-1]).all(dim=1) & (attention[1:] == attention[:-1]).all(dim=1)
    if not bool(same.any()):
        return None
    return torch.cat([same.new_ones(1), ~same])


def _lean_generate(
    model: nn.Module,
    query_ids: torch.Tensor,
    query_mask: torch.Tensor,
    config: GenerationConfig,
    share_prefixes: bool = True,
) -> Generated:
    B = query_ids.shape[0]
    stop_ids = torch.tensor(_as_list(config.eos_token_id), device=query_ids.device, dtype=torch.long)
    if config.cache_implementation == "static" and _static_refusal(model) is None:
        decoder = _StaticDecoder(model, query_ids, query_mask, config.max_new_tokens)
    else:
        decoder = _DynamicDecoder(model, query_ids, query_mask, share_prefixes)
    logits = decoder.logits
    # The tokens a repetition penalty applies to, kept as a (B, V) mask updated in place; None (no cost) without one.
    seen = penalised = None
    if _has_repetition_penalty(config):
        seen = _tokens_seen(query_ids, query_mask, logits.shape[-1])
        penalised = seen[:, :-1]  # a view: it follows the updates
    done = torch.zeros(B, dtype=torch.bool, device=query_ids.device)
    tokens, logprobs = [], []
    for step in range(config.max_new_tokens):
        token, logprob = _pick(logits, config, penalised)
        token = torch.where(done, torch.full_like(token, config.pad_token_id), token)
        tokens.append(token)
        logprobs.append(logprob)
        done = done | torch.isin(token, stop_ids)
        if step == config.max_new_tokens - 1 or bool(done.all()):
            break
        if seen is not None:  # generate's input_ids grow by the same token, padding included for finished rows
            _mark_seen(seen, token)
        logits = decoder.step(token)
    if not tokens:
        return Generated(query_ids.new_zeros(B, 0), None)
    sampled = config.do_sample
    return Generated(torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1) if sampled else None)


class _DynamicDecoder:
    """The default decoder: eager forwards over transformers' DynamicCache, which grows by one position a step.

    `logits`: (B, V) raw logits of the next token; `step(token)` feeds one token per row and returns the next."""

    def __init__(self, model: nn.Module, query_ids: torch.Tensor, query_mask: torch.Tensor, share_prefixes: bool):
        self.model, self.cache_arg, self.steps = model, _cache_arg(model), 0
        self.attention = query_mask.long()
        position = position_ids_from_mask(query_mask)
        self.next_position = position[:, -1:] + 1
        self.logits, self.cache = _prefill(model, query_ids, self.attention, position, share_prefixes)

    def step(self, token: torch.Tensor) -> torch.Tensor:
        self.attention = torch.cat([self.attention, self.attention.new_ones(len(token), 1)], dim=1)
        forward = functools.partial(_probe, self.model) if self.steps == 0 else self.model  # reveals a refusal
        out = forward(
            input_ids=token[:, None],
            attention_mask=self.attention,
            position_ids=self.next_position,
            use_cache=True,
            **{self.cache_arg: self.cache},
        )
        self.cache, self.steps = _cache_of(out), self.steps + 1
        self.next_position = self.next_position + 1
        return out.logits[:, -1, :]


# The static cache's width (prompt + max_new_tokens) is rounded up to a multiple of this many tokens, so that the
# compiled step's shapes repeat from one generation to the next instead of recompiling.
STATIC_WIDTH_MULTIPLE = 64

# Per model, its static caches and compiled steps by (batch, width, device, dtype), kept for the run (a step's
# closure holds the model, so an entry lasts as long as the process: one per model a run samples from).
_STATIC_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# Model classes that cannot use the static cache, with the reason: a forward without cache_position, or a step that
# failed to compile (said once; they decode over the DynamicCache after).
_NO_STATIC: dict[type, str] = {}


def _static_refusal(model: nn.Module) -> str | None:
    """Why `model` cannot decode over a static cache with a compiled step (None when it can, as far as known)."""
    cls = type(model)
    if cls not in _NO_STATIC:
        try:
            params = inspect.signature(model.forward).parameters.values()
        except (TypeError, ValueError):
            params = []
        if params and not any(p.kind is inspect.Parameter.VAR_KEYWORD or p.name == "cache_position" for p in params):
            _refuse_static(model, "its forward takes no cache_position")
    return _NO_STATIC.get(cls)


def _refuse_static(model: nn.Module, reason: str) -> None:
    _NO_STATIC[type(model)] = reason
    warnings.warn(
        f"rlhfkit: --cache_implementation static cannot be used with {type(model).__name__} ({reason}); decoding "
        "over the dynamic KV cache instead (same tokens and log-probs). Said once per model class.",
        stacklevel=3,
    )


class _StaticDecoder:
    """--cache_implementation static: a StaticCache of the whole width (prompt + max_new_tokens) and a
    ``torch.compile``d one-token step (inductor; one graph per batch size, width and model, kept for the run).

    The cache's width is the prompt width + max_new_tokens rounded up to a multiple of STATIC_WIDTH_MULTIPLE (its
    unused slots are masked), so one graph serves generations whose prompt widths differ a little. Prompts are
    encoded row by row (no shared prefixes: the cache's rows are fixed in place). A step that fails to
    compile finishes its generation eagerly over the same cache, and the model class decodes over the dynamic
    cache from then on (said once)."""

    def __init__(self, model: nn.Module, query_ids: torch.Tensor, query_mask: torch.Tensor, max_new_tokens: int):
        from transformers import StaticCache

        B, width = query_ids.shape
        total = -(-(width + max_new_tokens) // STATIC_WIDTH_MULTIPLE) * STATIC_WIDTH_MULTIPLE
        self.model, cache_arg = model, _cache_arg(model)
        per_model = _STATIC_STEPS.setdefault(model, {})
        key = (B, total, query_ids.device, next(model.parameters()).dtype)
        if key not in per_model:
            cache = StaticCache(config=model.config, max_cache_len=total)
            per_model[key] = (cache, self._step_function(model, cache, cache_arg))
        self.cache, self.step_functions = per_model[key]
        self.cache.reset()
        self.attention = torch.zeros(B, total, dtype=torch.long, device=query_ids.device)
        self.attention[:, :width] = query_mask.long()
        position = position_ids_from_mask(query_mask)
        self.next_position = position[:, -1:] + 1
        self.slot = width  # where the next token's keys and values go
        out = _probe(
            model,
            input_ids=query_ids,
            attention_mask=self.attention,
            position_ids=position,
            cache_position=torch.arange(width, device=query_ids.device),
            use_cache=True,
            logits_to_keep=1,
            **{cache_arg: self.cache},
        )
        self.logits = out.logits[:, -1, :]

    @staticmethod
    def _step_function(model: nn.Module, cache, cache_arg: str):
        def step(token, position, cache_position, attention):
            out = model(
                input_ids=token,
                attention_mask=attention,
                position_ids=position,
                cache_position=cache_position,
                use_cache=True,
                **{cache_arg: cache},
            )
            return out.logits[:, -1, :]

        return step, torch.compile(step, dynamic=False, fullgraph=True)

    def step(self, token: torch.Tensor) -> torch.Tensor:
        self.attention[:, self.slot] = 1
        eager, compiled = self.step_functions
        inputs = (token[:, None], self.next_position, torch.tensor([self.slot], device=token.device), self.attention)
        self.slot, self.next_position = self.slot + 1, self.next_position + 1
        if type(self.model) in _NO_STATIC:
            return eager(*inputs)
        try:
            return compiled(*inputs).clone()  # the compiled graph may reuse its output buffer on the next call
        except Exception as e:  # any compiler failure: this generation goes on eagerly, same cache, same numbers
            first_line = str(e).splitlines()[0] if str(e) else ""
            _refuse_static(self.model, f"its decode step did not compile: {type(e).__name__}: {first_line}")
            return eager(*inputs)


def _hf_generate(
    model: nn.Module, query_ids: torch.Tensor, query_mask: torch.Tensor, config: GenerationConfig
) -> Generated:
    """The lean loop's outputs from ``model.generate``: tokens padded after the first stop token, and each sampled
    token's log-prob under softmax(logits / temperature) of the full distribution (no repetition penalty, no
    truncation), from generate's raw logits, or from one forward where beam search leaves them unaligned."""
    B = query_ids.shape[0]
    if not config.max_new_tokens:
        return Generated(query_ids.new_zeros(B, 0), None)
    config = copy.deepcopy(config)
    config.output_logits = True
    config.return_dict_in_generate = True
    with _own_generation_defaults_hidden(model):
        out = model.generate(input_ids=query_ids, attention_mask=query_mask.long(), generation_config=config)
    raw = out.sequences[:, query_ids.shape[1] :]
    # generate already pads finished rows; cutting here as well keeps the lean loop's contract for any generate.
    tokens = ops.truncate_after_stop_token(raw, _as_list(config.eos_token_id), config.pad_token_id)
    if not config.do_sample:
        return Generated(tokens, None)
    temperature = _temperature(config)
    if len(out.logits) == raw.shape[1] and out.logits[0].shape[0] == B:
        logits = torch.stack(out.logits, dim=1).float()  # (B, T', V), raw: before temperature and any processor
        # After a row's stop token the lean loop's log-probs are of a discarded draw; here of the padding: both are
        # outside the response mask, which every caller applies.
        return Generated(tokens, ops.logprobs_from_logits(logits, raw, temperature))
    # Beam search keeps num_beams rows per prompt and reorders them, so its logits do not line up with the returned
    # sequences: score the returned tokens with one forward instead (as TRL computes all its log-probs). Causal
    # attention: the tokens after a stop token change nothing before it.
    from rlhfkit.models import response_logits

    input_ids = torch.cat([query_ids, raw], dim=1)
    attention_mask = torch.cat([query_mask.bool(), torch.ones_like(raw, dtype=torch.bool)], dim=1)
    logits = response_logits(model, input_ids, attention_mask, query_ids.shape[1])
    return Generated(tokens, ops.logprobs_from_logits(logits.float(), raw, temperature))


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


def _as_list(ids) -> list[int]:
    if ids is None:
        return []
    return [int(ids)] if isinstance(ids, int) else [int(i) for i in ids]


def _temperature(config: GenerationConfig) -> float:
    return 1.0 if config.temperature is None else config.temperature


def _has_repetition_penalty(config: GenerationConfig) -> bool:
    return config.repetition_penalty is not None and config.repetition_penalty != 1.0


def _tokens_seen(query_ids: torch.Tensor, query_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(B, V + 1) bool: the tokens of each prompt a repetition penalty applies to, as transformers' generate counts
    them; column V gathers ids beyond the output vocabulary (never generated, so never penalised) and the prompt's
    left padding where the installed transformers leaves it out. Slice off the last column to use it."""
    ids = query_ids
    if _repetition_penalty_skips_left_padding():
        padding = (query_mask != 0).int().argmax(dim=1)  # leading pad tokens per row, as generate computes them
        positions = torch.arange(ids.shape[1], device=ids.device)
        ids = ids.masked_fill(positions[None, :] < padding[:, None], vocab_size)
    seen = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.bool, device=ids.device)
    return seen.scatter_(1, ids.clamp(max=vocab_size), True)


def _mark_seen(seen: torch.Tensor, token: torch.Tensor) -> None:
    """Add one token per row to a mask from `_tokens_seen`, in place."""
    seen.scatter_(1, token[:, None].clamp(max=seen.shape[1] - 1), True)


@functools.cache
def _repetition_penalty_skips_left_padding() -> bool:
    """Whether the installed transformers' generate leaves a prompt's left padding out of the repetition penalty.

    Older releases penalise every id of input_ids (the pad token among them); newer ones pass the padding lengths
    of the attention mask to RepetitionPenaltyLogitsProcessor as prompt_ignore_length. Asked of transformers' own
    processor list (a one-token prompt behind one pad), so the lean loop agrees with generate on any release.
    """
    from transformers.generation.utils import GenerationMixin

    class Probe(GenerationMixin):
        config = type("Config", (), {"is_encoder_decoder": False})()

    try:
        processors = Probe()._get_logits_processor(
            GenerationConfig(repetition_penalty=2.0),
            input_ids_seq_length=2,
            device="cpu",
            model_kwargs={"attention_mask": torch.tensor([[0, 1]])},
        )
        scores = processors(torch.tensor([[0, 1]]), torch.ones(1, 2))
    except Exception:  # an internal API that changed shape: fall back on the long-standing behaviour
        return False
    return bool(scores[0, 0] == 1.0) and bool(scores[0, 1] == 0.5)


def _processed_logits(
    logits: torch.Tensor, config: GenerationConfig, seen: torch.Tensor | None = None
) -> torch.Tensor:
    """The (B, V) float32 scores generate picks the next token from, given the raw logits, in the order of
    transformers' ``GenerationMixin._get_logits_processor``: the repetition penalty (every token marked in `seen`,
    (B, V) bool: divide its positive logit by the penalty, multiply a negative one), then, when sampling,
    temperature, top_k, top_p and min_p, the tokens they drop at -inf. Greedy picks the argmax of these scores,
    sampling draws from their softmax."""
    z = logits.float()
    if seen is not None and _has_repetition_penalty(config):
        z = _penalised(z, seen, config.repetition_penalty)
    if not config.do_sample:
        return z
    return _warped(z / _temperature(config), config)


def _penalised(z: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    return torch.where(seen, torch.where(z < 0, z * penalty, z / penalty), z)


def _warped(z: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
    """Temperature-scaled scores restricted by top_k, then top_p, then min_p, exactly as transformers' warpers
    compute them (with min_tokens_to_keep = 1)."""
    if config.top_k and config.top_k < z.shape[-1]:
        kth = torch.topk(z, config.top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if config.top_p is not None and config.top_p < 1.0:
        # Drop the least likely tokens whose cumulative mass (from the bottom) stays within 1 - top_p; the most
        # likely token always stays.
        sorted_z, order = torch.sort(z, dim=-1, descending=False)
        drop_sorted = sorted_z.softmax(dim=-1).cumsum(dim=-1) <= 1 - config.top_p
        drop_sorted[:, -1:] = False
        z = z.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    if config.min_p:
        # Drop the tokens less likely than min_p times the most likely one (never the most likely: min_p <= 1).
        probs = torch.softmax(z, dim=-1)
        z = z.masked_fill(probs < config.min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    return z


def _pick(
    logits: torch.Tensor, config: GenerationConfig, seen: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next token per row from (B, V) raw logits: argmax, or a sample from the softmax of `_processed_logits`
    (repetition penalty on the tokens in `seen`, temperature, top_k / top_p / min_p restrictions); and the sampled
    token's log-prob under the unpenalised, unrestricted softmax(logits / temperature) (None when greedy)."""
    if not config.do_sample:
        scores = logits if seen is None else _processed_logits(logits, config, seen)
        return scores.argmax(dim=-1), None
    full = logits.float() / _temperature(config)
    z = full
    if seen is not None and _has_repetition_penalty(config):
        z = _penalised(logits.float(), seen, config.repetition_penalty) / _temperature(config)
    token = torch.multinomial(torch.softmax(_warped(z, config), dim=-1), 1).squeeze(-1)
    logprob = full.gather(-1, token[:, None]).squeeze(-1) - torch.logsumexp(full, dim=-1)
    return token, logprob


def truncate_responses(raw: torch.Tensor, stop_ids: list[int], pad_token_id: int) -> Responses:
    """Cut each response after its first terminator; everything after becomes padding."""
    ids = ops.truncate_after_stop_token(raw, stop_ids, pad_token_id)
    is_stop = torch.isin(raw, torch.tensor(stop_ids, device=raw.device))
    first_stop = ops.first_true_index(is_stop)  # T when there is none
    lengths = torch.where(first_stop < raw.shape[1], first_stop + 1, torch.full_like(first_stop, raw.shape[1]))
    mask = ops.mask_from_lengths(lengths, raw.shape[1])
    return Responses(ids=ids.masked_fill(~mask, pad_token_id), mask=mask, terminated=first_stop < raw.shape[1])


class Chunk(NamedTuple):
    """Prompts of one generation chunk and their responses."""

    query_ids: torch.Tensor  # (B, Lq) long, left-padded
    query_mask: torch.Tensor  # (B, Lq) bool
    responses: Responses
    logprobs: torch.Tensor | None  # (B, T) sampling log-probs of the response tokens, 0 outside the mask; greedy: None

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.responses.ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.responses.mask], dim=1)


def complete(
    model: nn.Module,
    prompt_ids: list[list[int]],
    config: GenerationConfig,
    stop_ids: list[int],
    pad_token_id: int,
    batch_size: int,
    device: torch.device | str = "cpu",
) -> Iterator[Chunk]:
    """Generate responses to `prompt_ids` in chunks of `batch_size`, truncated after their first terminator."""
    for i in range(0, len(prompt_ids), batch_size):
        query_ids, query_mask = (t.to(device) for t in left_pad(prompt_ids[i : i + batch_size], pad_token_id))
        raw = generate(model, query_ids, query_mask, config)
        responses = truncate_responses(raw.tokens, stop_ids, pad_token_id)
        logprobs = None if raw.logprobs is None else torch.where(responses.mask, raw.logprobs, 0.0)
        yield Chunk(query_ids, query_mask, responses, logprobs)


def greedy_completions(
    model: nn.Module,
    rows: list[dict],
    tokenizer: PreTrainedTokenizerBase,
    stop_ids: list[int],
    max_new_tokens: int,
    batch_size: int,
    device: torch.device | str = "cpu",
) -> Iterator[tuple[list[dict], Chunk]]:
    """Greedy responses to tokenized dataset rows (their "input_ids"), in batches: (the batch's rows, its Chunk)."""
    config = sampling_config(max_new_tokens, None, tokenizer.pad_token_id, stop_ids)
    prompt_ids = [row["input_ids"] for row in rows]
    chunks = complete(model, prompt_ids, config, stop_ids, tokenizer.pad_token_id, batch_size, device)
    for i, chunk in enumerate(chunks):
        yield rows[i * batch_size : (i + 1) * batch_size], chunk


def pad_right(tensors: list[torch.Tensor], value: int | bool | float) -> torch.Tensor:
    """Concatenate (B_i, T_i) tensors along the batch, padding on the right to the widest."""
    width = max(t.shape[1] for t in tensors)
    return torch.cat([nn.functional.pad(t, (0, width - t.shape[1]), value=value) for t in tensors])


def decode(
    tokenizer: PreTrainedTokenizerBase, ids: torch.Tensor, mask: torch.Tensor, skip_special_tokens: bool = True
) -> list[str]:
    """Text of the real tokens of each row (special tokens removed unless asked)."""
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=skip_special_tokens) for row, m in zip(ids, mask)]
