"""A tiny local chat model that can call tools, for the agent tests: a character-level tokenizer over printable ASCII
with Qwen-style special tokens, a chat template that renders tools, tool calls and tool results, and a
response_template that transformers' tokenizer.parse_response reads tool calls with; a random 2-layer Llama.

Also a scripted sampler (`scripted_generate`): the model's turns chosen by the conversation, for tests that need a
given tool call to appear; the training forwards stay the real model's."""

from __future__ import annotations

import asyncio
import json

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from rlhfkit.sampling.decoders import Generated
from rlhfkit.tasks.chat_tokenizer import PRINTABLE
from rlhfkit.tasks.tokenizer import char_tokenizer

PAD, START, END = "<pad>", "<|im_start|>", "<|im_end|>"
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Qwen's layout, compact (one character is one token): the tools as name(arguments) in a system turn, a call as JSON
# between <tool_call> tags after the turn's text, each tool result in a user turn between <tool_response> tags.
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:"
    "{%- for t in tools %} {{ t.function.name }}({{ t.function.parameters.properties | list | join(',') }})"
    "{%- endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} "
    "| tojson }}</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# transformers' response parsing spec for that template: the text up to the end-of-turn, the calls as JSON.
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def tool_chat_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character or newline; <pad>, <|im_start|>, <|im_end|> (the EOS) special; the
    tool tags whole tokens, kept in decoded text as Qwen's are."""
    tokenizer = char_tokenizer((PAD, START, END), TOOL_TOKENS, PRINTABLE, PAD, END, model_max_length=1024)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


def tool_chat_model(tokenizer, seed: int = 0, dtype=torch.float32) -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def call_text(name: str, arguments) -> str:
    """A model turn that calls `name` with `arguments` (anything JSON can hold, or raw text), in the template's
    form."""
    import json

    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>{END}'


def scripted_generate(tokenizer, script):
    """A stand-in for rlhfkit.sampling.completions.generate whose turns are `script(conversation_text)`'s (the text
    of the prompt so far, special tokens kept), greedy (no sampler log-probs), cut at max_new_tokens."""

    def generate(model, prompt_ids, prompt_mask, config, **_):
        rows = []
        for ids, mask in zip(prompt_ids, prompt_mask):
            text = tokenizer.decode(ids[mask].tolist(), skip_special_tokens=False)
            rows.append(tokenizer(script(text), add_special_tokens=False)["input_ids"][: config.max_new_tokens])
        width = max(len(r) for r in rows)
        tokens = torch.full((len(rows), width), config.pad_token_id, dtype=torch.long)
        for r, row in enumerate(rows):
            tokens[r, : len(row)] = torch.tensor(row)
        return Generated(tokens.to(prompt_ids.device), None)

    return generate


# TRL 1.16's documented example tools (tools=[multiply, async_add]) and a reader of metrics.jsonl, for the agent tests.
def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_add(a: int, b: int) -> int:
    """
    Asynchronously adds two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of the two integers.
    """
    await asyncio.sleep(0.01)
    return a + b


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]
