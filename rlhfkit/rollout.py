"""Sampling responses and turning them into masked token tensors.

Shapes: B sequences, Lq query tokens (left-padded), T response tokens (right-padded), V vocabulary.
Masks are bool, True = a real token.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from collections.abc import Iterable, Iterator
from typing import NamedTuple

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
) -> GenerationConfig:
    """Sampling at `temperature` (the full distribution unless top_p < 1 or top_k > 0), or greedy when None.

    The log-probs used in the losses are those of the temperature-scaled full distribution; with top_p/top_k the
    sampler draws from a truncated one (as TRL does), so keep them at their defaults for exact on-policy ratios.
    """
    common = dict(max_new_tokens=max_new_tokens, pad_token_id=pad_token_id, eos_token_id=stop_ids)
    if temperature is None:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p, **common)


class Generated(NamedTuple):
    """Raw sampled tokens and their log-probabilities."""

    tokens: torch.Tensor  # (B, T') long, pad_token_id after a row's stop token
    logprobs: torch.Tensor | None  # (B, T') float32 log-prob of each sampled token under softmax(logits / temperature)
    # (the full distribution, as the losses use it, even when top_k / top_p restricted the draw); None when greedy


# What the lean loop passes to the forward besides input_ids and attention_mask. A forward that rejects one of them
# (custom remote code, older architectures) sends the model to the `model.generate` fallback.
LEAN_LOOP_ARGS = ("position_ids", "past_key_values", "use_cache", "logits_to_keep")

# Model classes known not to take the lean loop, with the reason (filled on first contact; the notice is said once).
_NO_LEAN_LOOP: dict[type, str] = {}


@torch.inference_mode()
def generate(
    model: nn.Module, query_ids: torch.Tensor, query_mask: torch.Tensor, config: GenerationConfig
) -> Generated:
    """Sample up to max_new_tokens per row (generation stops when every row has ended).

    A lean decoding loop over the model's KV cache instead of ``model.generate``: for the small models of the
    built-in task HF's per-token machinery (logits processors, stopping criteria, input preparation) costs more
    than the forward pass itself. The sampling distribution is the same as ``generate``'s: softmax(logits /
    temperature), optionally restricted to the top_k tokens and then to the top_p probability mass; greedy when
    ``config.do_sample`` is False. Rows that have produced a stop token continue with ``pad_token_id``. The
    log-probs of the sampled tokens come for free from the same logits, so a trainer can skip a policy forward.

    A model whose forward does not take the loop's arguments (``LEAN_LOOP_ARGS``) is generated with
    ``model.generate`` instead, with the same outputs; the switch is announced once per model class.
    """
    reason = _lean_loop_refusal(model)
    if reason is None:
        try:
            return _lean_generate(model, query_ids, query_mask, config)
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
    missing = [name for name in LEAN_LOOP_ARGS if name not in {p.name for p in params}]
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


def _probe(model: nn.Module, **kwargs):
    """A forward call whose TypeError about one of the lean loop's arguments means "use the fallback"; any other
    error (a real bug, a wrong shape) propagates unchanged."""
    try:
        return model(**kwargs)
    except TypeError as e:
        named = [name for name in LEAN_LOOP_ARGS if name in kwargs and name in str(e)]
        if not named:
            raise
        raise _LoopArgumentsRejected(f"its forward raised TypeError: {e}") from e


def _lean_generate(
    model: nn.Module, query_ids: torch.Tensor, query_mask: torch.Tensor, config: GenerationConfig
) -> Generated:
    B = query_ids.shape[0]
    stop_ids = torch.tensor(_as_list(config.eos_token_id), device=query_ids.device, dtype=torch.long)
    attention = query_mask.long()
    position = position_ids_from_mask(query_mask)
    # The first prefill and the first cached step are the calls that reveal a forward refusing the loop's arguments.
    out = _probe(
        model, input_ids=query_ids, attention_mask=attention, position_ids=position, use_cache=True, logits_to_keep=1
    )
    next_position = position[:, -1:] + 1
    done = torch.zeros(B, dtype=torch.bool, device=query_ids.device)
    tokens, logprobs = [], []
    for step in range(config.max_new_tokens):
        token, logprob = _pick(out.logits[:, -1, :], config)
        token = torch.where(done, torch.full_like(token, config.pad_token_id), token)
        tokens.append(token)
        logprobs.append(logprob)
        done = done | torch.isin(token, stop_ids)
        if step == config.max_new_tokens - 1 or bool(done.all()):
            break
        attention = torch.cat([attention, attention.new_ones(B, 1)], dim=1)
        forward = functools.partial(_probe, model) if step == 0 else model
        out = forward(
            input_ids=token[:, None],
            attention_mask=attention,
            position_ids=next_position,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
        next_position = next_position + 1
    if not tokens:
        return Generated(query_ids.new_zeros(B, 0), None)
    sampled = config.do_sample
    return Generated(torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1) if sampled else None)


def _hf_generate(
    model: nn.Module, query_ids: torch.Tensor, query_mask: torch.Tensor, config: GenerationConfig
) -> Generated:
    """The lean loop's outputs from ``model.generate``: tokens padded after the first stop token, and each sampled
    token's log-prob under softmax(logits / temperature) of the full distribution, from generate's raw logits."""
    B = query_ids.shape[0]
    if not config.max_new_tokens:
        return Generated(query_ids.new_zeros(B, 0), None)
    with _own_generation_defaults_hidden(model):
        out = model.generate(
            input_ids=query_ids,
            attention_mask=query_mask.long(),
            generation_config=config,
            output_logits=True,
            return_dict_in_generate=True,
        )
    raw = out.sequences[:, query_ids.shape[1] :]
    # generate already pads finished rows; cutting here as well keeps the lean loop's contract for any generate.
    tokens = ops.truncate_after_stop_token(raw, _as_list(config.eos_token_id), config.pad_token_id)
    if not config.do_sample:
        return Generated(tokens, None)
    logits = torch.stack(out.logits, dim=1).float()  # (B, T', V), raw: before temperature and any processor
    # After a row's stop token the lean loop's log-probs are of a discarded draw; here of the padding: both are
    # outside the response mask, which every caller applies.
    return Generated(tokens, ops.logprobs_from_logits(logits, raw, config.temperature))


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


def _pick(logits: torch.Tensor, config: GenerationConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next token per row from (B, V) logits: argmax, or a sample from the (top-k / top-p restricted) softmax; and
    the sampled token's log-prob under the unrestricted softmax(logits / temperature) (None when greedy)."""
    if not config.do_sample:
        return logits.argmax(dim=-1), None
    full = logits.float() / config.temperature
    z = full
    if config.top_k and config.top_k < z.shape[-1]:
        kth = torch.topk(z, config.top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if config.top_p is not None and config.top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        probs = torch.softmax(sorted_z, dim=-1)
        # Drop a token when the mass of the tokens strictly before it already reaches top_p (the first always stays).
        drop_sorted = probs.cumsum(dim=-1) - probs >= config.top_p
        z = z.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    token = torch.multinomial(torch.softmax(z, dim=-1), 1).squeeze(-1)
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


def response_logprobs(
    logits: torch.Tensor, query_width: int, response_ids: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Log-probs (B, T) of the response tokens under temperature-scaled logits of the full sequence (B, Lq+T, V)."""
    response_logits = logits[:, query_width - 1 : -1]
    return ops.logprobs_from_logits(response_logits, response_ids, temperature)


def decode(
    tokenizer: PreTrainedTokenizerBase, ids: torch.Tensor, mask: torch.Tensor, skip_special_tokens: bool = True
) -> list[str]:
    """Text of the real tokens of each row (special tokens removed unless asked)."""
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=skip_special_tokens) for row, m in zip(ids, mask)]
