"""The next token from a forward's logits, as transformers' generate picks it: the repetition penalty, temperature,
top_k, top_p and min_p, in transformers' order and with its arithmetic (tests compare them with transformers' own
processors). Pure functions of tensors; B rows, V vocabulary.
"""

from __future__ import annotations

import functools

import torch
from transformers import GenerationConfig

from rlhfkit.sampling.settings import has_repetition_penalty, temperature_of


def tokens_seen(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(B, V + 1) bool: the tokens of each prompt a repetition penalty applies to, as transformers' generate counts
    them; column V gathers ids beyond the output vocabulary (never generated, so never penalised) and the prompt's
    left padding where the installed transformers leaves it out. Slice off the last column to use it."""
    ids = prompt_ids
    if repetition_penalty_skips_left_padding():
        padding = (prompt_mask != 0).int().argmax(dim=1)  # leading pad tokens per row, as generate computes them
        positions = torch.arange(ids.shape[1], device=ids.device)
        ids = ids.masked_fill(positions[None, :] < padding[:, None], vocab_size)
    seen = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.bool, device=ids.device)
    return seen.scatter_(1, ids.clamp(max=vocab_size), True)


def mark_seen(seen: torch.Tensor, token: torch.Tensor) -> None:
    """Add one token per row to a mask from `tokens_seen`, in place."""
    seen.scatter_(1, token[:, None].clamp(max=seen.shape[1] - 1), True)


@functools.cache
def repetition_penalty_skips_left_padding() -> bool:
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


def processed_logits(logits: torch.Tensor, config: GenerationConfig, seen: torch.Tensor | None = None) -> torch.Tensor:
    """The (B, V) float32 scores generate picks the next token from, given the raw logits, in the order of
    transformers' ``GenerationMixin._get_logits_processor``: the repetition penalty (every token marked in `seen`,
    (B, V) bool: divide its positive logit by the penalty, multiply a negative one), then, when sampling,
    temperature, top_k, top_p and min_p, the tokens they drop at -inf. Greedy picks the argmax of these scores,
    sampling draws from their softmax."""
    z = logits.float()
    if seen is not None and has_repetition_penalty(config):
        z = penalised(z, seen, config.repetition_penalty)
    if not config.do_sample:
        return z
    return warped(z / temperature_of(config), config)


def penalised(z: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    return torch.where(seen, torch.where(z < 0, z * penalty, z / penalty), z)


def warped(z: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
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


def pick(
    logits: torch.Tensor, config: GenerationConfig, seen: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next token per row from (B, V) raw logits: argmax, or a sample from the softmax of `processed_logits`
    (repetition penalty on the tokens in `seen`, temperature, top_k / top_p / min_p restrictions); and the sampled
    token's log-prob under the unpenalised, unrestricted softmax(logits / temperature) (None when greedy)."""
    if not config.do_sample:
        scores = logits if seen is None else processed_logits(logits, config, seen)
        return scores.argmax(dim=-1), None
    full = logits.float() / temperature_of(config)
    z = full
    if seen is not None and has_repetition_penalty(config):
        z = penalised(logits.float(), seen, config.repetition_penalty) / temperature_of(config)
    token = torch.multinomial(torch.softmax(warped(z, config), dim=-1), 1).squeeze(-1)
    logprob = full.gather(-1, token[:, None]).squeeze(-1) - torch.logsumexp(full, dim=-1)
    return token, logprob
