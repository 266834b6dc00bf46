"""The prompts a trainer trains and evaluates on, tokenized as both trainers tokenize them (data.tokenize_prompts with
the config's fields), and a streamed train set held as the rows a run draws."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TypeAlias

from datasets import Dataset, IterableDataset
from transformers import PreTrainedTokenizerBase

from rlhfkit.data import tokenize_prompts
from rlhfkit.errors import ConfigError, DataError

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
    evaluated and logged under eval_<name>) give a dict of the same names. A streamed set (an IterableDataset, alone or
    in the dict) is read whole, every row of it, as TRL's evaluation reads a finite stream (read_stream)."""
    if not isinstance(dataset, Mapping):
        return _tokenized(args, tokenizer, read_stream(dataset, "eval_dataset"), "eval ", tools)
    if not dataset:
        raise ConfigError("eval_dataset={}: no evaluation set. Pass a dataset, a dict of named datasets, or None.")
    for name in dataset:
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigError(
                f"eval_dataset: the set name {name!r} must be a non-empty string without '/': its metrics are "
                "logged as eval_<name>/... (e.g. {'easy': ..., 'hard': ...})."
            )
    return {
        name: _tokenized(args, tokenizer, read_stream(part, f"eval_dataset[{name!r}]"), f"eval {name!r} ", tools)
        for name, part in dataset.items()
    }


def read_stream(dataset, what: str):
    """Every row of a streamed evaluation set (an IterableDataset) held in memory, in the stream's order; a Dataset as
    it is. The stream must end (an evaluation reads all of it, as TRL's does)."""
    if not isinstance(dataset, IterableDataset):
        return dataset
    rows = list(dataset)
    if not rows:
        raise DataError(f"The streamed {what} yielded no rows: an evaluation needs at least one prompt.")
    return Dataset.from_list(rows)


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
