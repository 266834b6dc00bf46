"""A tiny local chat model that can call tools, for the agent tests: a character-level tokenizer over printable ASCII
with Qwen-style special tokens, a chat template that renders tools, tool calls and tool results, and a
response_template that transformers' tokenizer.parse_response reads tool calls with; a random 2-layer Llama.

Also a scripted sampler (`scripted_generate`): the model's turns chosen by the conversation, for tests that need a
given tool call to appear; the training forwards stay the real model's."""

from __future__ import annotations

import asyncio
import json
import re

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from rlhfkit.agents.episodes import ToolEpisodes
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


class ScriptedEpisodes(ToolEpisodes):
    """ToolEpisodes whose turns are `episode_script`'s, for the asynchronous agent tests: a class of an importable
    module, so the generation worker (another process, which a monkeypatched sampler never reaches) unpickles the
    trainer's episodes as this very class and runs the same script. `use_script(trainer)` swaps it in."""

    def turns(self, model, contexts, budgets, config, device):
        tok, ids = self.tokenizer, []
        for context, budget in zip(contexts, budgets):
            text = tok.decode(context, skip_special_tokens=False)
            ids.append(tok(episode_script(text), add_special_tokens=False)["input_ids"][:budget])
        return ids, [[0.0] * len(row) for row in ids]  # stand-in sampler log-probs (PPO's batch keeps them)


def episode_script(text: str) -> str:
    """A turn drawn with torch's generator (the sampler's RNG, which max_staleness 0 hands to the worker and back): an
    environment's prompt ("Increment the counter by N.") gets increment(N), increment(1) or no call; any other prompt
    multiply(3, 4), a tool that does not exist, or an answer. After a tool result: the answer."""
    if "<tool_response>" in text:
        return f"Done.{END}"
    choice = int(torch.randint(3, ()))
    target = re.search(r"Increment the counter by (\d)", text)
    if target is not None:
        return [call_text("increment", {"step": int(target.group(1))}), call_text("increment", {"step": 1}),
                f"No.{END}"][choice]  # fmt: skip
    return [call_text("multiply", {"a": 3, "b": 4}), call_text("divide", {"a": 1}), f"12{END}"][choice]


def use_script(trainer):
    """The trainer's episodes (and the generation worker's copy of them) sample with episode_script."""
    trainer.episodes.__class__ = ScriptedEpisodes
    return trainer
