"""The forward passes that read log-probs, entropies, values and scores from the models: the completion positions
only (``logits_to_keep``), the LM head run in chunks of positions (completion_token_stats) and padding-free batches."""

from __future__ import annotations

import functools
import inspect
import sys
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from rlhfkit import ops
from rlhfkit.errors import ConfigError
from rlhfkit.models.adapters import is_peft_model
from rlhfkit.models.loading import _score_head


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


def completion_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int
) -> torch.Tensor:
    """(B, T, V) logits at the T = L - prompt_width positions that predict the completion tokens (prompt_width - 1 to
    L - 2), the only ones the losses read.

    The LM head runs on those positions only (transformers' ``logits_to_keep``, as TRL's GRPO does) where the
    model's forward takes it, else on every position and the rest is cut. With a large vocabulary the prompt's
    logits are a large share of a forward's memory (Qwen2's 152k: 0.6 MB per position in fp32) and of its LM-head
    arithmetic."""
    keep = input_ids.shape[1] - prompt_width + 1
    if not takes_logits_to_keep(model):
        return policy_logits(model, input_ids, attention_mask)[:, prompt_width - 1 : -1]
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
    aux_loss: torch.Tensor | None = None  # a mixture of experts' load-balancing loss of this forward, when asked


def completion_token_stats(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_width: int,
    completion_ids: torch.Tensor,
    temperature: float,
    entropy: bool = False,
    entropy_grad: bool = False,
    padding_free: bool = False,
    router_aux: bool = False,
) -> TokenStats:
    """Log-probs (and entropies) of the completion tokens `completion_ids` (B, T) of sequences `input_ids` (B, L) whose
    first `prompt_width` positions are the prompt: what completion_logits then ops.logprobs_from_logits and
    ops.entropy_from_logits give, without the (B, T, V) logits.

    The model's own forward runs with its LM head standing in for the statistics: the head receives the last hidden
    states and returns the (B, T, 1 or 2) statistics, computed in chunks of positions (recomputed in the backward),
    so at a 152k vocabulary one chunk's logits exist instead of the batch's, in the forward and in the gradient: a
    plain linear head through ops.logprobs_from_linear (its weight gradient in one buffer), any other head through
    ops.logprobs_from_hidden (checkpointed chunks of the head's own forward). Running inside the model's forward keeps what the forward does around its head: DeepSpeed ZeRO-3
    and FSDP2 have the head's weight gathered, a LoRA adapter on the head and cast_lm_head_to_fp32 apply, and the
    logits_to_keep cut still saves the prompt's positions.

    A forward that changes the head's output before returning it (a logit scale or soft-capping: Cohere, Granite,
    Gemma 2) or a torch.compile'd model is computed the plain way instead, said once per model class (the plain
    way is what rlhfkit did before: the numbers are the same, the memory is not; that way the batch stays padded).
    entropy_grad: the entropy keeps its gradient (GRPO's entropy bonus), else it is detached. padding_free: the
    forward runs on the batch's real tokens packed into one row (_packed_forward; padding_free_refused says where it
    cannot); the statistics are the same. router_aux: a mixture-of-experts model also returns its router's
    load-balancing loss (transformers' output_router_logits, ``aux_loss``: how unevenly the tokens went to the
    experts), with its gradient; only in the chunked head's forward (every MoE family of transformers takes it).
    """
    reason = _chunked_head_refused(model)
    if reason is None:
        request = (input_ids, attention_mask, prompt_width, completion_ids, temperature, entropy, entropy_grad,
                   router_aux)  # fmt: skip
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
    logits = completion_logits(model, input_ids, attention_mask, prompt_width)
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
    """One forward completion_token_stats asks of a model: its inputs, the tokens to score, and how the LM head's
    input lines up with them and the result with the caller's (B, T)."""

    inputs: dict  # the model's keyword arguments
    tokens: torch.Tensor  # (B', T') the tokens scored
    select: Callable[[torch.Tensor], torch.Tensor]  # the head's input (B', X, H) -> (B', T', H), aligned with tokens
    unpack: Callable[[torch.Tensor], torch.Tensor]  # the statistics (B', T', k) -> (B, T, k)


def _padded_forward(model, input_ids, attention_mask, prompt_width, completion_ids) -> _Forward:
    """The batch as it is: (B, L) rows, left-padded prompts, right-padded completions, an attention mask."""
    width = completion_ids.shape[1]
    inputs = dict(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    )
    if takes_logits_to_keep(model):
        inputs["logits_to_keep"] = input_ids.shape[1] - prompt_width + 1
    # The head gets the kept positions (or all of them); the last predicts nothing.
    return _Forward(inputs, completion_ids, lambda h: h[:, h.shape[1] - width - 1 : h.shape[1] - 1], lambda s: s)


def _packed_forward(model, input_ids, attention_mask, prompt_width, completion_ids) -> _Forward:
    """The batch padding-free (TRL's padding_free): every row's real tokens one after another in a single row,
    position ids restarting at 0 for each sequence and no attention mask, which transformers' attention reads as
    separate sequences (flash attention's variable-length kernels; a block-diagonal mask for sdpa, eager and flex).
    The head runs on the positions that predict a real completion token only; the others score 0."""
    real = attention_mask.bool()
    packed_index = (real.flatten().cumsum(0) - 1).view(real.shape)  # (b, column) -> its index in the packed row
    scored = real[:, prompt_width:]  # the real completion tokens
    predicting = packed_index[:, prompt_width - 1 : -1][scored]  # the packed positions whose next token they are
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
    model, input_ids, attention_mask, prompt_width, completion_ids, temperature, entropy, entropy_grad, router_aux,
    padding_free,
) -> TokenStats | None:  # fmt: skip
    """One forward of `model` whose LM head returns the token statistics (completion_token_stats): they, or None where
    the forward changed the head's output (what it returns as logits is not what the head returned)."""
    plan = (_packed_forward if padding_free else _padded_forward)(
        model, input_ids, attention_mask, prompt_width, completion_ids
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
    router = {"output_router_logits": True} if router_aux else {}
    try:
        output = model(**plan.inputs, use_cache=False, **router)
        out, aux_loss = output.logits, getattr(output, "aux_loss", None) if router_aux else None
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
        return TokenStats(logprobs, None, aux_loss)
    return TokenStats(logprobs, out[..., 1].clone() if entropy_grad else out[..., 1].detach().clone(), aux_loss)


def takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether the forward of `model` (inside DDP, DeepSpeed, peft or torch.compile wrappers) lists transformers'
    ``logits_to_keep``; remote code and older architectures may not."""
    return _forward_lists_logits_to_keep(type(_unwrapped(model)))


@functools.cache
def _forward_lists_logits_to_keep(cls: type) -> bool:
    """Read once per model class: completion_logits asks on every micro-batch."""
    try:
        return "logits_to_keep" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False
