"""Scoring completions, as both trainers score them in training and in evaluation: every reward source's values for a
chunk (score_chunk), and what the reward functions logged meanwhile (TRL 1.16's log_extra and log_metric)."""

from __future__ import annotations

from rlhfkit.rewards import RewardOutput, RewardSources


def score_chunk(rewards: RewardSources, rows: list[dict], prompts: list, completions: list, chunk, state):
    """Each reward source's values (RewardOutput, in the sources' order) for the completions of `chunk` (a Chunk, or
    a batch with its input_ids, attention_mask, completion_ids and completion_mask: what the reward models that read
    the policy's tokens score), given to the reward functions as `completions` (texts, or each episode's messages)
    with the dataset `rows` and their `prompts`; `state` is the trainer's TrainerState (TRL's trainer_state)."""
    sequence = (chunk.input_ids, chunk.attention_mask)
    completion = (chunk.completion_ids, chunk.completion_mask)
    outputs: list[RewardOutput] = rewards.score(rows, prompts, completions, sequence, completion, trainer_state=state)
    return outputs


def take_reward_logs(
    rewards: RewardSources, accelerator, prefix: str = ""
) -> tuple[dict[str, list], dict[str, float]]:
    """What the reward functions logged since the last call (TRL 1.16's log_extra and log_metric): the extra columns
    of the completions table, one value per completion scored, and the log_metric values pooled over the processes
    (a collective), named `prefix` + name; NaN means none was logged."""
    columns, metrics = rewards.take_logged()
    pooled = rewards.pool_metrics(metrics, accelerator)
    return columns, {f"{prefix}{name}": value for name, value in pooled.items()}
