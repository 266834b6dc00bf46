"""Character-level chat tokenizer for the built-in agent task: Qwen's chat layout, compact, with a chat template that
renders tools, assistant tool calls and tool results, and the ``response_template`` transformers'
``tokenizer.parse_response`` reads tool calls with (what rlhfkit's multi-turn episodes parse turns with, as TRL 1.16's).

A conversation with one tool call, as the template renders it (one token per character except the special tokens,
the tool tags and the call's fixed JSON; ``\\n`` is a newline):

    <|im_start|>system\\nTools: calculator(expression)<|im_end|>\\n
    <|im_start|>user\\n1234*567<|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>{"name": "calculator", "arguments": {"expression": "1234*567"}}</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>699678</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n699678<|im_end|>\\n

The template is prefix-preserving (a conversation's earlier messages render alike whatever follows), which the
episodes need: a turn's tool results are the rendering's difference, appended to the token ids the policy sampled.
"""

from __future__ import annotations

import string

from transformers import PreTrainedTokenizerFast

from .tokenizer import char_tokenizer

PAD, START, END = "<pad>", "<|im_start|>", "<|im_end|>"
# Printable ASCII and newline, one token each (no tab, carriage return or form feeds).
PRINTABLE = "".join(sorted(set(string.printable) - set("\t\r\x0b\x0c")))
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
# A call's fixed JSON around its argument, one token each side, as a BPE tokenizer would merge such frequent text:
# the tiny model then spends its few parameters on the numbers, not on spelling JSON, and an episode is ~50 tokens
# shorter. Any other call (other tools, other arguments) is spelled character by character and parses the same.
CALL_OPEN = '{"name": "calculator", "arguments": {"expression": "'
CALL_CLOSE = '"}}'
# The template's fixed words are single tokens too (a conversation is mostly template): episodes half as long.
TEMPLATE_WORDS = ("system", "user", "assistant", "Tools:", "calculator", "expression")
WORD_TOKENS = (TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END, CALL_OPEN, CALL_CLOSE, *TEMPLATE_WORDS)

# Tools as name(argument names) in a system turn; a call as JSON between <tool_call> tags after the turn's text (the
# argument values through tojson, so any tool's call renders); each tool result in a user turn between
# <tool_response> tags; every turn ends with <|im_end|> (the EOS, where the policy's turn stops) and a newline.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:"
    "{% for t in tools %} {{ t.function.name }}({{ t.function.parameters.properties | list | join(',') }})"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} "
    "| tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# transformers' response parsing spec for that template: the turn's text up to its end, the calls as JSON objects.
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": TOOL_CALL,
            "close": TOOL_CALL_END,
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def build_chat_tokenizer(model_max_length: int = 256) -> PreTrainedTokenizerFast:
    """One token per printable ASCII character or newline (anything else is <pad>'s id, never produced by the task);
    <pad>, <|im_start|> and <|im_end|> (the EOS) special; the tool tags and the call's JSON whole tokens, kept in
    decoded text as Qwen's tool tags are. No BOS; left padding, as generation needs."""
    tokenizer = char_tokenizer((PAD, START, END), WORD_TOKENS, PRINTABLE, PAD, END, model_max_length)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer
