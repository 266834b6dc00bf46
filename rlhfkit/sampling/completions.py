"""Completions to prompts: sampling (the lean loop, else ``model.generate``), truncation after the first terminator,
and chunks of prompts with their completions, as the trainers, the evaluation and the built-in task's builder use
them.

Shapes: B rows, Lp prompt tokens (left-padded), T completion tokens (right-padded), V vocabulary. Masks are bool,
True = a real token.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

from rlhfkit import ops
from rlhfkit.errors import LoopArgumentsRejected
from rlhfkit.perf import return_freed_heap
from rlhfkit.sampling.decoders import Generated, lean_generate
from rlhfkit.sampling.fallback import (
    announce_options,
    hf_generate,
    lean_loop_refusal,
    options_beyond_the_lean_loop,
    own_generate,
    remember_refusal,
)
from rlhfkit.sampling.padding import left_pad, model_pad_id
from rlhfkit.sampling.settings import sampling_config, stop_ids, terminator_ids


@torch.inference_mode()
def generate(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
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
    copied to each row (decoders.DynamicDecoder); False encodes every row (the reference the tests compare against).
    ``config.cache_implementation == "static"`` decodes over a StaticCache with a compiled one-token step
    (decoders.StaticDecoder) instead of the DynamicCache's eager steps; same tokens and log-probs.

    A model whose forward does not take the loop's arguments, a config with an active option the loop does not
    implement, or a model with a ``generate`` of its own (set on the object, as a test's patch does, or by its class)
    is generated with ``model.generate`` instead, with the same kind of outputs (fallback.py); the switch is
    announced once per model class or option.
    """
    options = options_beyond_the_lean_loop(config)
    reason = announce_options(options) if options else own_generate(model)
    if reason is None:
        reason = lean_loop_refusal(model)
        if reason is None:
            try:
                generated = lean_generate(model, prompt_ids, prompt_mask, config, share_prefixes)
                if prompt_ids.device.type == "cpu":
                    return_freed_heap()
                return generated
            except LoopArgumentsRejected as e:
                reason = remember_refusal(model, str(e))
    if not callable(getattr(model, "generate", None)):
        raise TypeError(f"{type(model).__name__} cannot use the lean decoding loop ({reason}) and has no generate().")
    return hf_generate(model, prompt_ids, prompt_mask, config)


class Completions(NamedTuple):
    """Sampled completions, truncated after their first terminator token (a Chunk's completion fields)."""

    ids: torch.Tensor  # (B, T) long, pad_token_id after the end
    mask: torch.Tensor  # (B, T) bool, True up to and including the terminator
    terminated: torch.Tensor  # (B,) bool, True if the completion ends with a terminator (EOS or the stop token)


def truncate_completions(raw: torch.Tensor, stop_ids: list[int], pad_token_id: int) -> Completions:
    """Cut each completion after its first terminator; everything after becomes padding."""
    ids = ops.truncate_after_stop_token(raw, stop_ids, pad_token_id)
    is_stop = torch.isin(raw, torch.tensor(stop_ids, device=raw.device))
    first_stop = ops.first_true_index(is_stop)  # T when there is none
    lengths = torch.where(first_stop < raw.shape[1], first_stop + 1, torch.full_like(first_stop, raw.shape[1]))
    mask = ops.mask_from_lengths(lengths, raw.shape[1])
    return Completions(ids=ids.masked_fill(~mask, pad_token_id), mask=mask, terminated=first_stop < raw.shape[1])


class Chunk(NamedTuple):
    """The sampler's output: prompts of one generation chunk and their completions, truncated after the first
    terminator. The trainers' batches keep these names (completion_ids, completion_mask, sampling_logprobs)."""

    prompt_ids: torch.Tensor  # (B, Lp) long, left-padded
    prompt_mask: torch.Tensor  # (B, Lp) bool
    completion_ids: torch.Tensor  # (B, T) long, pad_token_id after the end
    completion_mask: torch.Tensor  # (B, T) bool, True up to and including the terminator
    terminated: torch.Tensor  # (B,) bool, True if the completion ends with a terminator (EOS or the stop token)
    # (B, T) the sampler's log-probs of the completion tokens, 0 outside the mask; None when greedy
    sampling_logprobs: torch.Tensor | None
    # (B, T) bool, multi-turn episodes only (agents/episodes.py): True on the tokens the policy sampled, False on
    # the tool results the chat template put between its turns (TRL's tool_mask); None: every token is the policy's
    tool_mask: torch.Tensor | None = None

    @property
    def model_mask(self) -> torch.Tensor:
        """(B, T) bool: the completion tokens the policy sampled (completion_mask without the tool results)."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask & self.tool_mask

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    def to(self, device: torch.device | str) -> Chunk:
        """The same chunk on `device` (the generation worker's chunks travel on the CPU)."""
        return Chunk(*(None if t is None else t.to(device) for t in self))

    def padded_to_multiple(self, multiple: int, pad_token_id: int) -> Chunk:
        """The chunk with its prompts padded on the left and its completions on the right to the next multiple of
        `multiple` tokens each (TRL's pad_to_multiple_of): more masked padding, the same tokens. sampling_logprobs
        are padded with 0, as outside the mask elsewhere."""

        def widen(t: torch.Tensor | None, value, left: bool = False) -> torch.Tensor | None:
            if t is None:
                return None
            extra = -t.shape[1] % multiple
            return nn.functional.pad(t, (extra, 0) if left else (0, extra), value=value)

        return Chunk(
            prompt_ids=widen(self.prompt_ids, pad_token_id, left=True),
            prompt_mask=widen(self.prompt_mask, False, left=True),
            completion_ids=widen(self.completion_ids, pad_token_id),
            completion_mask=widen(self.completion_mask, False),
            terminated=self.terminated,
            sampling_logprobs=widen(self.sampling_logprobs, 0.0),
            tool_mask=widen(self.tool_mask, True),
        )


def complete(
    model: nn.Module,
    prompt_token_ids: list[list[int]],
    config: GenerationConfig,
    batch_size: int,
    device: torch.device | str = "cpu",
) -> Iterator[Chunk]:
    """Generate completions to prompts (their token ids) with `config` in chunks of `batch_size`, truncated after
    their first terminator (the config's eos_token_id) and padded with its pad_token_id, or with 0 where the model
    cannot embed that id (padding.model_pad_id: TRL's ppo.py adds a [PAD] token beyond the embeddings): the chunks'
    ids are fed to forwards as they are (the trainers' log-probs, values and reward models), so every id in them is
    one the model can embed. Masks say which tokens are real, whatever the padding."""
    pad_token_id = model_pad_id(model, config.pad_token_id)
    if pad_token_id != config.pad_token_id:
        config = copy.copy(config)  # a shallow copy: the sampling settings stay shared, only the pad id differs
        config.pad_token_id = pad_token_id
    stops = stop_ids(config)
    for i in range(0, len(prompt_token_ids), batch_size):
        ids, mask = (t.to(device) for t in left_pad(prompt_token_ids[i : i + batch_size], pad_token_id))
        raw = generate(model, ids, mask, config)
        completions = truncate_completions(raw.tokens, stops, pad_token_id)
        logprobs = None if raw.sampling_logprobs is None else torch.where(completions.mask, raw.sampling_logprobs, 0.0)
        yield Chunk(ids, mask, *completions, logprobs)


def decode(
    tokenizer: PreTrainedTokenizerBase, ids: torch.Tensor, mask: torch.Tensor, skip_special_tokens: bool = True
) -> list[str]:
    """Text of the real tokens of each row (special tokens removed unless asked)."""
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=skip_special_tokens) for row, m in zip(ids, mask)]


class TextCompletions(NamedTuple):
    """One completion per prompt, in prompt order.

    texts: the completion up to (not including) its terminator, special tokens removed: what a checker or judge reads.
    terminated: True where a terminator came within max_new_tokens (False: the text was cut off).
    token_ids: the completion's token ids up to and including the terminator.
    """

    texts: list[str]
    terminated: list[bool]
    token_ids: list[list[int]]


@torch.inference_mode()
def complete_texts(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    max_new_tokens: int,
    temperature: float | None = None,
    seed: int = 0,
    batch_size: int = 64,
    on_chunk: Callable[[int], None] | None = None,
) -> TextCompletions:
    """Complete text prompts with `model` (in eval mode for the call): greedy when `temperature` is None, else pure
    sampling (top_k 0, top_p 1) at that temperature under ``torch.manual_seed(seed)`` in a forked RNG, so results
    repeat and the caller's RNG state is untouched. Prompts are tokenized without special tokens and left-padded, as
    the trainers do; every terminator id of the tokenizer and the model's generation config ends a completion.
    on_chunk: called with the number of completions of each chunk as it is done (a progress bar's advance)."""
    device = next(model.parameters()).device
    stops = terminator_ids(tokenizer, model)
    config = sampling_config(max_new_tokens, temperature, tokenizer.pad_token_id, stops)
    encoded = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    out = TextCompletions([], [], [])
    was_training = model.training
    model.eval()
    cuda_devices = [device.index if device.index is not None else 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(seed)
        for chunk in complete(model, encoded, config, batch_size, device):
            ids, mask, terminated = (t.cpu() for t in (chunk.completion_ids, chunk.completion_mask, chunk.terminated))
            text_mask = mask & ~torch.isin(ids, torch.tensor(stops))  # the terminator is not part of the text
            out.texts.extend(decode(tokenizer, ids, text_mask))
            out.terminated.extend(terminated.tolist())
            out.token_ids.extend(row[m].tolist() for row, m in zip(ids, mask))
            if on_chunk is not None:
                on_chunk(len(ids))
    model.train(was_training)
    return out
