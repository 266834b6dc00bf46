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
