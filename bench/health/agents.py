"""The agent task's failures, for the labelled run set: rewards with a flaw and injections into a built trainer whose
episodes call the calculator (rlhfkit/tasks/agent.py). Each is one mistake people make when they train agents:

* ``parser_mismatch``: the tokenizer's response_template reads another model family's call tags, so no call the model
  writes parses and no tool ever runs (tools offered, never called);
* ``flaky_tool``: the calculator fails most calls (a service that times out, a sandbox that is down);
* ``pays_per_call`` with ``max_tool_calling_iterations 0``: a reward for well-formed calls and a turn cap the task
  cannot work within, so episodes end at the cap with their call unanswered;
* ``format_and_brevity``: a grader that checks the answer's shape (digits, of the right count) and pays for short
  episodes, so answering from memory earns more than calling the tool.
"""

from __future__ import annotations

import copy
import random

from rlhfkit.tasks.agent import answer, final_answer, tool_calls


def pays_per_call(prompts, completions, **kwargs):
    """1 for an episode that made a well-formed tool call, answered or not: a tool-use bonus with no correctness."""
    return [float(tool_calls(c) > 0) for c in completions]


def format_and_brevity(prompts, completions, completion_ids, **kwargs):
    """1 for a final answer of digits with as many digits as the product's (not checked against it), minus 0.01 per
    completion token: a shape check and a length penalty, under which a guess beats a call."""
    out = []
    for prompt, completion, ids in zip(prompts, completions, completion_ids, strict=True):
        given = (final_answer(completion) or "").strip()
        shaped = given.isdigit() and len(given) == len(answer(prompt))
        out.append(float(shaped) - 0.01 * len(ids))
    return out


def parser_mismatch(trainer) -> None:
    """The tokenizer parses calls between <function_call> tags, which the model never writes (a response_template
    copied from another model family)."""
    tok = trainer.tokenizer
    template = copy.deepcopy(tok.response_template)
    template["fields"]["tool_calls"]["open"] = "<function_call>"
    tok.response_template = template


def flaky_tool(trainer, failure_rate: float = 0.8, seed: int = 0) -> None:
    """The calculator raises on `failure_rate` of its calls (a flaky service), from the first step."""
    toolbox = trainer.episodes.toolbox
    calculator, rng = toolbox.by_name["calculator"], random.Random(seed)

    def flaky(expression: str) -> str:
        if rng.random() < failure_rate:
            raise ConnectionError("calculator service unavailable")
        return calculator(expression)

    flaky.__name__, flaky.__doc__ = calculator.__name__, calculator.__doc__
    toolbox.by_name["calculator"] = flaky


INJECTIONS = {"parser_mismatch": parser_mismatch, "flaky_tool": flaky_tool}


# The labelled agent runs (the agent task's built-in settings, then these flags): name suffix -> (mode, algorithm,
# flags, injection, seeds). specs.py makes them Specs of the "agents" split.
_GRPO_SHORT, _PPO_SHORT = {"max_steps": 25}, {"total_episodes": 1024}
RUNS = {
    "healthy-agent-grpo-default": ("healthy", "grpo", {}, (), (0, 1)),
    "healthy-agent-ppo-default": ("healthy", "ppo", {}, (), (0, 1)),
    "healthy-agent-grpo-lr1e-4": ("healthy", "grpo", {"learning_rate": 1e-4}, (), (2,)),
    "healthy-agent-ppo-kl0.2": ("healthy", "ppo", {"kl_coef": 0.2}, (), (2,)),
    "tools_unused-agent-grpo-parser": ("tools_unused", "grpo", _GRPO_SHORT, ("parser_mismatch", {}), (0, 1)),
    "tools_unused-agent-ppo-parser": ("tools_unused", "ppo", _PPO_SHORT, ("parser_mismatch", {}), (0,)),
    "tool_failing-agent-grpo-flaky0.8": ("tool_failing", "grpo", _GRPO_SHORT, ("flaky_tool", {}), (0, 1)),
    "tool_failing-agent-ppo-flaky0.8": ("tool_failing", "ppo", _PPO_SHORT, ("flaky_tool", {}), (0,)),
    "turn_cap-agent-grpo-cap0": (
        "turn_cap",
        "grpo",
        {**_GRPO_SHORT, "max_tool_calling_iterations": 0, "reward_funcs": "bench.health.agents:pays_per_call"},
        (),
        (0, 1),
    ),
    "turn_cap-agent-ppo-cap0": (
        "turn_cap",
        "ppo",
        {**_PPO_SHORT, "max_tool_calling_iterations": 0, "reward_funcs": "bench.health.agents:pays_per_call"},
        (),
        (0,),
    ),
    "tools_abandoned-agent-grpo-format": (
        "tools_abandoned",
        "grpo",
        {**_GRPO_SHORT, "reward_funcs": "bench.health.agents:format_and_brevity"},
        (),
        (0, 1),
    ),
    "tools_abandoned-agent-ppo-format": (  # PPO (KL-penalised) leaves the tool more slowly than GRPO: 64 updates
        "tools_abandoned",
        "ppo",
        {"total_episodes": 4096, "reward_funcs": "bench.health.agents:format_and_brevity"},
        (),
        (0,),
    ),
}
MODES = {
    "tools_unused": "the tokenizer's response_template reads another model family's call tags: no call the model "
    "writes parses, so no tool ever runs",
    "tool_failing": "the calculator fails 80% of its calls (a flaky service)",
    "turn_cap": "max_tool_calling_iterations 0 (no round of results) and a reward for well-formed calls: episodes end "
    "on a call the cap leaves unanswered",
    "tools_abandoned": "a grader of the answer's shape (digits, of the product's length) with a length penalty: a "
    "guess from memory earns more than a call",
}
