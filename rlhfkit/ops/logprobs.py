"""Token log-probabilities and entropies from logits, without materialising extra (B, T, V) tensors.

Both functions walk the batch in chunks of rows whose temporaries (the temperature-scaled logits, the softmax)
hold at most CHUNK_ELEMENTS numbers: with V ~ 50k that is one sequence at a time, the difference between
megabytes and gigabytes (TRL's `selective_log_softmax` walks rows too); with a small vocabulary a chunk is the
whole batch, which saves a Python-level loop over rows (and its autograd nodes) on every micro-batch.
Half-precision logits are upcast one chunk at a time and the result is float32: PPO takes exp(new - old) of these
numbers, and bfloat16's 8-bit mantissa would turn a log-prob of -20 into -20 +- 0.06, i.e. a ratio off by 6%
before any learning happens.
"""

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types, else the dtype unchanged (float32 and float64 stay as they are)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


CHUNK_ELEMENTS = 1 << 22  # 4M numbers: 16 MB of float32 temporaries per chunk


def _row_chunks(logits: Tensor):
    """Slices of the batch dimension of (B, T, V) logits holding at most CHUNK_ELEMENTS elements (at least 1 row)."""
    per_row = max(1, logits.shape[1] * logits.shape[2])
    step = max(1, CHUNK_ELEMENTS // per_row)
    return [slice(i, i + step) for i in range(0, logits.shape[0], step)]


def _scaled(row_logits: Tensor, temperature: float) -> Tensor:
    """Logits of a chunk of rows in the compute dtype, divided by the sampling temperature (no copy when neither
    applies)."""
    z = row_logits.to(_compute_dtype(row_logits.dtype))
    return z if temperature == 1.0 else z / temperature


def logprobs_from_logits(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature) at the given tokens.

    logits: (B, T, V) float, the logits that predict position t (already shifted by the caller).
    tokens: (B, T) long, the tokens whose log-probs are wanted. temperature: > 0, the sampling temperature, so
    the log-probs are those of the distribution the tokens were actually sampled from.
    Returns (B, T) in the logits' dtype (float32 for float16/bfloat16 logits). Differentiable.
    Precision: the absolute error is about one ulp of max |logits / temperature| (e.g. 6e-6 at 100 in float32),
    the price of not keeping a (T, V) log_softmax output; negligible for language-model logits.
    """
    _check_temperature(temperature)
    rows = []
    for chunk in _row_chunks(logits):
        z = _scaled(logits[chunk], temperature)
        # log p(token) = z[token] - logsumexp(z): unlike log_softmax this creates no new (T, V) output to keep
        # for backward (logsumexp keeps its input, which at temperature 1 is the caller's logits themselves).
        rows.append(z.gather(-1, tokens[chunk].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1))
    if not rows:  # B == 0
        return logits.new_zeros(tokens.shape, dtype=_compute_dtype(logits.dtype))
    return torch.cat(rows)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Exact entropy (nats) of the categorical distribution softmax(logits / temperature) at every position.

    logits: (B, T, V) float. temperature: > 0. Returns (B, T) in the logits' dtype (float32 for half types),
    always >= 0. Computed as logsumexp(z) - sum(softmax(z) * z), with z shifted so that max(z) = 0. Differentiable
    (GRPO's entropy bonus backpropagates through it).
    Logits of -inf (banned tokens) are allowed; a position whose logits are all -inf has no distribution (NaN).
    """
    _check_temperature(temperature)
    rows = []
    for chunk in _row_chunks(logits):
        z = _scaled(logits[chunk], temperature)
        # Entropy is shift-invariant. With max(z) = 0 both terms are O(log V) instead of O(|logits|), so they
        # do not cancel catastrophically for logits like 1e4, and both are >= 0, so the entropy is too. The shift
        # is detached: the entropy does not depend on it, so its exact gradient is 0 (autograd would route rounding
        # noise to the largest logit).
        z = z - z.amax(dim=-1, keepdim=True).detach()
        # A -inf logit has p = 0; make it finite so p * z is 0 rather than 0 * -inf = NaN.
        z = z.clamp(min=torch.finfo(z.dtype).min)
        rows.append(torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1))
    if not rows:  # B == 0
        return logits.new_zeros(logits.shape[:-1], dtype=_compute_dtype(logits.dtype))
    return torch.cat(rows)


HIDDEN_CHUNK_ELEMENTS = 1 << 24  # logits per chunk of positions: 64 MB of float32 (110 positions at Qwen's 151,936)


def positions_per_chunk(vocab_size: int) -> int:
    """How many positions logprobs_from_hidden sends through the LM head at once: HIDDEN_CHUNK_ELEMENTS logits, at
    least 1 position."""
    return max(1, HIDDEN_CHUNK_ELEMENTS // max(1, vocab_size))


def logprobs_from_hidden(
    hidden: Tensor,
    head: Callable[[Tensor], Tensor],
    tokens: Tensor,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
    vocab_size: int = 1,
) -> tuple[Tensor, Tensor | None]:
    """logprobs_from_logits and entropy_from_logits of head(hidden), without a (B, T, V) logits tensor ever existing.

    hidden: (B, T, H), the last hidden states at the positions that predict `tokens` (B, T) long. head: the LM head,
    hidden (N, H) -> logits (N, V). The head runs on positions_per_chunk(vocab_size) positions at a time; with grad
    enabled each chunk is checkpointed (torch.utils.checkpoint, non-reentrant): its logits are dropped after the
    forward and recomputed in the backward, so forward and backward hold one chunk's logits and their gradient, not
    the batch's. The cost is one more LM-head product per position (the recompute).
    entropy: also return the (B, T) entropy; entropy_grad: with its gradient (GRPO's entropy bonus), else detached.
    Returns (logprobs, entropy or None), equal to the two functions on head(hidden) up to float32 rounding of the
    chunked matmul.
    """
    _check_temperature(temperature)
    batch, width = tokens.shape
    flat_hidden, flat_tokens = hidden.reshape(batch * width, hidden.shape[-1]), tokens.reshape(batch * width)

    def chunk_stats(h: Tensor, t: Tensor) -> Tensor:
        logits = head(h).unsqueeze(0)
        logprobs = logprobs_from_logits(logits, t.unsqueeze(0), temperature)[0]
        if not entropy:
            return logprobs.unsqueeze(-1)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            h_ = entropy_from_logits(logits if entropy_grad else logits.detach(), temperature)[0]
        return torch.stack([logprobs, h_], -1)

    step, parts = positions_per_chunk(vocab_size), []
    for i in range(0, batch * width, step):
        h, t = flat_hidden[i : i + step], flat_tokens[i : i + step]
        if torch.is_grad_enabled():  # RNG state kept: a LoRA adapter's dropout on the head recomputes the same
            parts.append(checkpoint(chunk_stats, h, t, use_reentrant=False))
        else:
            parts.append(chunk_stats(h, t))
    if not parts:  # no positions
        stats = hidden.new_zeros(batch, width, 2 if entropy else 1, dtype=_compute_dtype(hidden.dtype))
    else:
        stats = torch.cat(parts).reshape(batch, width, -1)
    if not entropy:
        return stats[..., 0], None
    return stats[..., 0], stats[..., 1] if entropy_grad else stats[..., 1].detach()


def logprobs_from_linear(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    tokens: Tensor,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
    float32_head: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """logprobs_from_hidden for a plain linear LM head, logits = hidden @ weight.T + bias, with the gradients
    written by hand: the backward recomputes each chunk's logits and adds the chunk's weight gradient into ONE
    buffer (addmm_), where autograd through checkpointed chunks would allocate each chunk's full [V, H] weight
    gradient before adding it (two [V, H] buffers at once: 0.54 GB each for Qwen2.5-0.5B's tied embedding).

    hidden: (B, T, H); weight: (V, H); bias: (V,) or None; tokens: (B, T). The logits are computed as the head
    computes them: under the caller's autocast (the same in the backward's recomputation), or in float32 outside
    it with float32_head (cast_lm_head_to_fp32). The weight gradient accumulates in float32 (float64 for a float64
    weight) and is returned in the weight's dtype. Returns (logprobs, entropy or None) as logprobs_from_hidden.
    """
    _check_temperature(temperature)
    batch, width = tokens.shape
    flat_hidden, flat_tokens = hidden.reshape(batch * width, hidden.shape[-1]), tokens.reshape(batch * width)
    logprobs, entropies = _LinearHeadStats.apply(
        flat_hidden, weight, bias, flat_tokens, temperature, entropy, entropy_grad, float32_head
    )
    logprobs = logprobs.reshape(batch, width)
    if not entropy:
        return logprobs, None
    entropies = entropies.reshape(batch, width)
    return logprobs, entropies if entropy_grad else entropies.detach()


def _head_logits(h: Tensor, weight: Tensor, bias: Tensor | None, float32_head: bool) -> Tensor:
    if not float32_head:
        return torch.nn.functional.linear(h, weight, bias)
    with torch.autocast(h.device.type, enabled=False):
        return torch.nn.functional.linear(h.float(), weight.float(), None if bias is None else bias.float())


class _LinearHeadStats(torch.autograd.Function):
    """The chunked linear head of logprobs_from_linear: forward and backward over chunks of positions."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, entropy, entropy_grad, float32_head):
        device = hidden.device.type
        ctx.autocast = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        ctx.options = (temperature, entropy_grad and entropy, float32_head)
        ctx.save_for_backward(hidden, weight, bias, tokens)
        step = positions_per_chunk(weight.shape[0])
        logprobs, entropies = [], []
        for i in range(0, hidden.shape[0], step):
            logits = _head_logits(hidden[i : i + step], weight, bias, float32_head).unsqueeze(0)
            logprobs.append(logprobs_from_logits(logits, tokens[i : i + step].unsqueeze(0), temperature)[0])
            if entropy:
                entropies.append(entropy_from_logits(logits, temperature)[0])
        dtype = _compute_dtype(torch.promote_types(hidden.dtype, weight.dtype))
        if float32_head:
            dtype = torch.promote_types(dtype, torch.float32)
        empty = hidden.new_zeros(0, dtype=dtype)
        return (torch.cat(logprobs) if logprobs else empty), (torch.cat(entropies) if entropies else empty)

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, tokens = ctx.saved_tensors
        temperature, entropy_grad, float32_head = ctx.options
        enabled, autocast_dtype = ctx.autocast
        accumulate = torch.float64 if weight.dtype == torch.float64 else torch.float32
        grad_weight = torch.zeros(weight.shape, dtype=accumulate, device=weight.device)
        grad_bias = None if bias is None else torch.zeros(bias.shape, dtype=accumulate, device=bias.device)
        grad_hidden = torch.empty_like(hidden)
        weight_for_grad = None  # the weight in the dtype the logits were computed in, cast once
        step = positions_per_chunk(weight.shape[0])
        for i in range(0, hidden.shape[0], step):
            rows = slice(i, i + step)
            h = hidden[rows]
            with torch.autocast(hidden.device.type, dtype=autocast_dtype, enabled=enabled):
                logits = _head_logits(h, weight, bias, float32_head)
            if weight_for_grad is None:
                weight_for_grad = weight.to(logits.dtype)
            z = logits.to(_compute_dtype(logits.dtype))
            if temperature != 1.0:
                z = z / temperature
            p = torch.softmax(z, dim=-1)
            # d logp[token] / dz = onehot(token) - p;  d entropy / dz = -p * (z - E_p[z])
            grad_z = torch.zeros_like(z)
            if grad_logprobs is not None:
                g = grad_logprobs[rows].to(z.dtype)[:, None]
                grad_z.scatter_add_(1, tokens[rows][:, None], g)
                grad_z.sub_(p * g)
            if entropy_grad and grad_entropy is not None:
                mean_z = (p * z).sum(-1, keepdim=True)
                grad_z.sub_(z.sub_(mean_z).mul_(p).mul_(grad_entropy[rows].to(z.dtype)[:, None]))
            if temperature != 1.0:
                grad_z.div_(temperature)
            grad_hidden[rows] = (grad_z.to(logits.dtype) @ weight_for_grad).to(hidden.dtype)
            grad_weight.addmm_(grad_z.T.to(accumulate), h.to(accumulate))
            if grad_bias is not None:
                grad_bias.add_(grad_z.sum(0).to(accumulate))
        return (
            grad_hidden,
            grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None, None, None, None, None,
        )  # fmt: skip
