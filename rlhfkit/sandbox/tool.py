"""The ``python`` tool an agent's policy may call (TRL's tool conventions: a typed function with a Google-style
docstring, returning a string), running the model's code in the sandbox.

What the model gets back is what the program printed, then, when it ended otherwise than "ok", a last line saying
how; all of it short enough for a conversation (TOOL_OUTPUT_BYTES of each stream). The program runs with TOOL_LIMITS,
under the agent loop's own per-call timeout (agents/tools.py), which is longer. A tool with other limits:
make_python_tool(**limits).
"""

from __future__ import annotations

from collections.abc import Callable

from .limits import SandboxLimits, limits_from
from .result import SandboxResult
from .run import run_code

TOOL_OUTPUT_BYTES = 2000
TOOL_LIMITS = SandboxLimits(timeout_s=10.0, max_output_bytes=TOOL_OUTPUT_BYTES)


def tool_reply(result: SandboxResult) -> str:
    """The text the model reads: stdout, then stderr, then a line naming a status other than "ok"."""
    parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
    if result.stderr.strip():
        parts.append(result.stderr.rstrip("\n"))
    if result.status != "ok":
        endings = {
            "timeout": "[stopped: it ran past the time limit]",
            "memory": "[stopped: it ran out of memory]",
            "output_limit": "[stopped: it printed more than the output limit; output cut]",
            "disk": "[stopped: it wrote more than its disk space]",
            "error": f"[exit status {result.exit_code}]",
        }
        parts.append(endings[result.status])
    return "\n".join(parts) if parts else "[no output]"


def make_python_tool(
    *, python: str | None = None, allow_unsandboxed: bool = False, limits: SandboxLimits | None = None, **overrides
) -> Callable[[str], str]:
    """A ``python`` tool with its own limits (default TOOL_LIMITS), interpreter and mode (run_code's keywords)."""
    limits = limits_from(limits or TOOL_LIMITS, **overrides)

    def python_tool(code: str) -> str:
        """Run a Python program in an isolated sandbox (no network, no files but its own) and return what it printed.

        Args:
            code: A complete Python program; print the values you want to see.
        """
        result = run_code(code, python=python, allow_unsandboxed=allow_unsandboxed, limits=limits)
        return tool_reply(result)

    python_tool.__name__ = python_tool.__qualname__ = "python"
    return python_tool


python = make_python_tool()
