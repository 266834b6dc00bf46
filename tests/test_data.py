"""Prompt datasets as TRL's scripts load them (local forms here; hub ids in tests/test_hub.py) and conversational
prompts rendered with the chat template."""

import json

import pytest
from datasets import Dataset, DatasetDict

from rlhfkit.data import _token_ids, as_completions, load_prompt_splits, prompt_text, tokenize_prompts
from rlhfkit.errors import ConfigError, DataError
from rlhfkit.models import load_tokenizer
from rlhfkit.rewards import RewardModelFunction
from tests.hub_cache import CHAT_TEMPLATE

ROWS = [{"prompt": f"sort {i}{i + 1}=", "answer": str(i)} for i in range(6)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_every_local_form_loads_the_same_prompts(tmp_path):
    write_jsonl(tmp_path / "one.jsonl", ROWS)
    files = tmp_path / "files"
    files.mkdir()
    write_jsonl(files / "train.jsonl", ROWS[:4])
    write_jsonl(files / "test.jsonl", ROWS[4:])
    DatasetDict({"train": Dataset.from_list(ROWS[:4]), "test": Dataset.from_list(ROWS[4:])}).save_to_disk(
        tmp_path / "saved"
    )
    train, test = load_prompt_splits(str(tmp_path / "one.jsonl"), "train", "test")
    assert train["prompt"] == [r["prompt"] for r in ROWS] and test is None  # a file is one split
    for directory in ("files", "saved"):  # a directory of data files, and one written by save_to_disk
        train, test = load_prompt_splits(str(tmp_path / directory), "train", "test")
        assert train["prompt"] == [r["prompt"] for r in ROWS[:4]] and test["answer"] == ["4", "5"]


def test_a_missing_split_is_named_with_the_ones_there(tmp_path):
    DatasetDict({"train": Dataset.from_list(ROWS)}).save_to_disk(tmp_path / "saved")
    with pytest.raises(DataError, match=r"--dataset_train_split 'training' is not a split .* \(splits: train\)"):
        load_prompt_splits(str(tmp_path / "saved"), "training", "test")
    assert load_prompt_splits(str(tmp_path / "saved"), "train", "validation")[1] is None  # no eval split: no eval


@pytest.fixture
def chat_tokenizer(tiny_assets):
    tokenizer = load_tokenizer(str(tiny_assets / "tokenizer"))
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def test_conversations_are_rendered_with_the_chat_template_and_text_is_kept(chat_tokenizer):
    conversation = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "sort 21="}]
    assert prompt_text(conversation, chat_tokenizer) == "system: be brief\nuser: sort 21=\nassistant: "
    assert prompt_text("sort 21=", chat_tokenizer) == "sort 21="
    dataset = tokenize_prompts(Dataset.from_dict({"prompt": [conversation]}), chat_tokenizer, "prompt", None)
    expected = chat_tokenizer("system: be brief\nuser: sort 21=\nassistant: ", add_special_tokens=False)
    assert dataset["input_ids"] == [expected["input_ids"]]
    assert dataset["prompt"] == [conversation]  # reward functions still get the messages


def test_chat_template_kwargs_reach_the_template(chat_tokenizer):
    chat_tokenizer.chat_template = "{% if not enable_thinking %}/no_think {% endif %}" + CHAT_TEMPLATE
    conversation = [{"role": "user", "content": "sort 21="}]
    assert prompt_text(conversation, chat_tokenizer, {"enable_thinking": False}).startswith("/no_think user: sort")
    assert prompt_text(conversation, chat_tokenizer, {"enable_thinking": True}).startswith("user: sort")
    dataset = Dataset.from_dict({"prompt": [conversation]})
    tokenized = tokenize_prompts(dataset, chat_tokenizer, "prompt", None, chat_template_kwargs={"enable_thinking": 0})
    rendered = chat_tokenizer("/no_think user: sort 21=\nassistant: ", add_special_tokens=False)["input_ids"]
    assert tokenized["input_ids"] == [rendered]


def test_completions_take_the_prompts_format():
    conversation = [{"role": "user", "content": "sort 21="}]
    assert as_completions(["12", "21"], ["sort 21=", conversation]) == [
        "12",
        [{"role": "assistant", "content": "21"}],
    ]


def test_a_reward_model_scores_a_conversation_rendered_with_its_own_template(tiny_assets, chat_tokenizer):
    import torch

    from rlhfkit.models import load_reward_model

    model, _ = load_reward_model(str(tiny_assets / "reward"), chat_tokenizer, torch.float32)
    score = RewardModelFunction(model, chat_tokenizer, "reward", same_vocab=True)
    prompts = [[{"role": "user", "content": "sort 21="}]] * 2
    completions = as_completions(["12", "21"], prompts)
    by_conversation = score(prompts, completions, sequence_ids=("ignored for conversations", None))
    rendered = ["user: sort 21=\nassistant: 12\n", "user: sort 21=\nassistant: 21\n"]
    by_text = RewardModelFunction(model, chat_tokenizer, "reward", same_vocab=False)(rendered, ["", ""])
    assert by_conversation == pytest.approx(by_text)
    chat_tokenizer.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        score(prompts, completions)


def test_prompts_tokenized_in_chunks_get_the_ids_of_one_call(chat_tokenizer):
    texts = [f"sort {i}{i * 7 % 10}{i % 3}=" for i in range(7)]
    one_call = chat_tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert _token_ids(chat_tokenizer, texts, chunk=3).to_pylist() == one_call  # chunks of 3, 3 and 1
    dataset = tokenize_prompts(Dataset.from_dict({"prompt": texts}), chat_tokenizer, "prompt", None)
    assert dataset["input_ids"] == one_call and dataset.features["input_ids"].feature.dtype == "int64"


def test_an_evaluation_asked_for_without_its_split_names_the_splits_there(tmp_path):
    DatasetDict({"train": Dataset.from_list(ROWS[:4]), "valid": Dataset.from_list(ROWS[4:])}).save_to_disk(
        tmp_path / "saved"
    )
    saved = str(tmp_path / "saved")
    with pytest.raises(ConfigError) as error:
        load_prompt_splits(saved, "train", "test", required_by="--eval_strategy steps")
    message = str(error.value)
    assert "--eval_strategy steps" in message and "--dataset_test_split 'test'" in message
    assert "(splits: train, valid)" in message and "Pass --dataset_test_split with one of valid" in message
    assert load_prompt_splits(saved, "train", "valid", required_by="--eval_strategy steps")[1]["answer"] == ["4", "5"]
    one_file = write_jsonl(tmp_path / "one.jsonl", ROWS)  # a single split: nothing to evaluate on
    with pytest.raises(ConfigError, match="is a single split"):
        load_prompt_splits(str(one_file), "train", "test", required_by="--eval_on_start")
    assert load_prompt_splits(str(one_file), "train", "test")[1] is None  # not asked: no evaluation, no error


def test_an_input_ids_only_dataset_gets_its_prompt_text_decoded_and_keeps_its_ids(chat_tokenizer):
    """TRL's ppo.py keeps only input_ids (its prepare_dataset removes the text column)."""
    texts = ["sort 21=", "sort 3412=", "sort 1="]
    ids = [chat_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    with_eos = [ids[0] + [chat_tokenizer.eos_token_id], *ids[1:]]  # special tokens are skipped in the text
    dataset = tokenize_prompts(Dataset.from_dict({"input_ids": with_eos}), chat_tokenizer, "prompt", None)
    assert dataset["prompt"] == texts and dataset["input_ids"] == with_eos  # the ids as given
    cut = tokenize_prompts(
        Dataset.from_dict({"input_ids": ids}), chat_tokenizer, "prompt", 8, overflow="truncate", log=lambda _: None
    )
    assert cut["input_ids"] == [i[-8:] for i in ids] and cut["prompt"] == texts  # the text is the whole prompt
    dropped = tokenize_prompts(Dataset.from_dict({"input_ids": ids}), chat_tokenizer, "prompt", 8, log=lambda _: None)
    assert dropped["prompt"] == ["sort 21=", "sort 1="] and dropped["input_ids"] == [ids[0], ids[2]]
    with pytest.raises(DataError, match=r"'input_ids' column must hold .* 2 of 2 rows do not \(row 0: list"):
        tokenize_prompts(Dataset.from_dict({"input_ids": [["1"], ["2", "3"]]}), chat_tokenizer, "prompt", None)
