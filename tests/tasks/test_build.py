import json
import subprocess
import sys
import threading

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.tasks import builtin_assets, evaluate_success, import_ref, load_task
from rlhfkit.tasks.build import BUILDER_VERSION, build_tiny
from rlhfkit.tasks.registry import DEFAULT_TASK


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    out = tmp_path_factory.mktemp("build") / "tiny"
    summary = build_tiny(out, seed=0, preset="test", log=lambda *a: None)
    return out, summary


def test_layout_loads_with_standard_tools(assets):
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    out, _ = assets
    tok = AutoTokenizer.from_pretrained(out / "tokenizer")
    sft = AutoModelForCausalLM.from_pretrained(out / "sft")
    rm = AutoModelForSequenceClassification.from_pretrained(out / "reward")
    assert rm.config.num_labels == 1 and rm.config.pad_token_id == tok.pad_token_id
    assert sft.config.eos_token_id == tok.eos_token_id
    prompts = load_from_disk(str(out / "prompts"))
    assert set(prompts) == {"train", "test"}
    assert {"prompt", "answer"} <= set(prompts["train"].column_names)
    assert not set(prompts["train"]["prompt"]) & set(prompts["test"]["prompt"])
    batch = tok(prompts["test"]["prompt"][:4], return_tensors="pt", padding=True)
    assert rm(**batch).logits.shape == (4, 1)


def test_task_json_references_import(assets):
    out, summary = assets
    meta = json.loads((out / "task.json").read_text())
    assert meta["name"] == "sort" and meta["builder_version"] == BUILDER_VERSION
    check = import_ref(meta["check"])
    assert check("sort 21=", "12") and not check("sort 21=", "21")
    for ref in meta["reward_funcs"].values():
        assert callable(import_ref(ref))
    for key in ("pair_accuracy_synthetic", "pair_accuracy_policy", "best_of_8_success"):
        assert 0.0 <= meta["reward"][key] <= 1.0
    assert 0.0 <= meta["sft"]["greedy_success"] <= 1.0 and meta["build_seconds"] > 0
    # quality bar for the test preset: the reward model beats chance on held-out synthetic pairs
    assert meta["reward"]["pair_accuracy_synthetic"] > 0.55
    task = load_task(out)
    assert task.name == "sort" and task.max_new_tokens == meta["max_new_tokens"]
    assert task.reward_funcs["correctness"](["sort 21="], ["12"]) == [1.0]


def test_evaluate_success_matches_manual_generation(assets):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, summary = assets
    tok = AutoTokenizer.from_pretrained(out / "tokenizer")
    sft = AutoModelForCausalLM.from_pretrained(out / "sft")
    task = load_task(out)
    prompts = ["sort 5291=", "sort 333=", "sort 90817="]
    got = evaluate_success(sft, tok, prompts, task.check, task.max_new_tokens)
    # independent reference: one prompt at a time (no padding), greedy
    hits = 0
    for p in prompts:
        ids = tok(p, return_tensors="pt")
        gen = sft.generate(**ids, max_new_tokens=task.max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        hits += task.check(p, tok.decode(gen[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
    assert got == hits / len(prompts)


def test_same_seed_same_weights(assets, tmp_path):
    out, _ = assets
    build_tiny(tmp_path / "again", seed=0, preset="test", log=lambda *a: None)
    for part in ("sft", "reward"):
        a = load_file(out / part / "model.safetensors")
        b = load_file(tmp_path / "again" / part / "model.safetensors")
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def test_refuses_to_overwrite_foreign_dir(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        build_tiny(tmp_path, preset="test", log=lambda *a: None)
    assert (tmp_path / "precious.txt").read_text() == "keep me"


BUILDER = """
import sys, time
from filelock import FileLock
held = FileLock(sys.argv[1])
held.acquire()
print("held", flush=True)
time.sleep(600)
"""  # a process building the assets: it holds their lock (argv[1])


def test_builtin_assets_honours_cache_env_and_waits_for_another_builder(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path))
    messages = []
    # Another process building the same assets holds their lock: this one waits, until that process is killed.
    lock = tmp_path / f"{DEFAULT_TASK}-test-seed0-v{BUILDER_VERSION}.lock"
    holder = subprocess.Popen([sys.executable, "-c", BUILDER, str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    waiting = threading.Thread(target=lambda: messages.append(builtin_assets("test", log=messages.append)))
    waiting.start()
    waiting.join(timeout=1.0)
    assert waiting.is_alive() and not messages
    holder.kill()
    holder.wait()
    waiting.join(timeout=300)
    path = messages.pop()
    assert path.parent == tmp_path and (path / "task.json").exists()
    assert messages  # built on first use
    messages.clear()
    assert builtin_assets("test", log=messages.append) == path
    assert not messages  # reused
    with pytest.raises(ValueError, match="unknown preset"):
        builtin_assets("huge")


def test_default_preset_gives_each_task_its_budgets():
    from dataclasses import replace

    from rlhfkit.tasks.build import PRESETS, TASK_BUDGETS, build_preset

    assert build_preset("default", "sort") == PRESETS["default"]
    for task, budgets in TASK_BUDGETS.items():
        cfg = build_preset("default", task)
        assert {k: getattr(cfg, k) for k in budgets} == budgets and cfg.sft_steps != PRESETS["default"].sft_steps
        assert build_preset("test", task) == PRESETS["test"]  # the test preset stays fast
    custom = replace(PRESETS["default"], sft_steps=7)
    assert build_preset(custom, "addition") is custom  # a preset passed in is used as given
