"""Tool-call formats rlhfkit recognises in a chat template, as transformers' response templates.

transformers parses a model's turn with the tokenizer's ``response_template`` (``tokenizer.parse_response``), a spec
of where each field of the message starts and ends. Checkpoints that ship one work as they are; many do not. For the
format below, recognised from the chat template itself, rlhfkit supplies the spec, so a TRL script with tools runs
unchanged (TRL's trainer fills the same gap from its own table; rlhfkit never imports TRL):

* **ChatML with Hermes-style calls** (Qwen2.5, Qwen3 and their fine-tunes): turns open with
  ``<|im_start|>assistant`` and end with ``<|im_end|>``; each call is a JSON object ``{"name": ..., "arguments":
  {...}}`` between ``<tool_call>`` and ``</tool_call>``; an optional ``<think>...</think>`` block holds the reasoning.

Any other template keeps the refusal that names the fix (episodes.ToolEpisodes).
"""

from __future__ import annotations

import copy

CHATML_HERMES: dict = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"},
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",  # {"name": ..., "arguments": {...}}, the function of an OpenAI-style call
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def recognised_response_template(chat_template: str | None) -> dict | None:
    """The response template of `chat_template`'s tool-call format, if it is one rlhfkit recognises (a copy the
    caller may keep), else None. ChatML with Hermes-style calls: the template opens turns with ``<|im_start|>``
    and writes each call as JSON with "name" and "arguments" between ``<tool_call>`` tags (not the XML
    ``<function=...>`` calls of Qwen3.5 or Nemotron 3, which share the tags)."""
    if not isinstance(chat_template, str):
        return None
    chatml = "<|im_start|>" in chat_template and "<|im_end|>" in chat_template
    hermes = "<tool_call>" in chat_template and '"arguments": ' in chat_template and "<function=" not in chat_template
    return copy.deepcopy(CHATML_HERMES) if chatml and hermes else None
