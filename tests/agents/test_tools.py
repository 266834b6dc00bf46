"""agents/tools.py: tool schemas are transformers' own, and the model's calls are data: only registered tools by
name, JSON-object arguments bound to the signature and typed by the schema, every failure a bounded error message."""

import asyncio
import threading
import time

import pytest
from transformers.utils import get_json_schema

from rlhfkit.agents import TOOL_ERROR_CHARS, ToolBox
from rlhfkit.agents.tools import run_tool_calls
from rlhfkit.errors import ConfigError


def multiply(a: int, b: int) -> int:
    """Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


async def slow_add(a: int, b: int) -> int:
    """Adds two integers, slowly.

    Args:
        a: The first integer.
        b: The second integer.
    """
    await asyncio.sleep(0.3)
    return a + b


async def never(x: str) -> str:
    """Never returns.

    Args:
        x: Anything.
    """
    await asyncio.sleep(60)
    return x


def fails(x: str) -> str:
    """Raises with the argument in the message.

    Args:
        x: Anything.
    """
    raise ValueError(x)


def echo(x: str) -> dict:
    """Returns a dict.

    Args:
        x: Anything.
    """
    return {"echo": x}


def call(name, arguments=None, kind="function"):
    return {"type": kind, "function": {"name": name, "arguments": {} if arguments is None else arguments}}


@pytest.fixture
def box():
    return ToolBox([multiply, slow_add, never, fails, echo], timeout_s=0.5)


def test_schemas_are_transformers_own(box):
    assert box.names == ["multiply", "slow_add", "never", "fails", "echo"]
    assert box.schemas["multiply"] == get_json_schema(multiply)


def test_a_tool_without_a_documented_signature_or_a_repeated_name_is_refused():
    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ConfigError, match="tool 'undocumented'.*Google-style docstring"):
        ToolBox([undocumented])
    with pytest.raises(ConfigError, match="Two tools are named 'multiply'"):
        ToolBox([multiply, multiply])
    with pytest.raises(ConfigError, match="a list of functions"):
        ToolBox(multiply)


def test_calls_run_and_results_become_text(box):
    (product, as_text, dict_result) = box.run(
        [call("multiply", {"a": 3, "b": 4}), call("multiply", '{"a": 2, "b": 5}'), call("echo", {"x": "hi"})]
    )
    assert (product.name, product.content, product.failed, product.registered) == ("multiply", "12", False, True)
    assert as_text.content == "10"  # arguments given as JSON text are parsed
    assert dict_result.content == "{'echo': 'hi'}" and not dict_result.failed  # str() of a non-string, as TRL


def test_async_tools_of_a_turn_are_awaited_together(box):
    start = time.perf_counter()
    results = box.run(
        [call("slow_add", {"a": 1, "b": 2}), call("multiply", {"a": 2, "b": 2}), call("slow_add", {"a": 2, "b": 2})]
    )
    elapsed = time.perf_counter() - start
    assert [r.content for r in results] == ["3", "4", "4"]  # in the calls' order
    assert elapsed < 0.55  # two 0.3 s tools together, not one after the other
    assert all(r.latency_s >= 0.3 for r in (results[0], results[2]))


def test_hostile_calls_fail_with_a_bounded_error_and_nothing_runs(box):
    deep = "[" * 100_000 + "]" * 100_000
    calls = [
        call("__import__", {"name": "os"}),  # not a registered tool: never looked up elsewhere
        call("__class__"),
        call("multiply", {"a": 1, "b": 2, "__builtins__": {}}),  # an argument the signature does not take
        call("multiply", {"a": "1", "b": 2}),  # the schema's type
        call("multiply", {"a": True, "b": 2}),  # a bool is not an integer
        call("multiply", {"a": 1}),  # missing
        call("multiply", [1, 2]),  # not an object
        call("multiply", deep),  # nested past the JSON parser's recursion limit
        call("multiply", "{not json"),
        call("multiply", {"a": 1, "b": 2}, kind="code_interpreter"),
        "multiply(1, 2)",
        call(["multiply"]),
        call("x" * 10_000),
        call("fails", {"x": "y" * 10_000}),  # a huge error message, cut
    ]
    results = box.run(calls)
    assert all(r.failed for r in results)
    assert all(r.content.startswith("{'error': ") for r in results)
    assert all(len(r.content) <= TOOL_ERROR_CHARS + 20 for r in results)
    assert results[0].content == "{'error': 'Tool __import__ not found.'}" and not results[0].registered
    assert "unexpected keyword argument '__builtins__'" in results[2].content
    assert "a must be integer, got str" in results[3].content and "got bool" in results[4].content
    assert "missing a required argument: 'b'" in results[5].content
    assert "must be a JSON object" in results[6].content
    assert "not valid JSON" in results[7].content and "not valid JSON" in results[8].content
    assert "Unsupported tool call type: code_interpreter" in results[9].content
    assert results[13].registered and "ValueError: yyy" in results[13].content


def test_timeouts_fail_the_call_and_the_caller_goes_on():
    release = threading.Event()

    def stuck(x: str) -> str:
        """Blocks.

        Args:
            x: Anything.
        """
        release.wait(30)
        return x

    box = ToolBox([stuck, never, multiply], timeout_s=0.2)
    try:
        start = time.perf_counter()
        results = box.run([call("stuck", {"x": "a"}), call("never", {"x": "b"}), call("multiply", {"a": 1, "b": 1})])
        elapsed = time.perf_counter() - start
    finally:
        release.set()
    assert [r.failed for r in results] == [True, True, False]
    assert results[0].content == results[1].content == "{'error': 'timed out after 0.2 s'}"
    assert elapsed < 1.0 and results[0].latency_s >= 0.2


# ----------------------------------------------------------------------------------------------------------------
# A batch's calls (run_tool_calls): every episode's calls of a round run at once, sync ones in bounded threads.


def rendezvous_tools(parties: int):
    """A sync and an async tool that each return only once `parties` calls of its kind are running together (each
    waits at most 2 s, then fails): they pass only where the calls run concurrently."""
    barrier = threading.Barrier(parties, timeout=2.0)
    arrived = {"n": 0}

    def meet(x: int) -> int:
        """Waits for the others.

        Args:
            x: Anything.
        """
        barrier.wait()
        return x

    async def async_meet(x: int) -> int:
        """Waits for the others.

        Args:
            x: Anything.
        """
        arrived["n"] += 1
        for _ in range(200):
            if arrived["n"] >= parties:
                return x
            await asyncio.sleep(0.01)
        raise TimeoutError("alone")

    return meet, async_meet


def test_a_batch_s_calls_of_different_episodes_run_together():
    meet, async_meet = rendezvous_tools(4)
    box = ToolBox([meet, async_meet], timeout_s=5.0)
    # four episodes, one sync call each: they meet only when all four run at once
    results = run_tool_calls([(box, [call("meet", {"x": i})]) for i in range(4)])
    assert [r[0].content for r in results] == ["0", "1", "2", "3"]
    # four episodes' async calls are awaited in one event loop, together
    results = run_tool_calls([(box, [call("async_meet", {"x": i})]) for i in range(4)])
    assert [r[0].content for r in results] == ["0", "1", "2", "3"] and not any(r[0].failed for r in results)


def test_sync_calls_run_at_most_threads_at_once():
    meet, _ = rendezvous_tools(3)
    box = ToolBox([meet], timeout_s=5.0)
    # 2 threads: the third call starts only when one of the first two ends, which waits for 3 to meet: none meets
    results = run_tool_calls([(box, [call("meet", {"x": i})]) for i in range(3)], threads=2)
    assert all(r[0].failed and "BrokenBarrierError" in r[0].content for r in results)
    meet, _ = rendezvous_tools(3)
    box = ToolBox([meet], timeout_s=5.0)
    assert not any(r[0].failed for r in run_tool_calls([(box, [call("meet", {"x": i})]) for i in range(3)], threads=3))


def test_a_waiting_call_s_timeout_counts_from_its_own_start():
    def nap(x: int) -> int:
        """Sleeps 0.1 s.

        Args:
            x: Anything.
        """
        time.sleep(0.1)
        return x

    box = ToolBox([nap], timeout_s=0.35)
    # one thread: four calls one after another take 0.4 s in all, each well within its own 0.35 s
    results = run_tool_calls([(box, [call("nap", {"x": i})]) for i in range(4)], threads=1)
    assert [r[0].content for r in results] == ["0", "1", "2", "3"]


def test_each_turn_keeps_its_calls_order_and_failures():
    box = ToolBox([multiply, slow_add, fails], timeout_s=2.0)
    turns = [
        (box, [call("slow_add", {"a": 1, "b": 2}), call("multiply", {"a": 2, "b": 3})]),
        (box, [call("fails", {"x": "boom"}), call("nope")]),
        (box, []),
    ]
    results = run_tool_calls(turns)
    assert [[r.content for r in turn] for turn in results[:1]] == [["3", "6"]]
    assert [r.failed for r in results[1]] == [True, True] and "ValueError: boom" in results[1][0].content
    assert results[1][1].content == "{'error': 'Tool nope not found.'}" and results[2] == []
