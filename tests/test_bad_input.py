"""Bad input: every case exits with status 2 and a one-paragraph message that names the field and the fix, with no
traceback, and nothing already in --output_dir is destroyed."""

import json
import os
import shutil
import time
import warnings

import pytest
from datasets import Dataset

from rlhfkit.cli import main
from rlhfkit.data import tokenize_prompts
from rlhfkit.errors import DataError
from tests.helpers import asset_flags

SMALL = [
    "--report_to", "none", "--total_episodes", "16", "--per_device_train_batch_size", "8",
    "--local_rollout_forward_batch_size", "8", "--response_length", "8", "--num_sample_generations", "0",
]  # fmt: skip


def listing(path):
    """Every file under path with its bytes."""
    files = {}
    for root, _, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                files[os.path.relpath(full, path)] = f.read()
    return files


def fails_cleanly(capsys, argv, out, *needles):
    """Run the CLI in-process; exit 2, the message has every needle, no traceback, output_dir untouched."""
    before = listing(out)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    assert listing(out) == before
    return err


@pytest.fixture
def out(tmp_path):
    path = tmp_path / "out"
    path.mkdir()
    (path / "notes.txt").write_text("a file the user keeps here")
    return path


def ppo(assets, out, *flags, dataset=None):
    flags_ = asset_flags(assets)
    if dataset is not None:
        i = flags_.index("--dataset_name")
        flags_[i + 1] = str(dataset)
    return ["ppo", *flags_, "--output_dir", str(out), *SMALL, *flags]


def test_missing_prompt_column(tiny_assets, out, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"sort {i}1=", "answer": "1"}) for i in range(4)))
    fails_cleanly(capsys, ppo(tiny_assets, out, dataset=data), out, "no 'prompt' column", "--dataset_text_field")


def test_prompts_that_are_not_text_are_named_by_row(tiny_assets, out, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    rows = [{"prompt": None if i in (2, 5) else f"sort {i}1="} for i in range(8)]
    data.write_text("\n".join(json.dumps(row) for row in rows))
    fails_cleanly(
        capsys, ppo(tiny_assets, out, dataset=data), out, "2 of 8 rows", "row 2: None, row 5: None",
        "--dataset_text_field",
    )  # fmt: skip


@pytest.mark.parametrize(
    "prompts, needles",
    [
        ([21, 7], ["2 of 2 rows", "row 0: int 21, row 1: int 7", "Fix or drop those rows"]),
        ([["sort 21="]], ["row 0: list", "lists of {'role', 'content'} messages"]),  # a list, but no messages
    ],
)
def test_prompts_that_are_neither_text_nor_conversations_are_refused_before_tokenizing(prompts, needles):
    with pytest.raises(DataError) as info:  # no tokenizer needed: the check comes first
        tokenize_prompts(Dataset.from_dict({"prompt": prompts}), None, "prompt", None)
    assert all(needle in str(info.value) for needle in needles), str(info.value)


def test_conversations_need_a_chat_template(tiny_assets):
    from rlhfkit.models import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_assets / "tokenizer"))  # the built-in task's tokenizer has none
    with pytest.raises(DataError, match="has no chat template"):
        tokenize_prompts(
            Dataset.from_dict({"prompt": [[{"role": "user", "content": "sort 21="}]]}), tokenizer, "prompt", None
        )


def test_prompts_already_tokenized_are_not_read_as_text():
    dataset = Dataset.from_dict({"prompt": [None, None], "input_ids": [[1, 2], [3]]})
    assert tokenize_prompts(dataset, None, "prompt", None)["input_ids"] == [[1, 2], [3]]


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--learning_rate", "nan"], ["learning_rate=nan", "a finite number > 0", "--learning_rate 3e-06"]),
        (["--num_ppo_epochs", "2.5"], ["num_ppo_epochs='2.5'", "an integer >= 1"]),
        (["--gamma", "-1e-3"], ["gamma=-0.001", "a number in [0, 1]"]),
        (["--kl_estimator", "k2"], ["kl_estimator='k2'", "one of k1, k3"]),
        (["--save_total_limit", "0"], ["save_total_limit=0", "or leave it out"]),
    ],
)
def test_bad_values_fail_before_loading_anything(tiny_assets, out, capsys, flags, needles):
    fails_cleanly(capsys, ppo(tiny_assets, out, *flags), out, *needles)


def test_bad_value_without_model_flags_fails_before_building_the_builtin_task(out, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("RLHFKIT_CACHE", str(cache))
    start = time.monotonic()
    fails_cleanly(capsys, ["grpo", "--output_dir", str(out), "--num_generations", "1"], out, "num_generations=1")
    assert time.monotonic() - start < 10  # building the task's assets takes minutes
    assert not any(cache.iterdir())


def test_empty_dataset(tiny_assets, out, tmp_path, capsys):
    Dataset.from_dict({"prompt": []}).save_to_disk(str(tmp_path / "empty"))
    fails_cleanly(capsys, ppo(tiny_assets, out, dataset=tmp_path / "empty"), out, "is empty", "at least one prompt")


def test_dataset_path_that_does_not_exist(tiny_assets, out, tmp_path, capsys):
    fails_cleanly(capsys, ppo(tiny_assets, out, dataset=tmp_path / "nope"), out, "--dataset_name", "does not exist")


def test_prompts_longer_than_the_limit_are_dropped_or_truncated(tiny_assets, out, capsys):
    fails_cleanly(
        capsys, ppo(tiny_assets, out, "--max_prompt_length", "3"), out, "--max_prompt_length 3", "--prompt_overflow"
    )
    # With truncation the run goes ahead and says how many prompts were cut.
    assert main(ppo(tiny_assets, out, "--max_prompt_length", "8", "--prompt_overflow", "truncate")) == 0
    assert "Truncated 256 of 256 prompts to their last 8 tokens" in capsys.readouterr().out
    assert (out / "notes.txt").read_text() == "a file the user keeps here"


def test_tokenizer_without_pad_token_gets_eos_and_says_so(tiny_assets, tmp_path):
    from transformers import AutoTokenizer

    from rlhfkit.models import load_tokenizer

    tok = AutoTokenizer.from_pretrained(tiny_assets / "tokenizer")
    tok.pad_token = None
    tok.save_pretrained(tmp_path / "nopad")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_tokenizer(str(tmp_path / "nopad"))
    assert loaded.pad_token == loaded.eos_token
    assert any("has no pad token" in str(w.message) for w in caught)


def test_reward_model_with_another_vocabulary_is_refused(tiny_assets, out, tmp_path, capsys):
    from transformers import AutoTokenizer

    reward = tmp_path / "reward"
    shutil.copytree(tiny_assets / "reward", reward)
    tok = AutoTokenizer.from_pretrained(reward)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(reward)
    argv = ppo(tiny_assets, out)
    argv[argv.index("--reward_model_path") + 1] = str(reward)
    fails_cleanly(capsys, argv, out, "--reward_model_path", "different vocabulary", "rlhfkit grpo")


def test_unknown_report_to(tiny_assets, out, capsys):
    fails_cleanly(capsys, ppo(tiny_assets, out, "--report_to", "neptune"), out, "--report_to", "'neptune'")


def test_output_dir_holding_another_run(tiny_assets, out, capsys):
    (out / "run_config.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    fails_cleanly(
        capsys, ppo(tiny_assets, out), out, "already holds a run", "--resume_from_checkpoint", "--overwrite_output_dir"
    )


def test_non_dividing_batch_sizes(tiny_assets, out, capsys):
    fails_cleanly(capsys, ppo(tiny_assets, out, "--num_mini_batches", "3"), out, "num_mini_batches")


@pytest.mark.parametrize(
    "ref, needle",
    [
        ("tests.trainers.grpo_rewards:raises", "'raises' raised RuntimeError"),
        ("tests.trainers.grpo_rewards:missing", "has no function 'missing'"),
        ("no_such_module:f", "cannot import 'no_such_module'"),
    ],
)
def test_reward_function_errors(tiny_assets, out, capsys, ref, needle):
    argv = [
        "grpo", "--model_name_or_path", str(tiny_assets / "sft"), "--dataset_name", str(tiny_assets / "prompts"),
        "--output_dir", str(out), "--report_to", "none", "--num_generations", "4", "--per_device_train_batch_size",
        "8", "--max_steps", "1", "--max_completion_length", "8", "--num_sample_generations", "0",
        "--reward_funcs", ref,
    ]  # fmt: skip
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err
    assert (out / "notes.txt").read_text() == "a file the user keeps here"


def test_corrupt_or_partial_checkpoint(tiny_assets, out, capsys):
    (out / "checkpoint-3").mkdir()
    (out / "checkpoint-3" / "model.safetensors").write_bytes(b"half a file")
    fails_cleanly(
        capsys,
        ppo(tiny_assets, out, "--resume_from_checkpoint", str(out / "checkpoint-3")),
        out,
        "not a complete checkpoint",
        "earlier checkpoint",
    )
    (out / "checkpoint-3" / "trainer_state.json").write_text("{truncated")
    fails_cleanly(capsys, ppo(tiny_assets, out, "--resume_from_checkpoint", "latest"), out, "is corrupt")
