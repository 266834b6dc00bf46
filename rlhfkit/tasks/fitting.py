"""Training helpers the built-in tasks' builders share (tasks/build.py, tasks/agent_build.py): seeding, the tiny
Llama's config, a short AdamW loop and torch's thread count during a build."""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_lambda(total: int, warmup: int) -> Callable[[int], float]:
    """Linear warmup, then linear decay to 10% of the peak."""
    return lambda step: min((step + 1) / warmup, 1.0 - 0.9 * max(0, step - warmup) / max(1, total - warmup))


def fit(model, name: str, steps: int, lr: float, batch: int, examples: int, seed: int, loss_of, log_every: int, log):
    """Train `model` for `steps` AdamW steps (a tenth of them linear warm-up, then linear decay to 10% of `lr`;
    gradients clipped to norm 1), each on `batch` example indices drawn with replacement from range(`examples`) by a
    generator seeded with `seed`. loss_of(indices) -> (loss, report): `report()` is logged every `log_every` steps
    and after the last. Leaves the model in eval mode."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps, max(1, steps // 10)))
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for step in range(steps):
        idx = torch.randint(examples, (batch,), generator=gen).tolist()
        loss, report = loss_of(idx)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % log_every == 0 or step == steps - 1:
            log(f"  {name} step {step + 1}/{steps} {report()}")
    model.eval()


def model_config(tokenizer, preset, max_positions: int, **extra):
    """A tied-embedding LlamaConfig of `preset`'s sizes (hidden_size, intermediate_size, num_layers, num_heads) for
    `tokenizer`'s vocabulary, without BOS."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **extra,
    )


@contextmanager
def torch_threads(n: int | None):
    """Run with `n` torch intra-op threads, restoring the previous setting afterwards."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
