"""What samples a trainer's completions, as its generation module receives it (ppo/generation.py,
grpo/generation.py): the sampler's settings, multi-turn episodes in place of plain completions, the generation worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from transformers import GenerationConfig


class Sampler(NamedTuple):
    """config(max_new_tokens): the training sampler's GenerationConfig (a health injection may replace it); episodes:
    agents.episodes' ToolEpisodes (tools, environments) or CustomRollout (a rollout_func), None for plain
    completions; worker: the generation worker of --async_generation (generation_worker.AsyncGeneration), or None."""

    config: Callable[[int], GenerationConfig]
    episodes: Any = None
    worker: Any = None
