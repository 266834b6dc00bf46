"""Agent training, for both trainers and evaluation: the tools a policy may call during its episodes (tools.py), the
environments that begin and score them (environments.py) and the multi-turn episode loop itself, entered through
`sample_episodes` (episodes.py); docs/agents.md describes the interface."""

from rlhfkit.agents.tools import TOOL_ERROR_CHARS, TOOL_TIMEOUT_S, ToolBox, ToolResult

__all__ = ["TOOL_ERROR_CHARS", "TOOL_TIMEOUT_S", "ToolBox", "ToolResult"]
