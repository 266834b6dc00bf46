"""What the tests of rlhfkit/models/ share: a DDP-like wrapper and the built-in task's tiny Llama in bf16."""

import torch
from torch import nn
from transformers import AutoModelForCausalLM


class Wrapper(nn.Module):
    """Like DDP or a DeepSpeed engine: forward(*args, **kwargs) into .module."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def bf16_model(tiny_assets, tied: bool):
    """The built-in task's tiny Llama (tied embeddings) in bf16, or an untied copy of it."""
    model = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft", dtype=torch.bfloat16).eval()
    if tied:
        return model
    config = model.config
    config.tie_word_embeddings = False
    untied = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    untied.load_state_dict(model.state_dict(), strict=False)
    untied.lm_head.weight.data.normal_(generator=torch.Generator().manual_seed(0))  # its own weights
    return untied
