"""Build the built-in agent task's assets offline (tasks/agent.py): the chat tokenizer (tasks/chat_tokenizer.py), an
SFT model that has learned the tool-call format and to answer from a tool's result, the conversational prompts and
task.json (the layout is tasks/layout.py's; no reward model: the task's rewards are rules, for PPO as for GRPO).

The supervised warm start leaves reinforcement learning room on purpose. Its demonstrations call the calculator on
most of the largest products (a 4-digit times a 3-digit number, `tool_share_longest`) and on a few of the others
(`tool_share_other`); the rest answer from memory, with the right product, which a model this small mostly gets wrong.
So the SFT model calls the tool where its demonstrations mostly did, answers the other prompts directly and mostly
wrongly, and samples a call there now and then: the exploration from which RL learns to call the tool everywhere. How
to call and how to read a result are taught on every prompt (a prompt answered directly also gets a tool conversation
whose first token, the decision to call, is not trained). Taught by the demonstrations' share alone, the call was
learned too late: after 250 steps most calls miscopied the expression (44% of greedy episodes called the tool, 2.7%
answered right), and RL would have had to learn copying as well as calling.

SFT loss: cross-entropy on the assistant turns' tokens only (each turn through its end-of-turn token), not on the
prompt, the tool results or the headers the template puts around them, as the RL trainers mask tool results.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from rlhfkit.data import progress_bars_hidden
from rlhfkit.sampling import complete_texts, right_pad

from .agent import TASK, calculator
from .chat_tokenizer import CALL_CLOSE, CALL_OPEN, TOOL_CALL, TOOL_CALL_END, build_chat_tokenizer
from .fitting import fit, model_config, seed_everything
from .layout import Assets, ensure_replaceable, install
from .presets import BuildPreset


@dataclass(frozen=True)
class AgentPreset(BuildPreset):
    """A BuildPreset (sizes, step budgets) with the agent build's own SFT budget and the demonstrations' tool use. The
    agent task trains no reward model: the rm_* fields are unused."""

    sft_steps: int = 250  # reading a result (copying it) is learned between steps 150 and 200
    tool_share_longest: float = 0.8  # demonstrations that call the tool, of the 4-digit x 3-digit products
    tool_share_other: float = 0.15  # ... of the other products


AGENT_PRESETS: dict[str, AgentPreset] = {
    "default": AgentPreset(),
    "test": AgentPreset(
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        n_train_prompts=256,
        n_test_prompts=32,
        sft_steps=30,
        sft_batch=32,
        eval_prompts=32,
        num_threads=1,
    ),
}


def is_longest(prompt: str) -> bool:
    """Whether a user message multiplies a 4-digit by a 3-digit number (the products the demonstrations mostly
    compute with the calculator)."""
    a, _, b = prompt.partition("*")
    return len(a) == 4 and len(b) == 3


def conversation(prompt: str, use_tool: bool) -> list[dict]:
    """One demonstration: the user's question, then either a calculator call, its result (the real tool's) and the
    answer read from it, or the answer alone."""
    messages = [{"role": "user", "content": prompt}]
    if use_tool:
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": prompt}}}
        result = calculator(prompt)
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": result},
            {"role": "assistant", "content": result},
        ]
    else:
        messages.append({"role": "assistant", "content": TASK.answer(prompt)})
    return messages


def encode_conversation(
    tokenizer, messages: list[dict], tools: list, decide: bool = True
) -> tuple[list[int], list[bool]]:
    """(token ids of the rendered conversation with `tools`, True where the token is an assistant turn's: from the end
    of the assistant header the template renders before the turn through its end-of-turn token). decide=False leaves
    the first turn's first token untrained: the choice between calling the tool and answering (Demonstration)."""
    render = dict(tools=tools, tokenize=True, return_dict=False)
    ids = list(tokenizer.apply_chat_template(messages, **render))
    trained = [False] * len(ids)
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        head = list(tokenizer.apply_chat_template(messages[:k], add_generation_prompt=True, **render))
        if ids[: len(head)] != head:
            raise ValueError(
                "the chat template is not prefix-preserving: a conversation renders differently once it goes on"
            )
        end = ids.index(tokenizer.eos_token_id, len(head))
        trained[len(head) : end + 1] = [True] * (end + 1 - len(head))
    if not decide:
        trained[trained.index(True)] = False
    return ids, trained


class Demonstration(NamedTuple):
    """A conversation to train on; decide: whether its first token (call the tool, or answer) is trained too."""

    messages: list[dict]
    decide: bool


def sft_examples(prompts: list[str], cfg: AgentPreset, rng: random.Random) -> list[Demonstration]:
    """The demonstrations of `prompts`, each calling the tool with its class's share (module docstring). A prompt
    answered directly also gets a tool example whose first token (<tool_call>, the decision to call) is not trained:
    every prompt teaches how to call the tool and read its result, while when to call is taught by the share alone."""
    out = []
    for p in prompts:
        use_tool = rng.random() < (cfg.tool_share_longest if is_longest(p) else cfg.tool_share_other)
        out.append(Demonstration(conversation(p, use_tool), True))
        if not use_tool:
            out.append(Demonstration(conversation(p, True), False))
    return out


def train_agent_sft(tokenizer, demos: list[Demonstration], cfg: AgentPreset, seed: int, log):
    """LlamaForCausalLM after `cfg.sft_steps` AdamW steps on the demonstrations' trained assistant tokens."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(model_config(tokenizer, cfg, tokenizer.model_max_length))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    tools = list(TASK.tools)
    encoded = [encode_conversation(tokenizer, d.messages, tools, d.decide) for d in demos]

    def loss_of(idx: list[int]):
        ids, mask = right_pad([encoded[i][0] for i in idx], tokenizer.pad_token_id)
        trained, _ = right_pad([[int(t) for t in encoded[i][1]] for i in idx], 0)
        labels = ids.masked_fill(~trained.bool(), -100)
        loss = model(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
        return loss, lambda: f"loss {loss.item():.4f}"

    fit(model, "sft", cfg.sft_steps, cfg.sft_lr, cfg.sft_batch, len(encoded), seed, loss_of, 50, log)
    return model


def first_turn_stats(model, tokenizer, prompts: list[str], batch_size: int = 128) -> dict:
    """Greedy measurements that need no tool run (the episodes, tools run, are the quickstart judge's): how often the
    first turn calls the tool, how often a direct first turn is the product, how often a turn begun with <tool_call>
    calls the calculator with the user's expression, and how often the answer after the gold call and its result is
    that result."""
    tools = list(TASK.tools)

    def rendered(messages):
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)

    first = complete_texts(
        model, tokenizer, [rendered([{"role": "user", "content": p}]) for p in prompts], 24, None, 0, batch_size
    )
    # the decoded turn keeps the tool tags (added tokens, not special), so a call is recognisable in the text
    calls = [t.lstrip().startswith(TOOL_CALL) for t in first.texts]
    direct = [(p, t) for p, t, c in zip(prompts, first.texts, calls) if not c]
    forced = complete_texts(
        model,
        tokenizer,
        [rendered([{"role": "user", "content": p}]) + TOOL_CALL for p in prompts],
        16,
        None,
        0,
        batch_size,
    )
    after = complete_texts(
        model, tokenizer, [rendered(conversation(p, True)[:3]) for p in prompts], 16, None, 0, batch_size
    )
    return {
        "greedy_first_turn_tool_call_rate": sum(calls) / len(prompts),
        "greedy_direct_answer_accuracy": (sum(TASK.check(p, t) for p, t in direct) / len(direct) if direct else None),
        "greedy_call_accuracy": sum(  # after <tool_call>, the call with the user's expression
            t.startswith(f"{CALL_OPEN}{p}{CALL_CLOSE}{TOOL_CALL_END}") for p, t in zip(prompts, forced.texts)
        )
        / len(prompts),
        "greedy_answer_from_result_accuracy": sum(t.strip() == calculator(p) for p, t in zip(prompts, after.texts))
        / len(prompts),
        "eval_prompts": len(prompts),
    }


def build_agent(out_dir: Path, seed: int, cfg: AgentPreset, preset_name: str, builder_version: int, log) -> dict:
    """The agent task's assets into `out_dir` (written beside it, then renamed into place); task.json's dict."""
    t0 = time.perf_counter()
    out_dir = Path(out_dir).expanduser().absolute()
    ensure_replaceable(out_dir)  # fail before spending the build time
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    seed_everything(seed)
    rng = random.Random(seed)
    tokenizer = build_chat_tokenizer()

    # 1. prompts (user messages): train and test disjoint
    train_prompts = TASK.make_prompts(cfg.n_train_prompts, rng)
    test_prompts = TASK.make_prompts(cfg.n_test_prompts, rng, exclude=set(train_prompts))
    log(f"[build-tiny] task agent, preset {preset_name}, seed {seed}: {len(train_prompts)} train prompts")

    # 2. supervised warm start on demonstrations, some calling the calculator
    demos = sft_examples(train_prompts, cfg, rng)
    demo_tool_share = sum(d.decide and len(d.messages) > 2 for d in demos) / len(train_prompts)
    sft = train_agent_sft(tokenizer, demos, cfg, seed, log)
    t_sft = time.perf_counter() - t0

    # 3. measurements on held-out prompts
    stats = first_turn_stats(sft, tokenizer, test_prompts[: cfg.eval_prompts])
    meta = {
        "name": TASK.name,
        "check": TASK.refs["check"],
        "reward_funcs": {k: v for k, v in TASK.refs.items() if k != "check"},
        "tools": [f"{f.__module__}:{f.__qualname__}" for f in TASK.tools],
        "seed": seed,
        "preset": preset_name,
        "builder_version": builder_version,
        "max_new_tokens": TASK.max_new_tokens,
        "sft": {**stats, "demonstrations_calling_the_tool": demo_tool_share},
        "config": asdict(cfg),
        "seconds": {"sft": round(t_sft, 2)},
    }
    meta["build_seconds"] = round(time.perf_counter() - t0, 2)
    log(
        f"[build-tiny] SFT (greedy, first turn): calls the tool on {stats['greedy_first_turn_tool_call_rate']:.3f} of "
        f"the prompts; calls right {stats['greedy_call_accuracy']:.3f}; answers from a result right "
        f"{stats['greedy_answer_from_result_accuracy']:.3f}; "
        f"{meta['build_seconds']:.1f}s"
    )

    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with progress_bars_hidden():
            _write_assets(tmp, tokenizer, sft, train_prompts, test_prompts, meta)
        install(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**meta, "out_dir": str(out_dir)}


def _write_assets(tmp: Path, tokenizer, sft, train_prompts: list[str], test_prompts: list[str], meta: dict) -> None:
    from datasets import Dataset, DatasetDict

    assets = Assets(tmp)
    tokenizer.save_pretrained(assets.tokenizer)
    sft.save_pretrained(assets.sft)
    tokenizer.save_pretrained(assets.sft)
    DatasetDict(
        {
            split: Dataset.from_dict(
                {
                    "prompt": [[{"role": "user", "content": p}] for p in prompts],
                    "answer": [TASK.answer(p) for p in prompts],
                }
            )
            for split, prompts in (("train", train_prompts), ("test", test_prompts))
        }
    ).save_to_disk(assets.prompts)
    assets.task_file.write_text(json.dumps(meta, indent=2) + "\n")
