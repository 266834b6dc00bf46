"""The chat-formatted reverse task (tasks/reverse_chat.py): its checker and rewards on TRL's conversational prompts and
completions and on decoded text; its build (test preset): conversational prompts the chat template renders, models
trained on the rendered conversation; and a short PPO and GRPO run through the quickstart that log its true success."""

import json
import math

import pytest

from rlhfkit.tasks import TASKS, build_tiny, load_task
from rlhfkit.tasks import reverse_chat as rc
from rlhfkit.tasks.build import build_preset, model_inputs
from rlhfkit.tasks.chat_tokenizer import build_chat_tokenizer

USER = [{"role": "user", "content": "rev kqzt="}]
RENDERED = "<|im_start|>user\nrev kqzt=<|im_end|>\n<|im_start|>assistant\n"


def said(text):
    return [{"role": "assistant", "content": text}]


def test_check_reads_conversations_and_text():
    assert TASKS["reverse-chat"] is rc.TASK and rc.TASK.chat and not TASKS["reverse"].chat
    for prompt in (USER, RENDERED, "rev kqzt="):
        assert rc.answer(prompt) == "tzqk"
        for right in (said("tzqk"), said(" tzqk\n"), "tzqk", "tzqk<|im_end|>", [*USER, *said("tzqk")]):
            assert rc.check(prompt, right), (prompt, right)
        for wrong in (said("kqzt"), said("tzqkx"), "tzq", "tzqk\nzz", [], USER, [*said("tzqk"), *USER]):
            assert not rc.check(prompt, wrong), (prompt, wrong)
    # the last user turn is the question, in messages and in a rendered multi-turn conversation alike
    longer = [{"role": "user", "content": "rev ab="}, *said("ba"), *USER]
    assert rc.answer(longer) == "tzqk" == rc.answer("<|im_start|>user\nrev ab=<|im_end|>\n" + RENDERED)
    with pytest.raises(ValueError, match="not a reverse prompt"):
        rc.answer([{"role": "user", "content": "sort 21="}])


def test_rewards_take_trl_conversational_completions():
    prompts = [USER, USER, USER, USER]
    completions = [said("tzqk"), said("tzqq"), said("tzqkab"), []]
    assert rc.correctness(prompts, completions) == [1.0, 0.0, 0.0, 0.0]
    assert rc.partial_credit(prompts, completions) == [1.0, 0.75, 4 / 6, 0.0]
    assert rc.partial_credit(["rev kqzt="], ["tzxk"]) == [0.75]  # plain strings too
    # the task's references import these very functions
    assert rc.TASK.refs == {
        "check": "rlhfkit.tasks.reverse_chat:check",
        "correctness": "rlhfkit.tasks.reverse_chat:correctness",
        "partial_credit": "rlhfkit.tasks.reverse_chat:partial_credit",
    }


def test_corrupt_is_a_near_miss_of_the_user_request():
    import random

    rng = random.Random(0)
    misses = {rc.corrupt(USER, "tzqk", rng) for _ in range(200)}
    assert "tzqk" not in misses and "kqzt" in misses  # reverse's "copied unreversed" near miss, read from the message


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    out = tmp_path_factory.mktemp("build") / "reverse-chat"
    summary = build_tiny(out, seed=0, preset="test", log=lambda *a: None, task="reverse-chat")
    return out, summary


def test_build_saves_conversations_the_template_renders(assets):
    from datasets import load_from_disk
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out, summary = assets
    prompts = load_from_disk(str(out / "prompts"))
    for split in ("train", "test"):
        rows = prompts[split]
        assert all(p == [{"role": "user", "content": p[0]["content"]}] for p in rows["prompt"])
        assert rows["answer"] == [rc.answer(p) for p in rows["prompt"]]
        assert all(p[0]["content"].startswith("rev ") for p in rows["prompt"])
    tokenizer = AutoTokenizer.from_pretrained(out / "sft")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left"
    first = prompts["test"]["prompt"][0]
    rendered = tokenizer.apply_chat_template(first, tokenize=False, add_generation_prompt=True)
    assert rendered == f"<|im_start|>user\n{first[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    # the models were trained on that rendering: the build's model inputs are it, token for token
    assert model_inputs(rc.TASK, build_chat_tokenizer(), [first[0]["content"]]) == [rendered]
    assert tokenizer(rendered)["input_ids"] == tokenizer.apply_chat_template(
        first, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    rm = AutoModelForSequenceClassification.from_pretrained(out / "reward")
    assert rm.config.num_labels == 1 and rm.config.vocab_size == len(tokenizer)
    meta = json.loads((out / "task.json").read_text())
    assert meta["name"] == "reverse-chat" and meta["check"] == "rlhfkit.tasks.reverse_chat:check"
    for key in ("pair_accuracy_synthetic", "pair_accuracy_policy", "best_of_8_success"):
        assert 0.0 <= meta["reward"][key] <= 1.0
    assert meta["reward"]["pair_accuracy_synthetic"] > 0.55  # the test preset's reward model beats chance
    task = load_task(out)
    assert task.chat and task.reward_funcs["correctness"]([first], [said(rc.answer(first))]) == [1.0]


def test_default_preset_has_reverse_chat_budgets():
    from rlhfkit.tasks.build import PRESETS, TASK_BUDGETS

    cfg = build_preset("default", "reverse-chat")
    assert "reverse-chat" in TASK_BUDGETS and cfg.sft_steps > PRESETS["default"].sft_steps


FAST = ["--task", "reverse-chat", "--preset", "test", "--report_to", "none", "--num_sample_generations", "1"]
ALGORITHM_FLAGS = {
    "grpo": ["--max_steps", "2", "--per_device_train_batch_size", "16", "--num_generations", "4",
             "--gradient_accumulation_steps", "1", "--per_device_eval_batch_size", "32"],
    "ppo": ["--total_episodes", "32", "--per_device_train_batch_size", "16", "--local_rollout_forward_batch_size", "16",
            "--num_ppo_epochs", "1", "--per_device_eval_batch_size", "32"],
}  # fmt: skip


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_quickstart_trains_on_conversations_and_logs_true_success(algorithm, tmp_path, monkeypatch, capsys):
    from rlhfkit.quickstart import cmd_quickstart

    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))
    seen = []
    real_check = rc.check

    def recording_check(prompt, completion):
        verdict = real_check(prompt, completion)
        seen.append((prompt, completion, verdict))
        return verdict

    monkeypatch.setattr(rc, "check", recording_check)  # task.json names it; load_task imports it from there
    run_dir = tmp_path / "qs"
    argv = ["--algorithm", algorithm, "--output_dir", str(run_dir), *FAST, *ALGORITHM_FLAGS[algorithm]]
    assert cmd_quickstart(argv) == 0
    assert "judge: task:reverse-chat" in capsys.readouterr().out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rollout = [r["rollout/task_success"] for r in rows if "rollout/task_success" in r]
    evals = [r["eval/task_success"] for r in rows if "eval/task_success" in r]
    assert rollout and evals and all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in rollout + evals)
    # the trainers checked the dataset's conversations against decoded completion text; the judge, the rendered
    # prompts: every form the checker reads
    trained = [(p, c) for p, c, _ in seen if not isinstance(p, str)]
    assert trained and all(p[0]["role"] == "user" and isinstance(c, str) for p, c in trained)
    assert any(isinstance(p, str) and p.startswith("<|im_start|>user\nrev ") for p, _, _ in seen)
    # what was logged is the checker's verdicts: every rollout's completions of the first step were checked
    first = rows[[i for i, r in enumerate(rows) if "rollout/task_success" in r][0]]
    assert first["rollout/task_success"] == pytest.approx(sum(v for _, _, v in seen[:16]) / 16)
