"""Prompt datasets from local files: loading, tokenization, left-padded batches, a seeded endless iterator."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # datasets and transformers take ~1.5 s to import; rlhfkit.config reads PROMPT_OVERFLOW from here
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

_FILE_TYPES = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
PROMPT_OVERFLOW = ("drop", "truncate")  # what tokenize_prompts does with prompts over max_prompt_length


class DataError(ValueError):
    """The dataset cannot be used; the message names the flag and the fix."""


def load_prompt_splits(path: str, train_split: str, test_split: str | None) -> tuple[Dataset, Dataset | None]:
    """Train and (optional) test splits from a save_to_disk directory or a data file. Nothing is downloaded."""
    from datasets import Dataset, DatasetDict, load_dataset, load_from_disk

    if not os.path.exists(path):
        raise DataError(
            f"--dataset_name {path!r} does not exist. Pass a directory saved with datasets' save_to_disk or a "
            f"{'/'.join(_FILE_TYPES)} file (datasets are read locally, never downloaded)."
        )
    if os.path.isdir(path):
        try:
            data = load_from_disk(path)
        except Exception as e:
            raise DataError(_unreadable(path, e)) from e
    else:
        ext = os.path.splitext(path)[1].lower()
        if ext not in _FILE_TYPES:
            raise DataError(
                f"--dataset_name {path!r}: unsupported file type {ext!r}; use one of {', '.join(_FILE_TYPES)}."
            )
        try:
            data = load_dataset(_FILE_TYPES[ext], data_files={train_split: path})
        except Exception as e:
            raise DataError(_unreadable(path, e)) from e
    if isinstance(data, Dataset):
        return data, None
    assert isinstance(data, DatasetDict)
    if train_split not in data:
        raise DataError(f"--dataset_train_split {train_split!r} is not in {path!r} (splits: {', '.join(data)}).")
    test = data[test_split] if test_split and test_split in data else None
    return data[train_split], test


def _unreadable(path: str, error: Exception) -> str:
    """The message for a dataset that exists but cannot be read; an empty one (no data files) is named as such."""
    state = os.path.join(path, "state.json")
    try:
        with open(state, encoding="utf-8") as f:
            if json.load(f).get("_data_files") == []:
                return f"The dataset at --dataset_name {path!r} is empty: it needs at least one prompt."
    except (OSError, ValueError):
        pass
    return (
        f"--dataset_name {path!r} cannot be read ({type(error).__name__}: {error}). Pass a directory written by "
        f"datasets' save_to_disk or a {'/'.join(_FILE_TYPES)} file."
    )


def tokenize_prompts(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    text_field: str,
    max_prompt_length: int | None,
    flag_prefix: str = "",
    overflow: str = "drop",
    log=print,
) -> Dataset:
    """Adds ``input_ids`` (prompt tokens, no padding).

    Rows longer than ``max_prompt_length`` are dropped (overflow="drop") or keep their last max_prompt_length
    tokens (overflow="truncate": the end of a prompt, next to the completion, matters most); either way the
    number affected is reported through `log`, never silently. A prompt that is not text is a DataError naming its
    row, raised before anything is tokenized.
    """
    if len(dataset) == 0:
        raise DataError(f"The {flag_prefix}dataset is empty: it needs at least one prompt.")
    if "input_ids" not in dataset.column_names:
        if text_field not in dataset.column_names:
            raise DataError(
                f"The {flag_prefix}dataset has no {text_field!r} column (columns: {', '.join(dataset.column_names)}). "
                f"Rename the prompt column or pass --dataset_text_field NAME."
            )
        _check_prompts_are_text(dataset[text_field], text_field, flag_prefix)
        dataset = dataset.map(
            lambda batch: {"input_ids": tokenizer(batch[text_field], add_special_tokens=False)["input_ids"]},
            batched=True,
        )
    if max_prompt_length is not None:
        too_long = sum(len(ids) > max_prompt_length for ids in dataset["input_ids"])
        if too_long and overflow == "truncate":
            dataset = dataset.map(lambda row: {"input_ids": row["input_ids"][-max_prompt_length:]})
            log(
                f"Truncated {too_long} of {len(dataset)} {flag_prefix}prompts to their last {max_prompt_length} tokens."
            )
        elif too_long:
            total = len(dataset)
            dataset = dataset.filter(lambda row: len(row["input_ids"]) <= max_prompt_length)
            if len(dataset) == 0:
                raise DataError(
                    f"All {total} prompts of the {flag_prefix}dataset are longer than --max_prompt_length "
                    f"{max_prompt_length}: raise it, or pass --prompt_overflow truncate."
                )
            log(
                f"Dropped {too_long} of {total} {flag_prefix}prompts longer than --max_prompt_length "
                f"{max_prompt_length} (--prompt_overflow truncate keeps them, cut)."
            )
    return dataset


def _check_prompts_are_text(prompts: list, text_field: str, flag_prefix: str) -> None:
    """A DataError naming the rows whose prompt is not a string: the tokenizer would fail on them deep inside, or
    (a list) silently read them as pre-split words."""
    bad = [i for i, prompt in enumerate(prompts) if not isinstance(prompt, str)]
    if not bad:
        return
    rows = ", ".join(f"row {i}: {_describe(prompts[i])}" for i in bad[:5]) + (", ..." if len(bad) > 5 else "")
    if any(isinstance(prompts[i], (list, dict)) for i in bad):
        fix = "Chat-formatted prompts (lists of messages) are not supported yet: give each prompt as text"
    else:
        fix = "Fix or drop those rows"
    raise DataError(
        f"The {flag_prefix}dataset's {text_field!r} column (--dataset_text_field) must hold text, but {len(bad)} of "
        f"{len(prompts)} rows do not ({rows}). {fix}, or pass --dataset_text_field NAME for the column that holds "
        "the prompt text."
    )


def _describe(value: object) -> str:
    return "None" if value is None else f"{type(value).__name__} {value!r:.40}"


def left_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) token ids and bool mask (True = real token), padded on the left."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for i, seq in enumerate(sequences):
        if seq:
            ids[i, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[i, width - len(seq) :] = True
    return ids, mask


def endless_batches(
    num_rows: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1, skip: int = 0
) -> Iterator[list[int]]:
    """Row indices of this process's share of each global batch, reshuffled every pass over the data.

    All processes draw the same permutation (same seed) and take disjoint slices of each global batch,
    so together they see each prompt once per pass, like a distributed sampler. skip: batches already consumed
    (a resumed run continues with the next one; the order depends only on the seed).
    """
    generator = torch.Generator().manual_seed(seed)
    global_batch = batch_size * world_size
    buffer: list[int] = []
    while True:
        while len(buffer) < global_batch:
            buffer.extend(torch.randperm(num_rows, generator=generator).tolist())
        batch, buffer = buffer[:global_batch], buffer[global_batch:]
        if skip:
            skip -= 1
            continue
        yield batch[rank * batch_size : (rank + 1) * batch_size]
