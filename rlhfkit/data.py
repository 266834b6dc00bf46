"""Prompt datasets (hub ids or local files): loading, chat templates, tokenization, a seeded endless iterator of
batches."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from rlhfkit.errors import ConfigError, DataError

if TYPE_CHECKING:  # datasets and transformers take ~1.5 s to import; rlhfkit.config reads PROMPT_OVERFLOW from here
    import pyarrow as pa
    from datasets import Dataset, DatasetDict
    from transformers import PreTrainedTokenizerBase

_FILE_TYPES = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
PROMPT_OVERFLOW = ("drop", "truncate")  # what tokenize_prompts does with prompts over max_prompt_length


def load_splits(name: str, config: str | None = None, flag: str = "dataset_name") -> DatasetDict | Dataset:
    """A dataset as TRL's scripts load it: a hub id (downloaded, or read from the datasets cache offline), a
    directory saved with save_to_disk, a directory of data files, or one .json/.jsonl/.csv/.parquet file (a single
    split, used as whichever split is asked for). config: the dataset's configuration (load_dataset's name), for hub ids and file
    directories. A name that cannot be loaded is a DataError naming the flag and what to do."""
    from datasets import load_dataset, load_from_disk

    path = os.path.expanduser(name)
    try:
        if os.path.isdir(path) and _saved_to_disk(path):
            return load_from_disk(path)
        if os.path.isfile(path):
            ext = os.path.splitext(path)[1].lower()
            if ext not in _FILE_TYPES:
                raise DataError(
                    f"--{flag} {name!r}: unsupported file type {ext!r}; use one of {', '.join(_FILE_TYPES)}."
                )
            with _datasets_errors_unlogged():  # a file that does not parse: the DataError below says it once
                return load_dataset(_FILE_TYPES[ext], data_files=path, split="train")  # one split: whichever is asked
        return load_dataset(path, config)  # a hub id, or a directory of data files
    except DataError:
        raise
    except Exception as error:  # datasets raises many types (FileNotFoundError, DatasetNotFoundError, ValueError...)
        raise DataError(_why_not_loaded(name, flag, error)) from error


@contextlib.contextmanager
def _datasets_errors_unlogged():
    """datasets' own logger silenced for the block: it logs a parse error before raising it."""
    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _saved_to_disk(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json", "dataset_info.json"))


def _why_not_loaded(name: str, flag: str, error: Exception) -> str:
    from datasets import config as datasets_config

    from rlhfkit.models import is_hub_id

    where = f"--{flag} {name!r}"
    path = os.path.expanduser(name)
    if os.path.isfile(path):  # a data file that exists but does not parse
        cause = " ".join(f"{type(e).__name__}: {e}" for e in _causes(error))
        return (
            f"The file at {where} cannot be read as {_FILE_TYPES[os.path.splitext(path)[1].lower()]} data ({cause}). "
            "Fix the file (JSON: one object per line for .jsonl, or one array of objects for .json)."
        )
    if os.path.splitext(path)[1].lower() in _FILE_TYPES:  # a data file's name: surely meant as a file
        return (
            f"{where}: no file exists at {os.path.abspath(path)}. Check the path (relative paths start from "
            f"{os.getcwd()}); a name ending in {os.path.splitext(path)[1]} is read as a local file, not a hub id."
        )
    if os.path.isdir(path):
        if _is_empty_saved_dataset(os.path.expanduser(name)):
            return f"The dataset at {where} is empty: it needs at least one prompt."
        return (
            f"{where} cannot be read as a dataset ({type(error).__name__}: {error}). Pass a directory written by "
            f"save_to_disk, a directory of {'/'.join(_FILE_TYPES)} files, or a hub id."
        )
    if not is_hub_id(name):
        return f"{where} does not exist: it is neither a local file or directory nor a hub dataset id (ORG/NAME)."
    if datasets_config.HF_HUB_OFFLINE:  # HF_HUB_OFFLINE or HF_DATASETS_OFFLINE
        return (
            f"{where} is not in the datasets cache ({datasets_config.HF_DATASETS_CACHE}) and offline mode "
            "(HF_HUB_OFFLINE=1 or HF_DATASETS_OFFLINE=1) forbids downloading it. Load it once online, unset the "
            "offline variables, or pass a local file or directory."
        )
    return (
        f"{where} could not be loaded ({type(error).__name__}: {error}). Check the id (and --dataset_config), the "
        "connection, and log in (hf auth login) for private or gated datasets; or pass a local file or directory."
    )


def _causes(error: BaseException) -> list[BaseException]:
    """`error` and the errors it was raised from, innermost last (datasets wraps the parser's error)."""
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 5:
        chain.append(chain[-1].__cause__)
    return chain


def _is_empty_saved_dataset(path: str) -> bool:
    try:
        with open(os.path.join(path, "state.json"), encoding="utf-8") as f:
            return json.load(f).get("_data_files") == []
    except (OSError, ValueError):
        return False


def load_prompt_splits(
    name: str,
    train_split: str,
    test_split: str | None,
    config: str | None = None,
    required_by: str | None = None,
) -> tuple[Dataset, Dataset | None]:
    """The train split and the test split (None when the dataset has none of that name) of :func:`load_splits`. A
    dataset saved as a single split is the train split.

    required_by: the flags that asked for an evaluation on the test split (e.g. "--eval_strategy steps"); then a
    missing test split is a ConfigError naming it, the splits there are and the fix, instead of no evaluation."""
    from datasets import Dataset

    data = load_splits(name, config)
    if isinstance(data, Dataset):
        if required_by:
            raise ConfigError(
                f"{required_by} asks for an evaluation on --dataset_test_split {test_split!r}, but --dataset_name "
                f"{name!r} is a single split (used for training), so there is nothing to evaluate on. Give a "
                "dataset with a test split (a directory or hub id with train and test splits), or drop "
                f"{required_by} (the default schedule evaluates only when a test split exists)."
            )
        return data, None
    if train_split not in data:
        raise DataError(
            f"--dataset_train_split {train_split!r} is not a split of {name!r} (splits: {', '.join(data)}): pass "
            "one of them."
        )
    if required_by and test_split not in data:
        others = [split for split in data if split != train_split] or list(data)
        raise ConfigError(
            f"{required_by} asks for an evaluation on --dataset_test_split {test_split!r}, but {name!r} has no such "
            f"split (splits: {', '.join(data)}). Pass --dataset_test_split with one of {', '.join(others)}, or drop "
            f"{required_by} (the default schedule evaluates only when the test split exists)."
        )
    test = data[test_split] if test_split and test_split in data else None
    return data[train_split], test


def tokenize_prompts(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    text_field: str,
    max_prompt_length: int | None,
    flag_prefix: str = "",
    overflow: str = "drop",
    log=print,
    num_proc: int | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: list | None = None,
) -> Dataset:
    """Adds ``input_ids`` (prompt tokens, no padding). num_proc: processes for the map/filter (--dataset_num_proc).
    chat_template_kwargs: passed to the chat template of conversations (prompt_text); tools: the tools it shows them
    (GRPOTrainer(tools=[...])).

    A dataset already tokenized (an ``input_ids`` column, as TRL's examples/scripts/ppo/ppo.py prepares it, which
    keeps that column alone) keeps its ids as given; when it has no `text_field` column, the prompt text that reward
    functions, the task's checker and the completions tables read is decoded from the ids (special tokens skipped)
    into one, so every row has both.

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
        prompts = dataset[text_field]
        _check_prompts(prompts, text_field, flag_prefix, tokenizer)
        # As TRL: a chat template already writes the special tokens it wants, and text prompts are used as given.
        texts = [prompt_text(prompt, tokenizer, chat_template_kwargs, tools) for prompt in prompts]
        dataset = dataset.add_column("input_ids", _token_ids(tokenizer, texts))
    elif text_field not in dataset.column_names:
        dataset = dataset.add_column(text_field, _decoded(tokenizer, dataset["input_ids"], flag_prefix))
    if max_prompt_length is not None:
        too_long = sum(len(ids) > max_prompt_length for ids in dataset["input_ids"])
        if too_long and overflow == "truncate":
            dataset = dataset.map(lambda row: {"input_ids": row["input_ids"][-max_prompt_length:]}, num_proc=num_proc)
            log(
                f"Truncated {too_long} of {len(dataset)} {flag_prefix}prompts to their last {max_prompt_length} tokens."
            )
        elif too_long:
            total = len(dataset)
            dataset = dataset.filter(lambda row: len(row["input_ids"]) <= max_prompt_length, num_proc=num_proc)
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


def _token_ids(tokenizer: PreTrainedTokenizerBase, texts: list[str], chunk: int = 256) -> pa.ListArray:
    """The token ids of each text as an Arrow list column, tokenized `chunk` texts at a time.

    Both keep the process's peak memory down (bench/README, "Where the time goes"): a fast tokenizer's batch call
    holds a Rust Encoding per text until it returns, and Arrow's default pool (mimalloc) reserves arenas of its own,
    never returned, on first use."""
    import pyarrow as pa

    ids: list[list[int]] = []
    for start in range(0, len(texts), chunk):
        ids += tokenizer(texts[start : start + chunk], add_special_tokens=False)["input_ids"]
    return pa.array(ids, type=pa.list_(pa.int64()), memory_pool=pa.system_memory_pool())


def _decoded(tokenizer: PreTrainedTokenizerBase, ids: list, flag_prefix: str, chunk: int = 256) -> list[str]:
    """The text of each row's prompt token ids, special tokens skipped (a DataError names a row whose ids are not a
    list of token ids)."""
    bad = [i for i, row in enumerate(ids) if not isinstance(row, list) or not all(isinstance(t, int) for t in row)]
    if bad:
        rows = _first_rows(ids, bad)
        raise DataError(
            f"The {flag_prefix}dataset's 'input_ids' column must hold the prompts' token ids (lists of integers), but "
            f"{len(bad)} of {len(ids)} rows do not ({rows}). Fix those rows, or drop the column and give the prompts "
            "as text."
        )
    texts: list[str] = []
    for start in range(0, len(ids), chunk):
        texts += tokenizer.batch_decode(ids[start : start + chunk], skip_special_tokens=True)
    return texts


def _first_rows(values: list, bad: list[int]) -> str:
    """The first five `bad` rows of `values`, each described, for an error message."""
    return ", ".join(f"row {i}: {_describe(values[i])}" for i in bad[:5]) + (", ..." if len(bad) > 5 else "")


def is_conversational(prompt: object) -> bool:
    """TRL's conversational format: a list of messages, each a mapping with a "role" and a "content"."""
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(message, Mapping) and {"role", "content"} <= set(message) for message in prompt)
    )


def prompt_text(
    prompt: str | list[dict],
    tokenizer: PreTrainedTokenizerBase,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: list | None = None,
) -> str:
    """What the model reads: a text prompt as it is; a conversation through the tokenizer's chat template, ending
    with the assistant's turn (add_generation_prompt=True). chat_template_kwargs: the template's own variables, as
    TRL's --chat_template_kwargs passes them (e.g. {"enable_thinking": False} for Qwen3's). tools: the functions the
    template shows the model (None, not [], without: some templates render tool boilerplate for an empty list)."""
    if isinstance(prompt, str):
        return prompt
    kwargs = dict(chat_template_kwargs or {})
    return tokenizer.apply_chat_template(
        prompt, tokenize=False, add_generation_prompt=True, tools=tools or None, **kwargs
    )


def as_completions(completions: list, prompts: list) -> list:
    """Completions in the prompts' format, as TRL hands them to reward functions: text for text prompts, one
    assistant message ([{"role": "assistant", "content": text}]) for conversations. A completion already given as
    messages (a multi-turn episode with tools: assistant turns and tool results) is passed as it is."""
    return [
        completion
        if isinstance(completion, list)
        else [{"role": "assistant", "content": completion}]
        if is_conversational(prompt)
        else completion
        for completion, prompt in zip(completions, prompts, strict=True)
    ]


def _check_prompts(prompts: list, text_field: str, flag_prefix: str, tokenizer: PreTrainedTokenizerBase) -> None:
    """A DataError naming the rows whose prompt is neither text nor a conversation (the tokenizer would fail on them
    deep inside, or read a list of strings as pre-split words), or conversations without a chat template to render
    them."""
    bad = [i for i, prompt in enumerate(prompts) if not (isinstance(prompt, str) or is_conversational(prompt))]
    if bad:
        rows = _first_rows(prompts, bad)
        raise DataError(
            f"The {flag_prefix}dataset's {text_field!r} column (--dataset_text_field) must hold text or conversations "
            f"(lists of {{'role', 'content'}} messages), but {len(bad)} of {len(prompts)} rows do not ({rows}). Fix "
            "or drop those rows, or pass --dataset_text_field NAME for the column that holds the prompts."
        )
    if any(map(is_conversational, prompts)) and not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"The {flag_prefix}dataset's prompts are conversations (lists of messages), but the policy's tokenizer "
            f"({tokenizer.name_or_path}) has no chat template to render them. Use a chat model's tokenizer (one with "
            "a chat_template), set tokenizer.chat_template, or give the prompts as text."
        )


def _describe(value: object) -> str:
    return "None" if value is None else f"{type(value).__name__} {value!r:.40}"


@contextlib.contextmanager
def progress_bars_hidden() -> Iterator[None]:
    """transformers' and datasets' per-file progress bars (loading and saving models and datasets) hidden for the
    block, restored afterwards: where several load at once, the bars would bury what the command prints."""
    import datasets.utils.logging as ds_logging
    import transformers.utils.logging as tf_logging

    libraries = (ds_logging, tf_logging)
    enabled = [library.is_progress_bar_enabled() for library in libraries]
    for library in libraries:
        library.disable_progress_bar()
    try:
        yield
    finally:
        for library, was in zip(libraries, enabled):
            if was:
                library.enable_progress_bar()


def endless_batches(
    num_rows: int,
    batch_size: int,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    skip: int = 0,
    shuffle: bool = True,
) -> Iterator[list[int]]:
    """Row indices of this process's share of each global batch, reshuffled every pass over the data (shuffle=False:
    rows in dataset order, pass after pass).

    All processes draw the same permutation (same seed) and take disjoint slices of each global batch,
    so together they see each prompt once per pass, like a distributed sampler. Passes follow one another without
    a gap: a batch may end one pass and start the next. skip: batches already consumed (a resumed run continues
    with the next one; the order depends only on the seed).
    """
    generator = torch.Generator().manual_seed(seed)
    global_batch = batch_size * world_size
    buffer: list[int] = []
    while True:
        while len(buffer) < global_batch:
            buffer.extend(torch.randperm(num_rows, generator=generator).tolist() if shuffle else range(num_rows))
        batch, buffer = buffer[:global_batch], buffer[global_batch:]
        if skip:
            skip -= 1
            continue
        yield batch[rank * batch_size : (rank + 1) * batch_size]
