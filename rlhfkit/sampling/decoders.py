"""The lean decoding loop: sampling over the model's KV cache without ``model.generate``'s per-token machinery.

For small models, generate's logits processors, stopping criteria and input preparation cost more than the forward
itself. :func:`lean_generate` draws the same distribution, step for step (processors.py), from one of two decoders:
:class:`DynamicDecoder` (eager forwards over transformers' DynamicCache, the default; GRPO's shared prompts encoded
once) or :class:`StaticDecoder` (a StaticCache and a ``torch.compile``d one-token step, --cache_implementation
static). A forward that refuses the loop's arguments raises :class:`LoopArgumentsRejected` on its first call, and
generation falls back to ``model.generate`` (fallback.py).

Shapes: B rows, Lp prompt tokens (left-padded), T' sampled tokens, V vocabulary.
"""

from __future__ import annotations

import functools
import inspect
import warnings
import weakref
from typing import Any, NamedTuple

import torch
from torch import nn
from transformers import GenerationConfig

from rlhfkit.errors import LoopArgumentsRejected
from rlhfkit.models import position_ids_from_mask
from rlhfkit.sampling.processors import mark_seen, pick, tokens_seen
from rlhfkit.sampling.settings import has_repetition_penalty, stop_ids


class Generated(NamedTuple):
    """Raw sampled tokens and their log-probabilities."""

    tokens: torch.Tensor  # (B, T') long, pad_token_id after a row's stop token
    sampling_logprobs: (
        torch.Tensor | None
    )  # (B, T') float32 log-prob of each sampled token under softmax(logits / temperature)
    # (the full distribution, as the losses use it, even when top_k / top_p / min_p restricted the draw or a
    # repetition penalty reshaped it); None when greedy


# What the lean loop passes to the forward besides input_ids and attention_mask. A forward that rejects one of them
# (custom remote code, older architectures) sends the model to the `model.generate` fallback. The KV cache goes by
# either name (_cache_arg).
LEAN_LOOP_ARGS = ("position_ids", "past_key_values", "use_cache", "logits_to_keep")
CACHE_ARGS = ("cache", "past_key_values")


def probe(model: nn.Module, **kwargs):
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
        raise LoopArgumentsRejected(f"its forward raised TypeError: {e}") from e


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


def lean_generate(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    config: GenerationConfig,
    share_prefixes: bool = True,
) -> Generated:
    """Up to max_new_tokens per row from the lean loop (completions.generate says what it samples); raises
    LoopArgumentsRejected when the model's forward refuses the loop's arguments."""
    B = prompt_ids.shape[0]
    stops = torch.tensor(stop_ids(config), device=prompt_ids.device, dtype=torch.long)
    if config.cache_implementation == "static" and _static_refusal(model) is None:
        decoder = StaticDecoder(model, prompt_ids, prompt_mask, config.max_new_tokens)
    else:
        decoder = DynamicDecoder(model, prompt_ids, prompt_mask, share_prefixes)
    logits = decoder.logits
    # The tokens a repetition penalty applies to, kept as a (B, V) mask updated in place; None (no cost) without one.
    seen = penalised = None
    if has_repetition_penalty(config):
        seen = tokens_seen(prompt_ids, prompt_mask, logits.shape[-1])
        penalised = seen[:, :-1]  # a view: it follows the updates
    done = torch.zeros(B, dtype=torch.bool, device=prompt_ids.device)
    tokens, logprobs = [], []
    for step in range(config.max_new_tokens):
        token, logprob = pick(logits, config, penalised)
        token = torch.where(done, torch.full_like(token, config.pad_token_id), token)
        tokens.append(token)
        logprobs.append(logprob)
        done = done | torch.isin(token, stops)
        if step == config.max_new_tokens - 1 or bool(done.all()):
            break
        if seen is not None:  # generate's input_ids grow by the same token, padding included for finished rows
            mark_seen(seen, token)
        logits = decoder.step(token)
    if not tokens:
        return Generated(prompt_ids.new_zeros(B, 0), None)
    sampled = config.do_sample
    return Generated(torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1) if sampled else None)


def _prefill(
    model: nn.Module,
    prompt_ids: torch.Tensor,
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
    first = _first_of_each_run(prompt_ids, attention) if share_prefixes else None
    rows = slice(None) if first is None else first
    out = probe(
        model,
        input_ids=prompt_ids[rows],
        attention_mask=attention[rows],
        position_ids=position[rows],
        use_cache=True,
        logits_to_keep=1,
    )
    logits, cache = out.logits[:, -1, :], _cache_of(out)
    if first is None:
        return logits, cache
    if not callable(getattr(cache, "reorder_cache", None)):
        return _prefill(model, prompt_ids, attention, position, share_prefixes=False)
    copy_of = first.long().cumsum(0) - 1  # each row's index among the distinct prompts
    cache.reorder_cache(copy_of)
    return logits.index_select(0, copy_of), cache


def _first_of_each_run(prompt_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor | None:
    """(B,) bool, True where a row's prompt differs from the row before it; None when no two consecutive rows
    share a prompt (nothing to share)."""
    same = (prompt_ids[1:] == prompt_ids[:-1]).all(dim=1) & (attention[1:] == attention[:-1]).all(dim=1)
    if not bool(same.any()):
        return None
    return torch.cat([same.new_ones(1), ~same])


class DynamicDecoder:
    """The default decoder: eager forwards over transformers' DynamicCache, which grows by one position a step.

    `logits`: (B, V) raw logits of the next token; `step(token)` feeds one token per row and returns the next."""

    def __init__(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, share_prefixes: bool):
        self.model, self.cache_arg, self.steps = model, _cache_arg(model), 0
        self.attention = prompt_mask.long()
        position = position_ids_from_mask(prompt_mask)
        self.next_position = position[:, -1:] + 1
        self.logits, self.cache = _prefill(model, prompt_ids, self.attention, position, share_prefixes)

    def step(self, token: torch.Tensor) -> torch.Tensor:
        self.attention = torch.cat([self.attention, self.attention.new_ones(len(token), 1)], dim=1)
        forward = functools.partial(probe, self.model) if self.steps == 0 else self.model  # reveals a refusal
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


class StaticDecoder:
    """--cache_implementation static: a StaticCache of the whole width (prompt + max_new_tokens) and a
    ``torch.compile``d one-token step (inductor; one graph per batch size, width and model, kept for the run).

    The cache's width is the prompt width + max_new_tokens rounded up to a multiple of STATIC_WIDTH_MULTIPLE (its
    unused slots are masked), so one graph serves generations whose prompt widths differ a little. Prompts are
    encoded row by row (no shared prefixes: the cache's rows are fixed in place). A step that fails to
    compile finishes its generation eagerly over the same cache, and the model class decodes over the dynamic
    cache from then on (said once)."""

    def __init__(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int):
        from transformers import StaticCache

        B, width = prompt_ids.shape
        total = -(-(width + max_new_tokens) // STATIC_WIDTH_MULTIPLE) * STATIC_WIDTH_MULTIPLE
        self.model, cache_arg = model, _cache_arg(model)
        per_model = _STATIC_STEPS.setdefault(model, {})
        key = (B, total, prompt_ids.device, next(model.parameters()).dtype)
        if key not in per_model:
            cache = StaticCache(config=model.config, max_cache_len=total)
            per_model[key] = (cache, self._step_function(model, cache, cache_arg))
        self.cache, self.step_functions = per_model[key]
        self.cache.reset()
        self.attention = torch.zeros(B, total, dtype=torch.long, device=prompt_ids.device)
        self.attention[:, :width] = prompt_mask.long()
        position = position_ids_from_mask(prompt_mask)
        self.next_position = position[:, -1:] + 1
        self.slot = width  # where the next token's keys and values go
        out = probe(
            model,
            input_ids=prompt_ids,
            attention_mask=self.attention,
            position_ids=position,
            cache_position=torch.arange(width, device=prompt_ids.device),
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
