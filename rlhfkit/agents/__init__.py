"""Agent training: the tools a policy may call during its episodes (tools.py). The multi-turn episodes themselves are
sampled by the trainers' generation (agents/episodes.py); docs/agents.md describes the interface."""

from rlhfkit.agents.tools import TOOL_ERROR_CHARS, TOOL_TIMEOUT_S, ToolBox, ToolResult

__all__ = ["TOOL_ERROR_CHARS", "TOOL_TIMEOUT_S", "ToolBox", "ToolResult"]
