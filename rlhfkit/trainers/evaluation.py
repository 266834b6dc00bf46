"""An evaluation's completions, as both trainers make them: this process's share of the eval prompts, completed by the
policy's whole weights (multi-turn episodes with tools), and the task checker's verdicts."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from datasets import Dataset
from torch import nn
from transformers import GenerationConfig

from rlhfkit.agents.episodes import sample_episodes
from rlhfkit.metrics import registry as M
from rlhfkit.metrics.accumulate import MetricAccumulator
from rlhfkit.sampling import Chunk, complete
from rlhfkit.tracking.progress import progress_bar
from rlhfkit.trainers.run import TrainingRun


class EvalChunk(NamedTuple):
    """One chunk of the evaluation prompts with their completions."""

    rows: list[dict]  # the chunk's dataset rows
    chunk: Chunk
    own: int  # how many of the first rows are this process's own; the rest pad the processes to one length
    messages: list[list[dict]] | None = None  # multi-turn episodes (with tools): each one's messages


def eval_chunks(
    run: TrainingRun,
    model: nn.Module,
    dataset: Dataset,
    config: GenerationConfig,
    batch_size: int,
    policy_of: Callable[[nn.Module], nn.Module] = lambda model: model,
    repeat: int = 1,
    episodes=None,
    metrics: MetricAccumulator | None = None,
) -> list[EvalChunk]:
    """Completions of this process's share of the eval prompts (each `repeat` times), sampled with `config` by the
    policy of the prepared `model` (`policy_of(unwrapped model)`) with its whole weights, in chunks of `batch_size`;
    multi-turn episodes with their tools when `episodes` (agents.episodes' ToolEpisodes or CustomRollout) is given,
    their eval/tools/* metrics added to `metrics` (the evaluation's accumulator).

    Where forwards run in lockstep (ZeRO-3, FSDP), the shares are padded to one length: score every row of a chunk
    (the reward models run in lockstep too), then report the first `own` only."""
    rows, own = run.local_rows(dataset)
    rows, own = [row for row in rows for _ in range(repeat)], own * repeat
    with run.gathered(model) as unwrapped:
        unwrapped.eval()
        prompts = [row["input_ids"] for row in rows]
        device = run.accelerator.device
        chunks: list[tuple[Chunk, list | None]] = []
        # Beneath training's bar, on the main process only (its share of the prompts).
        show = run.accelerator.is_main_process
        with progress_bar(len(prompts), "evaluation completions", run.logger.console, show) as advance:
            if episodes is None:
                for chunk in complete(policy_of(unwrapped), prompts, config, batch_size, device):
                    chunks.append((chunk, None))
                    advance(len(chunk.prompt_ids))
            else:  # with environments, the rows as their episodes began (reset's prompt, the instances)
                for start in range(0, len(prompts), batch_size):
                    (sampled,), rows[start : start + batch_size] = sample_episodes(
                        episodes, policy_of(unwrapped), rows[start : start + batch_size], config, batch_size, device,
                        metrics, evaluation=True,
                    )  # fmt: skip
                    chunks.append((sampled.chunk, sampled.messages))
                    advance(len(sampled.chunk.prompt_ids))
        unwrapped.train()
    return [
        EvalChunk(rows[start : start + batch_size], chunk, max(0, min(batch_size, own - start)), messages)
        for start, (chunk, messages) in zip(range(0, len(rows), batch_size), chunks)
    ]


def count_task_success(
    metrics: MetricAccumulator, metric: M.Metric, task, prompts: list, completions: list[str]
) -> list[bool] | None:
    """Add how many `completions` the task's checker passes to `metric` (rollout/ or eval/task_success) and return
    each verdict; None without a task. prompts: the dataset's prompts (a truncated query could not be checked)."""
    if task is None:
        return None
    correct = [task.check(prompt, completion) for prompt, completion in zip(prompts, completions)]
    metrics.add(metric, float(sum(correct)), len(correct))
    return correct
