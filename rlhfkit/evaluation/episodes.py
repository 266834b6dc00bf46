"""Judging an agent on greedy multi-turn episodes whose tools run (the agent task's calculator): each model's episodes
sampled as the trainers sample them (agents.episodes), the task's checker on each episode's final answer, the win rate
tallied as every TaskJudge's, and each side's accuracy and tool use. `rlhfkit eval` and the quickstart judge the agent
task with it."""

from __future__ import annotations

from typing import NamedTuple

import torch

from rlhfkit.agents import ToolBox
from rlhfkit.agents.episodes import ToolEpisodes, sample_episodes
from rlhfkit.data import prompt_text
from rlhfkit.sampling import decode, sampling_config, terminator_ids

from .compare import Comparison, judge_completions
from .completions import Generations, load_generator
from .judges import TaskJudge


class EpisodeRun(NamedTuple):
    """Greedy episodes of one model, one per prompt: each episode's messages after the prompt (TRL's completions),
    its text as the model read it (turns and tool results, special tokens kept), whether it ended without a
    terminator (cut by the length budget), and its tool calls."""

    messages: list[list[dict]]
    texts: list[str]
    truncated: list[bool]
    tool_calls: list[int]


def greedy_episodes(model_path: str, task, prompts: list[list[dict]], flag: str, batch_size: int = 64) -> EpisodeRun:
    """Greedy multi-turn episodes of the model at `model_path` on conversational `prompts`, the task's tools run:
    the trainers' episodes (agents/episodes.py) with its tool rounds and length budget, prompts rendered with the
    tools as the trainers render them."""
    from rlhfkit.tasks.agent import tool_calls

    model, tokenizer = load_generator(model_path, flag)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    tools = list(task.tools)
    episodes = ToolEpisodes(tokenizer, ToolBox(tools), task.max_tool_calling_iterations, task.max_new_tokens)
    config = sampling_config(task.max_new_tokens, None, tokenizer.pad_token_id, terminator_ids(tokenizer, model))
    rows = [
        {"input_ids": tokenizer(prompt_text(p, tokenizer, None, tools), add_special_tokens=False)["input_ids"]}
        for p in prompts
    ]
    out = EpisodeRun([], [], [], [])
    with torch.inference_mode():
        for sampled in sample_episodes(episodes, model, rows, config, batch_size, device)[0]:
            chunk = sampled.chunk
            out.messages.extend(sampled.messages)
            out.texts.extend(decode(tokenizer, chunk.completion_ids, chunk.completion_mask, skip_special_tokens=False))
            out.truncated.extend((~chunk.terminated).tolist())
    out.tool_calls.extend(tool_calls(m) for m in out.messages)
    return out


def judge_episodes(model_path: str, baseline_path: str, task, prompts: list[list[dict]], batch_size: int = 64):
    """The trained policy (A) against the SFT model (B) on greedy episodes, judged by the task's checker on each
    episode's final answer, the win rate tallied as every TaskJudge's (evaluation.judge_completions). Returns the
    Comparison (prompts as the user's questions, texts as the episodes read) and each side's accuracy and tool calls
    per episode."""
    from rlhfkit.tasks.agent import question

    model = greedy_episodes(model_path, task, prompts, "model", batch_size)
    baseline = greedy_episodes(baseline_path, task, prompts, "baseline", batch_size)
    questions = [question(p) for p in prompts]
    judge = TaskJudge(task.check, name=f"task:{task.name}")
    verdicts, win_rates = judge_completions([judge], questions, model.messages, baseline.messages)
    comparison = Comparison(
        questions,
        Generations(model.texts, model.truncated),
        Generations(baseline.texts, baseline.truncated),
        verdicts,
        win_rates,
    )

    def summary(run: EpisodeRun) -> dict:
        correct = [task.check(q, m) for q, m in zip(questions, run.messages)]
        return {
            "accuracy": sum(correct) / len(correct),
            "tool_calls_per_episode": sum(run.tool_calls) / len(run.tool_calls),
            "episodes_calling_a_tool": sum(c > 0 for c in run.tool_calls) / len(run.tool_calls),
        }

    return comparison, {"policy": summary(model), "sft": summary(baseline)}
