"""The tools an agent's policy may call (TRL 1.16's ``GRPOTrainer(tools=[...])``), and calling them safely.

A tool is a typed Python function with a Google-style docstring, sync or ``async def``. Its JSON schema, what the chat
template shows the model, is transformers' own ``get_json_schema`` (what ``apply_chat_template(tools=...)`` renders).

The model's output is data, never code: a parsed tool call (transformers' response parsing, agents/episodes.py) is
looked up by name among the registered tools only, its arguments must be a JSON object whose keys bind to the tool's
signature and whose values have the types its schema declares, and nothing the model wrote is evaluated. Whatever goes
wrong becomes the tool message ``{'error': ...}`` (TRL's form: ``str`` of that dict) with the text cut to
TOOL_ERROR_CHARS, and counts as a failure; the episode goes on:

- an unknown name, a call that is not a function call, arguments that are not a JSON object;
- arguments that do not bind to the signature (missing, unexpected) or have another type than the schema's;
- the tool raising, or running longer than ``timeout_s`` (TOOL_TIMEOUT_S by default). A sync tool runs in a daemon
  thread that is abandoned at the timeout (Python cannot stop a thread: a hung tool keeps its thread, not the run); an
  async tool is cancelled at the timeout (one that blocks its event loop without awaiting cannot be);
- a result that cannot be turned into text. As in TRL, a result that is not a string is turned into one with
  ``str()`` (TRL's own example tool returns an int), and that is not a failure.

A batch's tool calls run concurrently (`run_tool_calls`: every episode's calls of one round of tool results): the
async ones awaited together (asyncio.gather, as TRL awaits one turn's) in a fresh event loop per round, in a thread of
its own (an object bound to an event loop must not be kept between calls), while
the sync ones run in daemon threads, at most TOOL_THREADS at a time, each with its own timeout from when it starts. So a
slow tool (a web search, a code run) costs a batch about one latency per round, not one per episode. Results are in the
order of the calls (TRL lists the sync tools' results before the async ones').
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from transformers.utils import get_json_schema
from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

from rlhfkit.errors import ConfigError

# Seconds a tool call may take before it counts as failed and its error goes into the conversation.
TOOL_TIMEOUT_S = 30.0
# Characters of an error's text kept in the conversation (an exception may carry a huge message, or echo the model's
# arguments back).
TOOL_ERROR_CHARS = 500
# Sync tool calls of a batch that run at once (each in its own daemon thread; the rest wait for a free one).
TOOL_THREADS = 32

# JSON schema type -> the Python types a parsed JSON value of that type has (bool is not a number in JSON).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


class ToolResult(NamedTuple):
    """One tool call's outcome: the tool message's name and content, whether it failed, and its wall-clock seconds.
    registered: the name is one of the tools (per-tool metrics are kept only for those: a model inventing names must
    not invent metric names)."""

    name: str
    content: str
    failed: bool
    latency_s: float
    registered: bool


class ToolBox:
    """The registered tools by name, with their JSON schemas (``schemas``: what apply_chat_template and
    parse_response are given: the functions themselves, as TRL passes them)."""

    def __init__(self, tools: Sequence[Callable], timeout_s: float = TOOL_TIMEOUT_S):
        if callable(tools) or not all(callable(t) for t in tools):
            raise ConfigError("tools must be a list of functions (sync or async), e.g. tools=[multiply, async_add].")
        self.functions: list[Callable] = list(tools)
        self.by_name: dict[str, Callable] = {}
        self.schemas: dict[str, dict] = {}
        for fn in self.functions:
            name = getattr(fn, "__name__", None)
            try:
                schema = get_json_schema(fn)
            except (DocstringParsingException, TypeHintParsingException) as e:
                raise ConfigError(
                    f"tool {name or fn!r}: {e} A tool needs type hints on every argument and a Google-style docstring "
                    "describing it and each argument (transformers' get_json_schema, which apply_chat_template uses)."
                ) from e
            name = schema["function"]["name"]
            if name in self.by_name:
                raise ConfigError(
                    f"Two tools are named {name!r}: the model calls tools by name, so names must differ."
                )
            self.by_name[name], self.schemas[name] = fn, schema
        self.names = list(self.by_name)
        self.timeout_s = timeout_s

    def run(self, calls: list) -> list[ToolResult]:
        """The results of one assistant turn's tool calls (parsed dicts, TRL's form ``{"type": "function",
        "function": {"name": ..., "arguments": {...}}}``), in the calls' order. Never raises for anything the model
        wrote or a tool did."""
        return run_tool_calls([(self, calls)])[0]

    def _checked(self, call: Any) -> tuple[str, tuple[Callable, dict] | str]:
        """(name, (tool, arguments)) for a call that may be made, else (name, why not)."""
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            kind = call.get("type") if isinstance(call, dict) else type(call).__name__
            return "unknown", f"Unsupported tool call type: {str(kind)[:50]}"
        function = call.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or name not in self.by_name:
            shown = name[:50] if isinstance(name, str) else "unknown"
            return shown, f"Tool {shown} not found."
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):  # some templates' parsers leave the JSON text
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                return name, "arguments are not valid JSON"
        if not isinstance(arguments, dict):
            return name, "arguments must be a JSON object"
        fn = self.by_name[name]
        try:
            inspect.signature(fn).bind(**arguments)
        except TypeError as e:
            return name, f"wrong arguments: {e}"
        properties = self.schemas[name]["function"]["parameters"].get("properties", {})
        for key, value in arguments.items():
            wanted = properties.get(key, {}).get("type")
            if wanted is not None and not _has_json_type(value, wanted):
                return name, f"wrong arguments: {key} must be {wanted}, got {type(value).__name__}"
        return name, (fn, arguments)


def run_tool_calls(turns: Sequence[tuple[ToolBox, list]], threads: int = TOOL_THREADS) -> list[list[ToolResult]]:
    """The results of several turns' tool calls, each turn (toolbox, its parsed calls) answered in its calls' order:
    all of them run concurrently, async tools awaited together in one event loop, sync tools in at most `threads`
    daemon threads at a time; every call fails alone at its toolbox's timeout_s, counted from its start."""
    results: list[list[ToolResult | None]] = [[None] * len(calls) for _, calls in turns]
    sync: list[tuple[int, int, str, Callable, dict, float]] = []  # (turn, position, name, tool, arguments, timeout)
    pending: list[tuple[int, int, str, Callable, dict, float]] = []  # the async ones
    for t, (box, calls) in enumerate(turns):
        for i, call in enumerate(calls):
            name, checked = box._checked(call)
            if isinstance(checked, str):  # the reason the call cannot be made
                results[t][i] = _failure(name, checked, 0.0, name in box.by_name)
                continue
            fn, arguments = checked
            (pending if inspect.iscoroutinefunction(fn) else sync).append((t, i, name, fn, arguments, box.timeout_s))
    awaited = None
    if pending:  # awaited in a thread of its own while the sync calls run here
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlhfkit-tools")
        awaited = pool.submit(asyncio.run, _call_async_together(pending))
        pool.shutdown(wait=False)
    for (t, i, *_), result in zip(sync, _call_sync_bounded(sync, threads)):
        results[t][i] = result
    if awaited is not None:
        for (t, i, *_), result in zip(pending, awaited.result()):
            results[t][i] = result
    return results  # type: ignore[return-value]


def _call_sync_bounded(calls: list[tuple[int, int, str, Callable, dict, float]], threads: int) -> list[ToolResult]:
    """Run sync tool calls in daemon threads, at most `threads` at once, each failing at its timeout (counted from its
    start; the thread of a call that timed out is abandoned, not waited for: Python cannot stop a thread)."""
    results: list[ToolResult | None] = [None] * len(calls)
    waiting, running = list(range(len(calls))), {}  # running: index -> (done, outcome, start)
    finished_one = threading.Event()
    while waiting or running:
        while waiting and len(running) < threads:
            k = waiting.pop(0)
            _, _, name, fn, arguments, _ = calls[k]
            running[k] = _start_thread(name, fn, arguments, finished_one)
        finished_one.clear()
        now = time.perf_counter()
        for k, (done, outcome, start) in list(running.items()):
            name, timeout_s = calls[k][2], calls[k][5]
            if done.is_set():
                latency = outcome["end"] - start
                error = outcome.get("error")
                results[k] = (
                    _failure(name, _describe(error), latency)
                    if error
                    else _result(name, outcome.get("value"), latency)
                )
            elif now - start >= timeout_s:
                results[k] = _failure(name, f"timed out after {timeout_s:g} s", now - start)
            else:
                continue
            del running[k]
        if running and not (waiting and len(running) < threads):
            deadline = min(start + calls[k][5] for k, (_, _, start) in running.items())
            finished_one.wait(max(0.0, deadline - time.perf_counter()))
    return results  # type: ignore[return-value]


def _start_thread(name: str, fn: Callable, arguments: dict, finished_one: threading.Event):
    """Start one sync tool call in a daemon thread: (its done event, its outcome dict, its start time)."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            outcome["value"] = fn(**arguments)
        except BaseException as e:  # noqa: BLE001 - anything a tool raises is its failure, not the run's
            outcome["error"] = e
        finally:
            outcome["end"] = time.perf_counter()
            done.set()
            finished_one.set()

    start = time.perf_counter()
    threading.Thread(target=target, name=f"rlhfkit-tool-{name}", daemon=True).start()
    return done, outcome, start


async def _call_async_together(pending: list[tuple[int, int, str, Callable, dict, float]]) -> list[ToolResult]:
    async def one(name: str, fn: Callable, arguments: dict, timeout_s: float) -> ToolResult:
        start = time.perf_counter()
        try:
            value = await asyncio.wait_for(fn(**arguments), timeout_s)
        except asyncio.TimeoutError:
            return _failure(name, f"timed out after {timeout_s:g} s", time.perf_counter() - start)
        except Exception as e:  # noqa: BLE001 - anything a tool raises is its failure
            return _failure(name, _describe(e), time.perf_counter() - start)
        return _result(name, value, time.perf_counter() - start)

    return list(await asyncio.gather(*(one(name, fn, args, timeout) for _, _, name, fn, args, timeout in pending)))


def _has_json_type(value: Any, wanted: str | list) -> bool:
    kinds = [wanted] if isinstance(wanted, str) else list(wanted)
    for kind in kinds:
        types = _JSON_TYPES.get(kind)
        if types is None:  # a type this check does not know: left to the tool
            return True
        if isinstance(value, types) and not (kind in ("integer", "number") and isinstance(value, bool)):
            return True
    return False


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _failure(name: str, text: str, latency_s: float, registered: bool = True) -> ToolResult:
    """A failed call's message: TRL's ``str({"error": text})``, the text cut to TOOL_ERROR_CHARS."""
    if len(text) > TOOL_ERROR_CHARS:
        text = text[:TOOL_ERROR_CHARS] + "..."
    return ToolResult(name, str({"error": text}), True, latency_s, registered)


def _result(name: str, value: Any, latency_s: float) -> ToolResult:
    """A tool's return value as the tool message's text: a string as it is, anything else str()'d (as TRL)."""
    if isinstance(value, str):
        return ToolResult(name, value, False, latency_s, True)
    try:
        text = str(value)
    except Exception as e:  # noqa: BLE001 - a result whose __str__ raises is the tool's failure
        return _failure(name, f"the result could not be turned into text: {_describe(e)}", latency_s)
    if not isinstance(text, str):
        return _failure(name, "the result could not be turned into text", latency_s)
    return ToolResult(name, text, False, latency_s, True)
