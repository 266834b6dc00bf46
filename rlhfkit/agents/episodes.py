"""Multi-turn episodes with tools (TRL 1.16's ``GRPOTrainer(tools=[...])``, ``max_tool_calling_iterations``): the
policy samples a turn, the turns that call tools get the tools' results, and the policy continues from there, until no
turn calls a tool, the turn cap or the length budget is reached. docs/agents.md describes it for users.

One episode, as the loss and the reward functions see it (TRL's layout), for prompt p (its chat template rendered with
the tools, ending with the assistant's header):

    completion = turn_1  suffix_1  turn_2  suffix_2 ...  turn_k

turn_j: tokens the policy sampled (a tool call or the answer, up to its end-of-turn token); suffix_j: the chat
template's rendering of the tool messages after turn_j and of the next assistant header, the tokens after the
end-of-turn of a rendered assistant tool call (suffix_ids). Every token is in the sequence the policy reads; only the
turns are in ``tool_mask`` (True = the policy's token): the suffixes are out of the loss, the KL, the entropy and every
per-token metric, and the completion lengths count the turns only. The sampler's log-probs of a suffix are 0 and never
used (the mask). The next turn is sampled from the token ids p + completion so far, never re-tokenized text, so the
episode scored in one forward is exactly what was sampled.

As TRL: tool calls are parsed with the tokenizer's own response parsing (``tokenizer.parse_response`` with its
``response_template``; a turn that does not parse is plain text, without calls); at most max_tool_calling_iterations
rounds of tool results (None: no cap); an episode whose tool results would push its completion past
max_completion_length (or the sequence to the model's max_position_embeddings) ends as it is, the results dropped
(rolled back); a continuation is cut at the completion budget. The tools are called through agents.ToolBox (what a
failure is, timeouts).
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from datasets import Dataset
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

from rlhfkit.agents.environments import ROUTE_COLUMN, Environments
from rlhfkit.agents.response_formats import recognised_response_template
from rlhfkit.agents.tools import ToolBox, run_tool_calls
from rlhfkit.data import is_conversational
from rlhfkit.errors import ConfigError, DataError
from rlhfkit.metrics import registry as M
from rlhfkit.sampling import Chunk, complete, left_pad, model_pad_id, right_pad
from rlhfkit.sampling.settings import stop_ids


@dataclass
class ToolStats:
    """Tool calls of a round of episodes on this process. per_tool: registered tool name -> [calls, failures, seconds];
    turns: the policy's turns of each episode; capped: episodes whose last turn's calls the turn cap left unanswered;
    rolled_back: episodes ended with a call pending because its results did not fit the length budget; tool_tokens:
    tokens of tool results (the template's, between turns) of each episode."""

    calls: int = 0
    failures: int = 0
    per_tool: dict[str, list[float]] = field(default_factory=dict)
    turns: list[int] = field(default_factory=list)
    capped: int = 0
    rolled_back: int = 0
    tool_tokens: list[int] = field(default_factory=list)


def log_tool_stats(metrics, stats: ToolStats, evaluation: bool = False) -> None:
    """A round's tool calls into `metrics` (the run's MetricWindow, or an evaluation's accumulator with `evaluation`:
    the eval/tools/... twins), for either trainer: TRL's tools/call_frequency and tools/failure_frequency, each tool's
    calls, failures and seconds, the turns per episode, how episodes ended and their tool tokens (pooled when
    reduced)."""
    m, episodes = metrics, len(stats.turns)
    named = M.evaluated if evaluation else (lambda metric: metric)
    m.add(named(M.TOOLS_CALL_FREQUENCY), stats.calls, episodes)
    m.add(named(M.TOOLS_FAILURE_FREQUENCY), stats.failures, stats.calls)
    turns = torch.tensor(stats.turns, dtype=torch.float64)
    m.add_tensor(named(M.TOOLS_MEAN_TURNS), turns)
    m.add_tensor(named(M.TOOLS_MAX_TURNS), turns)
    m.add(named(M.TOOLS_TURN_CAP_RATIO), stats.capped, episodes)
    m.add(named(M.TOOLS_ROLLED_BACK_RATIO), stats.rolled_back, episodes)
    m.add(named(M.TOOLS_MEAN_TOOL_TOKENS), sum(stats.tool_tokens), episodes)
    for name, (calls, failures, seconds) in stats.per_tool.items():
        m.add(M.expand(named(M.TOOLS_TOOL_CALLS), name), calls, episodes)
        m.add(M.expand(named(M.TOOLS_TOOL_FAILURE_FREQUENCY), name), failures, calls)
        m.add(M.expand(named(M.TOOLS_TOOL_LATENCY), name), seconds, calls)


class Episodes(NamedTuple):
    """A round of episodes: the chunk the trainer scores and trains (completion = every turn and tool result, with
    tool_mask), each episode's messages after the prompt (TRL's completions: assistant turns with their parsed
    tool_calls, and tool messages) and the tool statistics. A rollout_func's (CustomRollout) have neither: its
    completions are scored as text, as the trainer's own are."""

    chunk: Chunk
    messages: list[list[dict]] | None
    stats: ToolStats | None


class ToolEpisodes:
    """Samples multi-turn episodes with `toolbox`'s tools. tokenizer: the policy's, whose response_template parses a
    turn's tool calls and whose chat template renders tool results. max_iterations: rounds of tool results at most
    (None: no cap). chat_template_kwargs: the template's variables (--chat_template_kwargs)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        toolbox: ToolBox,
        max_iterations: int | None,
        max_completion_length: int,
        chat_template_kwargs: dict | None = None,
        environments: Environments | None = None,
        text_field: str = "prompt",
        max_prompt_length: int | None = None,
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("tools= needs a tokenizer with a chat template that renders tools and tool calls.")
        # Environments without tools (and no tools=): one-turn episodes, nothing to parse calls out of or render.
        self.offers_tools = bool(toolbox.names)
        if self.offers_tools and getattr(tokenizer, "response_template", None) is None:
            # a format rlhfkit recognises (ChatML with Hermes-style calls: Qwen2.5, Qwen3) gets its spec
            tokenizer.response_template = recognised_response_template(tokenizer.chat_template)
        if self.offers_tools and tokenizer.response_template is None:
            raise ConfigError(
                "tools= needs the tokenizer to parse tool calls out of the model's turns, and it has no "
                "response_template (transformers' response parsing, tokenizer.parse_response), nor a chat template "
                "whose tool-call format rlhfkit recognises (ChatML with <tool_call> JSON, as Qwen2.5 and Qwen3 write "
                "it). Set tokenizer.response_template to the template's parsing spec (transformers' chat docs, "
                "'Response parsing') and pass the tokenizer as processing_class; for the chat templates TRL knows, "
                "TRL's trl.chat_template_utils.add_response_schema(tokenizer) sets it (rlhfkit never imports TRL, so "
                "call it in your script: docs/agents.md)."
            )
        self.tokenizer, self.toolbox = tokenizer, toolbox
        self.max_iterations = max_iterations
        self.max_completion_length = max_completion_length
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.environments, self.text_field, self.max_prompt_length = environments, text_field, max_prompt_length
        if self.offers_tools:
            self.check_template()

    def check_template(self) -> None:
        """The chat template must render a tool call and a tool result (some templates silently drop either: the model
        would never see its calls or their results) and render earlier messages alike whatever follows."""
        tok, name, content = self.tokenizer, self.toolbox.names[0], "tool_result_7d1c"
        call = [{"type": "function", "function": {"name": name, "arguments": {"x_3b9f": 1}}}]
        turn = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "", "tool_calls": call}]
        rendered = tok.apply_chat_template(turn, tokenize=False, **self.chat_template_kwargs)
        suffix = tok.decode(self.suffix_ids([{"role": "tool", "name": name, "content": content}]))
        if name not in rendered or "x_3b9f" not in rendered or content not in suffix:
            raise ConfigError(
                "tools= needs a chat template that renders an assistant's tool calls and the tool messages after them; "
                "this tokenizer's template drops "
                + ("the tool calls" if content in suffix else "the tool messages")
                + ". Use the model's tool-calling template."
            )

    def sample_rows(self, model: nn.Module, rows: list[dict], config: GenerationConfig, device):
        """One episode per dataset row (its ``input_ids``); with environments, each begun by its own instance
        (Environments.start: reset, the prompt with reset's text, that environment's tools). Returns the episodes
        and the rows as the reward functions must see them (with environments: the prompt as the policy read it and
        the instance under ``environments``)."""
        if self.environments is None:
            return self.sample(model, [r["input_ids"] for r in rows], config, device), rows
        started = self.environments.start(
            rows, self.tokenizer, self.text_field, self.max_prompt_length, self.chat_template_kwargs
        )
        return self.sample(model, started.prompt_ids, config, device, started.toolboxes), started.rows

    def sample(
        self,
        model: nn.Module,
        prompt_ids: list[list[int]],
        config: GenerationConfig,
        device,
        toolboxes: list[ToolBox] | None = None,
    ) -> Episodes:
        """One episode per prompt (token ids, the chat template rendered with the tools), sampled by `model` with
        `config` (its max_new_tokens is replaced by each turn's budget). toolboxes: each episode's tools (an
        environment's instance), default the trainer's for all."""
        budget, n = self.max_completion_length, len(prompt_ids)
        boxes = toolboxes or [self.toolbox] * n
        max_positions = getattr(model.config, "max_position_embeddings", None) or float("inf")
        stats = ToolStats(per_tool={name: [0, 0, 0.0] for name in self.toolbox.names}, turns=[1] * n)
        ids, logprobs = self.turns(model, prompt_ids, [budget] * n, config, device)
        model_token = [[True] * len(t) for t in ids]
        messages = [[self.parse(t, p, boxes[i])] for i, (t, p) in enumerate(zip(ids, prompt_ids))]
        pending = [i for i in range(n) if messages[i][-1].get("tool_calls")]
        iteration = 0
        while pending and (self.max_iterations is None or iteration < self.max_iterations):
            continuing, contexts, suffixes = [], [], []
            # every pending episode's calls at once: a slow tool costs the round one latency, not one per episode
            answered = run_tool_calls([(boxes[i], messages[i][-1]["tool_calls"]) for i in pending])
            for i, results in zip(pending, answered):
                stats.calls += len(results)
                for r in results:
                    stats.failures += r.failed
                    if r.registered:
                        entry = stats.per_tool.setdefault(r.name, [0, 0, 0.0])
                        entry[0], entry[1], entry[2] = entry[0] + 1, entry[1] + r.failed, entry[2] + r.latency_s
                tool_messages = [{"role": "tool", "name": r.name, "content": r.content} for r in results]
                suffix = self.suffix_ids(tool_messages)
                context = prompt_ids[i] + ids[i] + suffix
                if len(ids[i]) + len(suffix) > budget or len(context) >= max_positions:
                    stats.rolled_back += 1  # the episode ends with its pending call, the results dropped
                    continue
                messages[i] += tool_messages
                continuing.append(i), contexts.append(context), suffixes.append(suffix)
            if not continuing:
                break
            left = [budget - (len(ids[i]) + len(s)) for i, s in zip(continuing, suffixes)]
            post, post_logprobs = self.turns(model, contexts, left, config, device)
            pending = []
            for k, i in enumerate(continuing):
                suffix = suffixes[k]
                ids[i] = ids[i] + suffix + post[k]
                model_token[i] += [False] * len(suffix) + [True] * len(post[k])
                if logprobs is not None:
                    logprobs[i] += [0.0] * len(suffix) + post_logprobs[k]
                if post[k]:  # nothing when the budget was spent by the tool results
                    messages[i].append(self.parse(post[k], contexts[k], boxes[i]))
                    stats.turns[i] += 1
                    if messages[i][-1].get("tool_calls"):
                        pending.append(i)
            iteration += 1
        else:  # the loop ran out of iterations (or of pending calls): those still pending met the turn cap
            stats.capped = len(pending)
        stats.tool_tokens = [len(row) - sum(row) for row in model_token]
        return Episodes(self.chunk(model, prompt_ids, ids, logprobs, model_token, config, device), messages, stats)

    def turns(self, model, contexts: list[list[int]], budgets: list[int], config: GenerationConfig, device):
        """One turn per context (token ids), at most budgets[i] tokens each: (token ids, the sampler's log-probs or
        None when greedy). Sampled with the longest budget and cut, which draws the same tokens as stopping early."""
        longest = max(budgets)
        if longest <= 0:
            return [[] for _ in contexts], [[] for _ in contexts]
        turn_config = copy.copy(config)
        turn_config.max_new_tokens = longest
        (chunk,) = complete(model, contexts, turn_config, len(contexts), device)
        ids, logprobs = [], None if chunk.sampling_logprobs is None else []
        for r, limit in enumerate(budgets):
            real = chunk.completion_mask[r]
            ids.append(chunk.completion_ids[r][real][:limit].tolist())
            if logprobs is not None:
                logprobs.append(chunk.sampling_logprobs[r][real][:limit].tolist())
        return ids, logprobs

    def parse(self, ids: list[int], prefix: list[int], toolbox: ToolBox) -> dict:
        """A turn's assistant message, with tool_calls when the template's response parsing (given the episode's
        tools) finds well-formed ones; a turn that does not parse is its decoded text (as TRL's parse_response falls
        back)."""
        tok = self.tokenizer
        parsed = None  # no tools offered: every turn is an answer
        try:
            if self.offers_tools:
                parsed = tok.parse_response(ids, prefix=prefix, tools=list(toolbox.schemas.values()))
        except Exception:  # noqa: BLE001 - the model's output is data: a malformed turn is text, never a crash
            parsed = None
        calls = parsed.get("tool_calls") if isinstance(parsed, dict) else None
        if not isinstance(parsed, dict) or calls is not None and not _well_formed(calls):
            return {"role": "assistant", "content": tok.decode(ids, skip_special_tokens=True)}
        content = parsed.get("content")
        if isinstance(content, str) and tok.eos_token:
            content = content.removesuffix(tok.eos_token)
        message = {**parsed, "role": "assistant", "content": content or ""}
        if not calls:
            message.pop("tool_calls", None)
        return message

    def suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        """The token ids the chat template puts after an assistant tool-call turn's end-of-turn token: the tool
        messages and the next assistant header. Rendered after a stand-in conversation whose tool call names the
        first tool (some templates derive the tool header from it), as the difference of the conversation with and
        without the tool messages. The template must render the messages before the assistant turn alike either
        way; the turn itself may differ (Qwen3's renders an empty <think> block only in a conversation's last turn):
        an episode keeps the turn as the policy sampled it, so only what follows its end-of-turn token is taken."""
        call = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
        head = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": call}]
        render = dict(tokenize=True, return_dict=False, **self.chat_template_kwargs)
        tok = self.tokenizer
        before = list(tok.apply_chat_template(head, add_generation_prompt=False, **render))
        after = list(tok.apply_chat_template(head + tool_messages, add_generation_prompt=True, **render))
        ends = [k for k, t in enumerate(before) if t == tok.eos_token_id]
        if ends:  # the turn the model samples ends at its end-of-turn token; what the template adds after belongs here
            before = before[: ends[-1] + 1]
        if after[: len(before)] == before:
            return after[len(before) :]
        # The assistant turn renders differently once results follow: its end in `after` is the same end-of-turn
        # token (the len(ends)-th), provided everything before the turn renders alike.
        turn_start = ends[-2] + 1 if len(ends) > 1 else 0
        after_ends = [k for k, t in enumerate(after) if t == tok.eos_token_id]
        if not ends or len(after_ends) <= len(ends) or after[:turn_start] != before[:turn_start]:
            raise ConfigError(
                "tools= needs a chat template that renders a conversation's earlier messages the same whatever follows "
                "(prefix-preserving): this one renders the messages before an assistant's tool-call turn differently "
                "once tool results follow it, or ends turns without the tokenizer's eos_token. Give the tokenizer a "
                "training template that does not: tokenizer.chat_template = TEMPLATE (docs/agents.md)."
            )
        return after[after_ends[len(ends) - 1] + 1 :]

    def chunk(self, model, prompt_ids, ids, logprobs, model_token, config: GenerationConfig, device) -> Chunk:
        """The episodes as one Chunk: prompts left-padded, completions (turns and tool results) right-padded, the
        sampler's log-probs 0 on tool results and padding, terminated where the last token ends a turn."""
        pad = model_pad_id(model, config.pad_token_id)
        stops = set(stop_ids(config))
        prompt, prompt_mask = left_pad(prompt_ids, pad)
        completion, completion_mask = right_pad(ids, pad)
        tool_mask, _ = right_pad([[int(t) for t in row] for row in model_token], 1)
        sampling = None
        if logprobs is not None:
            sampling = torch.zeros(completion.shape, dtype=torch.float32)
            for r, row in enumerate(logprobs):
                sampling[r, : len(row)] = torch.tensor(row, dtype=torch.float32)
        terminated = torch.tensor([bool(row) and row[-1] in stops for row in ids])
        parts = (prompt, prompt_mask, completion, completion_mask, terminated, sampling, tool_mask.bool())
        return Chunk(*(None if t is None else t.to(device) for t in parts))


def _well_formed(calls) -> bool:
    """Tool calls a conversation can hold: a list of dicts, each a function call with a string name (what the chat
    template reads when the turn is rendered again; the ToolBox checks the rest)."""
    return isinstance(calls, list) and all(
        isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
        for c in calls
    )


ROLLOUT_KEYS = ("prompt_ids", "completion_ids", "logprobs")


class CustomRollout:
    """TRL 1.16's ``GRPOTrainer(rollout_func=...)`` in place of the trainer's sampling, for training rounds and
    evaluations alike (custom_rollout). It makes no tool statistics (Episodes.stats is None)."""

    def __init__(self, rollout_func, trainer, text_field: str):
        self.rollout_func, self.trainer, self.text_field = rollout_func, trainer, text_field

    def sample_rows(self, model: nn.Module, rows: list[dict], config: GenerationConfig, device):
        pad = model_pad_id(model, config.pad_token_id)
        chunk, rows = custom_rollout(self.rollout_func, self.trainer, rows, self.text_field, pad, stop_ids(config))
        return Episodes(chunk.to(device), None, None), rows


def custom_rollout(rollout_func, trainer, rows: list[dict], text_field: str, pad: int, stops) -> tuple[Chunk, list]:
    """TRL 1.16's ``rollout_func(prompts, trainer) -> dict``: the user's own generation (an agent loop, a server).

    It gets this process's prompts of a round as the dataset holds them (each prompt num_generations times in a row,
    as TRL's sampler repeats them; a deep copy) and must return, one entry per prompt: ``prompt_ids`` and
    ``completion_ids`` (lists of token ids), ``logprobs`` (one float per completion token, or None: the sampler's
    log-probs, used for the sampling/* metrics only: the losses' logp_old is always a forward of the policy), and
    optionally ``env_mask`` (1 on the policy's tokens, 0 on tokens it did not write, TRL's name for the tool mask:
    those are out of the loss). Any other key is a column of one value per prompt that the reward functions receive
    as a keyword argument (TRL's extra fields). Returns the chunk and the rows with those columns."""
    n = len(rows)
    output = rollout_func(copy.deepcopy([r[text_field] for r in rows]), trainer)
    if not isinstance(output, dict):
        raise ConfigError(
            f"rollout_func must return a dict with keys {list(ROLLOUT_KEYS)}, got {type(output).__name__}."
        )
    missing = [k for k in ROLLOUT_KEYS if k not in output]
    if missing:
        raise ConfigError(
            f"rollout_func must return keys {missing} in its output dict (it returned {sorted(output)})."
        )
    for key, value in output.items():
        if value is None and key == "logprobs":
            continue
        if not isinstance(value, (list, tuple)) or len(value) != n:
            got = f"{len(value)} entries" if isinstance(value, (list, tuple)) else type(value).__name__
            raise ConfigError(
                f"rollout_func's {key!r} must hold one entry per prompt it was given ({n}: this process's prompts of "
                f"the round, each num_generations times), got {got}."
            )
    prompt_ids = [_token_list(row, "prompt_ids", i) for i, row in enumerate(output["prompt_ids"])]
    completion_ids = [_token_list(row, "completion_ids", i) for i, row in enumerate(output["completion_ids"])]
    logprobs = output["logprobs"]
    sampling = None
    if logprobs is not None:
        sampling = torch.zeros(n, max((len(c) for c in completion_ids), default=0), dtype=torch.float32)
        for i, (row, ids) in enumerate(zip(logprobs, completion_ids)):
            if not isinstance(row, (list, tuple)) or len(row) != len(ids):
                raise ConfigError(
                    f"rollout_func's logprobs[{i}] must hold one log-prob per completion token ({len(ids)}), got "
                    f"{len(row) if isinstance(row, (list, tuple)) else type(row).__name__}."
                )
            sampling[i, : len(row)] = torch.tensor([float(x) for x in row], dtype=torch.float32)
    tool_mask = None
    if output.get("env_mask") is not None:
        masks = output["env_mask"]
        for i, (row, ids) in enumerate(zip(masks, completion_ids)):
            if not isinstance(row, (list, tuple)) or len(row) != len(ids) or any(v not in (0, 1) for v in row):
                raise ConfigError(
                    f"rollout_func's env_mask[{i}] must hold a 0 or 1 per completion token ({len(ids)}): 1 where the "
                    "policy wrote the token."
                )
        tool_mask, _ = right_pad([[int(v) for v in row] for row in masks], 1)
        tool_mask = tool_mask.bool()
    prompt, prompt_mask = left_pad(prompt_ids, pad)
    completion, completion_mask = right_pad(completion_ids, pad)
    stops = set(stops)
    terminated = torch.tensor([bool(row) and row[-1] in stops for row in completion_ids])
    parts = (prompt, prompt_mask, completion, completion_mask, terminated, sampling, tool_mask)
    chunk = Chunk(*parts)
    extra = {k: v for k, v in output.items() if k not in (*ROLLOUT_KEYS, "env_mask")}
    rows = [{**row, **{k: v[i] for k, v in extra.items()}} for i, row in enumerate(rows)]
    return chunk, rows


def _token_list(row, key: str, i: int) -> list[int]:
    """A rollout's token ids as ints (numpy and torch integers too); anything else names the entry."""
    try:
        if isinstance(row, (str, bytes)) or any(isinstance(t, bool) for t in row):
            raise TypeError
        return [operator.index(t) for t in row]
    except TypeError:
        raise ConfigError(
            f"rollout_func's {key}[{i}] must be a list of token ids (integers), got {type(row).__name__}."
        ) from None


def check_agent_arguments(
    trainer: str, args, toolbox: ToolBox | None, rollout_func=None, environment_factory=None
) -> None:
    """What a trainer's agent arguments (`trainer`: its class name, for the messages) cannot be combined with, before
    anything loads: a rollout_func samples on its own, so the trainer's tool loop does not run after it (give the tools
    to the rollout_func), and it is called with the trainer, which the generation worker of async_generation has not
    (tools and environments run in the worker)."""
    if rollout_func is not None and not callable(rollout_func):
        raise ConfigError(
            f"rollout_func must be a function rollout_func(prompts, trainer) -> dict, got {type(rollout_func).__name__}."
        )
    if rollout_func is not None and toolbox is not None:
        given = "environment_factory" if environment_factory is not None else "tools"
        raise ConfigError(
            f"{trainer}(rollout_func=..., {given}=...): a rollout_func samples the episodes itself, so the trainer "
            f"runs no tools after it. Run the tools inside the rollout_func (its env_mask keeps their tokens out of "
            f"the loss), or drop rollout_func and let the trainer run the {given}."
        )
    if args.async_generation and rollout_func is not None:
        raise ConfigError(
            f"{trainer}(rollout_func=...) with async_generation: a rollout_func is called with the trainer, which "
            "lives in another process than the generation worker, so it cannot sample ahead. Leave async_generation "
            "off (--async_generation false) to train with it (tools and environment_factory do run asynchronously)."
        )


def environment_prompts(args, environments: Environments | None):
    """TRL 1.16's train set when an environment writes the prompts (no train_dataset): one empty user message per
    prompt of a generation, drawn again every generation, for max_steps steps; each environment's reset() text
    becomes the prompt. Without a single environment_factory, a train_dataset is required."""
    from datasets import Dataset

    from rlhfkit.config import grpo_batch_sizes

    if environments is None:
        raise ConfigError(
            "GRPOTrainer: a `train_dataset` is required, with a prompt column (only an environment_factory, whose "
            "reset() writes the prompts, goes without one)."
        )
    if environments.multi:
        raise ConfigError(
            "environment_factory is a dict of environments, which requires a `train_dataset` with an 'environment' "
            "column to route each row to its environment. Give one, or a single environment factory."
        )
    if args.max_steps <= 0:
        raise ConfigError(
            f"No train_dataset: the environment writes the prompts (reset()), so the run's length is max_steps, which "
            f"is {args.max_steps}. Set max_steps (e.g. --max_steps 500), as TRL requires."
        )
    rows = grpo_batch_sizes(args, 1, 0).prompts
    return Dataset.from_dict({args.dataset_text_field: [EMPTY_PROMPT] * rows})


EMPTY_PROMPT = [
    {"role": "user", "content": ""}
]  # what reset()'s text is appended to when the environment owns the data


def with_environment_prompts(dataset, text_field: str):
    """TRL 1.16's rows without a prompt when environments own the data (say, a routing dataset of only an
    ``environment`` column): each gets one empty user message, which its environment's reset() text then fills. A
    dataset (a Dataset, an IterableDataset, or a dict of them) with the column, or None, is returned as it is."""
    if dataset is None:
        return None
    if isinstance(dataset, dict):
        return {name: with_environment_prompts(part, text_field) for name, part in dataset.items()}
    columns = dataset.column_names
    if columns is None or text_field in columns:  # a stream whose columns are unknown is read as it is
        return dataset
    return dataset.map(lambda row: {text_field: EMPTY_PROMPT})


def sample_episodes(sampler, model: nn.Module, rows: list[dict], config: GenerationConfig, batch_size: int, device,
                    metrics=None, evaluation: bool = False):  # fmt: skip
    """The one way in to multi-turn sampling, for both trainers and evaluation: episodes of `rows` (dataset rows with
    their ``input_ids``) sampled by `model` with `sampler` (a ToolEpisodes, or a rollout_func's CustomRollout) in
    chunks of `batch_size`, each chunk's tool statistics added to `metrics` (a MetricAccumulator; None: not logged),
    as eval/tools/... with `evaluation`. Returns each chunk's Episodes and the rows as their episodes began (with environments: the
    prompt reset() wrote and the instance; a rollout_func's: with its extra columns)."""
    episodes, began = [], []
    for start in range(0, len(rows), batch_size):
        sampled, part = sampler.sample_rows(model, rows[start : start + batch_size], config, device)
        if metrics is not None and sampled.stats is not None:
            log_tool_stats(metrics, sampled.stats, evaluation)
        episodes.append(sampled)
        began += part
    return episodes, began


# What a trainer checks and builds for multi-turn episodes, PPO's and GRPO's alike.
def tool_episodes(
    trainer: str,
    toolbox: ToolBox | None,
    tokenizer,
    train_dataset: Dataset,
    args,
    max_completion_length: int,
    environments=None,
) -> ToolEpisodes | None:
    """The sampler of multi-turn episodes with `toolbox`'s tools (None without tools), each episode's completion at
    most `max_completion_length` tokens (GRPO's max_completion_length, PPO's response_length), at most
    args.max_tool_calling_iterations rounds of tool results; `environments` (agents.Environments, GRPO's
    environment_factory) begin each episode. The tokenized `train_dataset`'s prompts must be conversations: the chat
    template renders them with the tools and the tokenizer parses the episodes; with a dict of environments each row
    names its own in an ``environment`` column."""
    if toolbox is None:
        return None
    if not is_conversational(train_dataset[0][args.dataset_text_field]):
        raise ConfigError(
            f"{trainer}(tools=...) needs conversational prompts (lists of {{'role', 'content'}} messages), which the "
            "chat template renders with the tools and whose episodes the tokenizer parses; the "
            f"{args.dataset_text_field!r} column holds text."
        )
    if environments is not None and environments.multi:
        if ROUTE_COLUMN not in train_dataset.column_names:
            raise DataError(
                f"environment_factory is a dict of environments, so each row names its own in an {ROUTE_COLUMN!r} "
                f"column, which the train_dataset lacks (columns: {', '.join(train_dataset.column_names)})."
            )
        environments.check_routes(train_dataset[ROUTE_COLUMN])
    return ToolEpisodes(
        tokenizer,
        toolbox,
        args.max_tool_calling_iterations,
        max_completion_length,
        getattr(args, "chat_template_kwargs", None),  # GRPO's (TRL 1.12's PPO has none)
        environments,
        args.dataset_text_field,
        args.max_prompt_length,
    )


def tool_metrics(toolbox: ToolBox | None, evaluation: bool = False) -> list[M.Metric]:
    """The per-tool metrics a run with `toolbox` logs (tools/{tool_name}/...; eval/tools/... with `evaluation`), for
    run.start's extra_metrics and an evaluation's accumulator."""
    templates = (M.TOOLS_TOOL_CALLS, M.TOOLS_TOOL_FAILURE_FREQUENCY, M.TOOLS_TOOL_LATENCY)
    named = M.evaluated if evaluation else (lambda metric: metric)
    return [M.expand(named(m), name) for name in (toolbox.names if toolbox else []) for m in templates]
