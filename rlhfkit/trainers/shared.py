"""What PPO and GRPO do alike around their loops: tokenizing the prompts, preparing the trained models for the
engine, generating the evaluation's completions and counting true success. Each trainer's loop stays its own
(ppo.py, grpo.py); the run lifecycle both hold is run.py."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, TypeAlias

import torch
from datasets import Dataset, IterableDataset
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

from rlhfkit.agents import ToolBox
from rlhfkit.agents.environments import ROUTE_COLUMN
from rlhfkit.data import is_conversational, tokenize_prompts
from rlhfkit.errors import ConfigError, DataError
from rlhfkit.metrics import registry as M
from rlhfkit.metrics.accumulate import MetricAccumulator
from rlhfkit.models import enable_gradient_checkpointing, padding_free_refused
from rlhfkit.optim import make_optimizer
from rlhfkit.rewards import RewardSources
from rlhfkit.sampling import Chunk, complete
from rlhfkit.tracking.progress import progress_bar
from rlhfkit.trainers.episodes import ToolEpisodes
from rlhfkit.trainers.run import TrainingRun

EvalDatasets: TypeAlias = "Dataset | Mapping[str, Dataset]"  # one evaluation set, or several by name


def tokenize_datasets(
    args,
    tokenizer: PreTrainedTokenizerBase,
    train_dataset: Dataset,
    eval_dataset: EvalDatasets | None,
    tools: list | None = None,
) -> tuple[Dataset, EvalDatasets | None]:
    """The train and eval prompts with their token ids (data.tokenize_prompts: --dataset_text_field,
    --max_prompt_length, --prompt_overflow, --dataset_num_proc); conversations rendered with `tools` (GRPO's)."""
    if isinstance(train_dataset, IterableDataset):
        raise ConfigError(
            "train_dataset is a streamed IterableDataset: GRPOTrainer takes one with max_steps (TRL 1.16's GRPO), "
            "PPOTrainer does not (neither did TRL's PPO). Load it as a Dataset, or take the rows you need: "
            "Dataset.from_list(list(stream.take(n)))."
        )
    train = _tokenized(args, tokenizer, train_dataset, "", tools)
    return train, (None if eval_dataset is None else tokenize_eval_dataset(args, tokenizer, eval_dataset, tools))


def take_streamed(dataset: IterableDataset, rows: int) -> Dataset:
    """The first `rows` rows of a streamed train set (an IterableDataset: load_dataset(..., streaming=True)), held in
    memory: the prompts a run of max_steps steps draws, in the stream's order, as TRL's loader reads them. A run
    that draws more (dynamic sampling's extra rounds) starts them over, as another pass over the stream would; a
    resumed run takes the same rows again."""
    taken = list(itertools.islice(dataset, rows))
    if not taken:
        raise DataError("The streamed train_dataset yielded no rows: it needs at least one prompt.")
    return Dataset.from_list(taken)


def tokenize_eval_dataset(
    args, tokenizer: PreTrainedTokenizerBase, dataset: EvalDatasets, tools: list | None = None
) -> EvalDatasets:
    """Evaluation prompts with their token ids, as the trainer's eval_dataset is tokenized (trainer.evaluate()'s
    eval_dataset too). Several named sets (a dict or DatasetDict, as transformers' Trainer takes them: each is
    evaluated and logged under eval_<name>) give a dict of the same names."""
    if (
        isinstance(dataset, IterableDataset)
        or isinstance(dataset, Mapping)
        and any(isinstance(part, IterableDataset) for part in dataset.values())
    ):
        raise ConfigError(
            "eval_dataset is a streamed IterableDataset: an evaluation reads every prompt of its set. Take the rows "
            "to evaluate on: Dataset.from_list(list(stream.take(n)))."
        )
    if not isinstance(dataset, Mapping):
        return _tokenized(args, tokenizer, dataset, "eval ", tools)
    if not dataset:
        raise ConfigError("eval_dataset={}: no evaluation set. Pass a dataset, a dict of named datasets, or None.")
    for name in dataset:
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigError(
                f"eval_dataset: the set name {name!r} must be a non-empty string without '/': its metrics are "
                "logged as eval_<name>/... (e.g. {'easy': ..., 'hard': ...})."
            )
    return {name: _tokenized(args, tokenizer, part, f"eval {name!r} ", tools) for name, part in dataset.items()}


def _tokenized(
    args, tokenizer: PreTrainedTokenizerBase, dataset: Dataset, flag_prefix: str, tools: list | None = None
) -> Dataset:
    text, limit, overflow = args.dataset_text_field, args.max_prompt_length, args.prompt_overflow
    return tokenize_prompts(
        dataset,
        tokenizer,
        text,
        limit,
        flag_prefix,
        overflow,
        num_proc=args.dataset_num_proc,
        chat_template_kwargs=getattr(args, "chat_template_kwargs", None),  # GRPO's (TRL 1.12's PPO has none)
        tools=tools,
    )


def prepare_trained(
    run: TrainingRun, module: nn.Module, policy: nn.Module, checkpointed: Iterable[nn.Module]
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The trained `module` and its optimizer (--optim, over its trainable parameters), prepared by accelerate for the
    launch's engine; with --gradient_checkpointing, the `checkpointed` models recompute their activations. With
    --padding_free, a `policy` whose forward cannot take a packed batch is refused first."""
    args = run.args
    if args.padding_free and (why := padding_free_refused(policy)) is not None:
        raise ConfigError(
            f"--padding_free true: {why}. Load the model with an attention implementation that packs "
            "(--attn_implementation sdpa, or flash_attention_2 on a GPU), or leave --padding_free off."
        )
    if args.gradient_checkpointing:
        for model in checkpointed:
            enable_gradient_checkpointing(model, args.gradient_checkpointing_kwargs)
    optimizer = make_optimizer([p for p in module.parameters() if p.requires_grad], args, run.accelerator.device)
    return run.accelerator.prepare(module, optimizer)


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
) -> list[EvalChunk]:
    """Completions of this process's share of the eval prompts (each `repeat` times), sampled with `config` by the
    policy of the prepared `model` (`policy_of(unwrapped model)`) with its whole weights, in chunks of `batch_size`;
    multi-turn episodes with their tools when `episodes` (a trainers.episodes.ToolEpisodes) is given.

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
                    sampled, rows[start : start + batch_size] = episodes.sample_rows(
                        policy_of(unwrapped), rows[start : start + batch_size], config, device
                    )
                    chunks.append((sampled.chunk, sampled.messages))
                    advance(len(sampled.messages))
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


def log_sampling_mismatch(
    metrics: MetricAccumulator, logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, mask: torch.Tensor
) -> None:
    """The sampling/* metrics: how far the training forward's log-probs `logprobs` (B, T) are from the sampler's
    (B, T) on the same weights, over the tokens of `mask` (B, T) bool. Call it only before any optimizer step on
    the generation: afterwards the gap includes the update."""
    gap = (logprobs.detach().double() - sampling_logprobs.double()).masked_fill(~mask, 0.0)
    metrics.add_tensor(M.SAMPLING_LOGP_DIFFERENCE_MEAN, gap.abs(), mask)
    metrics.add_tensor(M.SAMPLING_LOGP_DIFFERENCE_MAX, gap.abs(), mask)
    metrics.add_tensor(M.SAMPLING_MISMATCHED_TOKENS, (gap.abs() > M.MISMATCH_NATS).double(), mask)
    ratio = gap.exp()
    for metric in (M.SAMPLING_IS_RATIO_MEAN, M.SAMPLING_IS_RATIO_MIN, M.SAMPLING_IS_RATIO_MAX):
        metrics.add_tensor(metric, ratio, mask)


def take_reward_logs(
    rewards: RewardSources, accelerator, prefix: str = ""
) -> tuple[dict[str, list], dict[str, float]]:
    """What the reward functions logged since the last call (TRL 1.16's log_extra and log_metric): the extra columns
    of the completions table, one value per completion scored, and the log_metric values pooled over the processes
    (a collective), named `prefix` + name; NaN means none was logged."""
    columns, metrics = rewards.take_logged()
    pooled = rewards.pool_metrics(metrics, accelerator)
    return columns, {f"{prefix}{name}": value for name, value in pooled.items()}


# Tools (tools=[...], docs/agents.md): what a trainer checks and builds for multi-turn episodes, PPO's and GRPO's alike.
def tool_episodes(
    trainer: str,
    toolbox: ToolBox | None,
    tokenizer,
    train_dataset: Dataset,
    args,
    max_completion_length: int,
    environments=None,
) -> ToolEpisodes | None:
    """The sampler of multi-turn episodes with `toolbox`'s tools (None without tools), each episode's completion at
    most `max_completion_length` tokens (GRPO's max_completion_length, PPO's response_length), at most
    args.max_tool_calling_iterations rounds of tool results; `environments` (agents.Environments, GRPO's
    environment_factory) begin each episode. The tokenized `train_dataset`'s prompts must be conversations: the chat
    template renders them with the tools and the tokenizer parses the episodes; with a dict of environments each row
    names its own in an ``environment`` column."""
    if toolbox is None:
        return None
    if not is_conversational(train_dataset[0][args.dataset_text_field]):
        raise ConfigError(
            f"{trainer}(tools=...) needs conversational prompts (lists of {{'role', 'content'}} messages), which the "
            "chat template renders with the tools and whose episodes the tokenizer parses; the "
            f"{args.dataset_text_field!r} column holds text."
        )
    if environments is not None and environments.multi:
        if ROUTE_COLUMN not in train_dataset.column_names:
            raise DataError(
                f"environment_factory is a dict of environments, so each row names its own in an {ROUTE_COLUMN!r} "
                f"column, which the train_dataset lacks (columns: {', '.join(train_dataset.column_names)})."
            )
        environments.check_routes(train_dataset[ROUTE_COLUMN])
    return ToolEpisodes(
        tokenizer,
        toolbox,
        args.max_tool_calling_iterations,
        max_completion_length,
        getattr(args, "chat_template_kwargs", None),  # GRPO's (TRL 1.12's PPO has none)
        environments,
        args.dataset_text_field,
        args.max_prompt_length,
    )


def tool_metrics(toolbox: ToolBox | None) -> list[M.Metric]:
    """The per-tool metrics a run with `toolbox` logs (tools/{tool_name}/...), for run.start's extra_metrics."""
    templates = (M.TOOLS_TOOL_CALLS, M.TOOLS_TOOL_FAILURE_FREQUENCY, M.TOOLS_TOOL_LATENCY)
    return [M.expand(m, name) for name in (toolbox.names if toolbox else []) for m in templates]
