"""`rlhfkit eval` end to end on the tiny built-in assets, the Python API behind it, and its errors."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from rlhfkit.evaluation import Outcome, RewardModelJudge, cmd_eval, compare_judges, load_eval_prompts
from rlhfkit.tasks import generate_completions


@pytest.fixture(scope="module")
def random_model(tiny_assets, tmp_path_factory):
    """An untrained model with the SFT model's architecture and tokenizer: a baseline that differs from it."""
    out = tmp_path_factory.mktemp("random") / "model"
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_assets / "sft")).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_assets / "sft").save_pretrained(out)
    return out


def test_model_against_itself_is_50_percent_all_ties(tiny_assets, capsys):
    sft = str(tiny_assets / "sft")
    argv = ["--model", sft, "--baseline", sft, "--task", str(tiny_assets), "--judge", "task", "--num_examples", "8"]
    assert cmd_eval(argv) == 0
    out = capsys.readouterr().out
    assert "rlhfkit eval: 8 prompts from" in out and "greedy" in out
    assert "Model win rate: 50.00%" in out
    assert "judge: task:sort; 8 verdicts (wins 0, ties 8, losses 0)" in out
    assert "baseline win rate: 50.00%" in out
    assert "decisive-only win rate: n/a" in out


def reference_verdicts(tiny_assets, model_dir, baseline_dir, prompts):
    """Independent path: the task package's generator and the reward model's own unpadded forward pass."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "sft")
    texts = [
        generate_completions(AutoModelForCausalLM.from_pretrained(d), tokenizer, prompts, 8).texts
        for d in (model_dir, baseline_dir)
    ]
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_assets / "reward").eval()

    def score(prompt, completion):
        ids = tokenizer(prompt + completion)["input_ids"] + [tokenizer.eos_token_id]
        with torch.no_grad():
            return rm(input_ids=torch.tensor([ids])).logits[0, 0].item()

    scores = [[score(p, t) for p, t in zip(prompts, side)] for side in texts]
    return texts, scores


def test_compare_matches_an_independent_computation(tiny_assets, random_model):
    prompts = load_eval_prompts(tiny_assets / "prompts", "test", "prompt", num_examples=12)
    judge = RewardModelJudge.from_path(tiny_assets / "reward")
    comparison = compare_judges(tiny_assets / "sft", random_model, [judge], prompts, max_new_tokens=8, batch_size=5)
    (texts_model, texts_base), (s_model, s_base) = reference_verdicts(
        tiny_assets, tiny_assets / "sft", random_model, prompts
    )
    assert comparison.model.texts == texts_model
    assert comparison.baseline.texts == texts_base
    assert all(abs(a - b) > 1e-3 for a, b in zip(s_model, s_base))  # well separated: the signs below are certain
    wins = sum(a > b for a, b in zip(s_model, s_base))
    (w,) = comparison.win_rates
    assert (w.wins, w.losses, w.ties) == (wins, len(prompts) - wins, 0)
    assert [v.outcome is Outcome.A for v in comparison.verdicts[0]] == [a > b for a, b in zip(s_model, s_base)]
    assert w.rate == pytest.approx(wins / len(prompts))


def test_several_judges_and_a_dataset_file(tiny_assets, random_model, tmp_path, capsys):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"text": f"sort {n}="}) + "\n" for n in ("3142", "90710", "5555")))
    argv = ["--model", str(tiny_assets / "sft"), "--baseline", str(random_model), "--task", str(tiny_assets)]
    argv += ["--dataset", str(data), "--dataset_text_field", "text", "--max_new_tokens", "6", "--num_examples", "9"]
    argv += ["--judge", "task", "--judge", f"reward-model:{tiny_assets / 'reward'}", "--temperature", "1.5"]
    assert cmd_eval(argv) == 0
    out = capsys.readouterr().out
    assert "3 prompts (only 3 available)" in out and "sampling at temperature 1.5, up to 6 new tokens" in out
    assert out.count("Model win rate: ") == 2
    assert "judge: task:sort; 3 verdicts" in out and f"judge: reward-model:{tiny_assets / 'reward'}; 3 verdicts" in out


def test_progress_shows_on_a_terminal_and_stdout_keeps_only_the_report(tiny_assets, random_model, monkeypatch, capsys):
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich takes stderr for a terminal
    monkeypatch.setenv("COLUMNS", "200")
    argv = ["--model", str(tiny_assets / "sft"), "--baseline", str(random_model), "--task", str(tiny_assets)]
    argv += ["--judge", f"reward-model:{tiny_assets / 'reward'}", "--num_examples", "8", "--batch_size", "4"]
    assert cmd_eval(argv) == 0
    out, err = capsys.readouterr()
    for bar in ("completions of the model", "completions of the baseline", "scoring by reward-model:"):
        assert bar in err and bar not in out
    assert "8/8" in err  # each model's completions
    assert "Model win rate: " in out and "\x1b" not in out


def run_eval(argv, capsys):
    code = cmd_eval(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_errors_name_the_flag(tiny_assets, tmp_path, capsys):
    sft = str(tiny_assets / "sft")
    code, err = run_eval(["--model", "/no/such/model", "--baseline", sft], capsys)
    assert code == 2 and err.startswith(
        "rlhfkit eval: error: --model '/no/such/model' is neither a local directory nor a hub model id"
    )
    code, err = run_eval(["--model", sft, "--baseline", str(tmp_path / "missing")], capsys)
    assert code == 2 and "--baseline" in err
    code, err = run_eval(["--baseline", sft], capsys)
    assert code == 2 and err == "rlhfkit eval: error: the following arguments are required: --model\n"
    code, err = run_eval(["--model", sft, "--baseline", sft, "--judge", "gpt4"], capsys)
    assert code == 2 and "--judge 'gpt4' is not a judge" in err
    code, err = run_eval(["--model", sft, "--baseline", sft, "--temperature", "-1"], capsys)
    assert code == 2 and "--temperature must be 0 (greedy) or positive" in err
    code, err = run_eval(["--model", sft, "--baseline", sft, "--task", str(tmp_path)], capsys)
    assert code == 2 and "--task" in err and "task.json" in err
    argv = ["--model", sft, "--baseline", sft, "--task", str(tiny_assets), "--dataset", str(tiny_assets / "prompts")]
    code, err = run_eval([*argv, "--dataset_test_split", "validation"], capsys)
    assert code == 2 and "--dataset_test_split 'validation' is not in" in err and "train, test" in err
    code, err = run_eval([*argv, "--dataset_text_field", "question"], capsys)
    assert code == 2 and "no 'question' column (columns: prompt, answer)" in err


@pytest.mark.slow
def test_missing_model_exits_2_without_traceback_in_a_real_process(tiny_assets):
    argv = ["--model", "/no/such/model", "--baseline", str(tiny_assets / "sft")]
    proc = subprocess.run([sys.executable, "-m", "rlhfkit.evaluation", *argv], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("rlhfkit eval: error: --model '/no/such/model'")
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_openai_judge_through_the_cli_reports_malformed_answers(tiny_assets, random_model, monkeypatch, capsys):
    from .chat_server import API_KEY, ChatServer

    monkeypatch.setenv("EVAL_JUDGE_KEY", API_KEY)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    answers = iter(["0", "1", "no idea", "0", "1", "0"] * 10)
    argv = ["--model", str(tiny_assets / "sft"), "--baseline", str(random_model), "--task", str(tiny_assets)]
    argv += ["--num_examples", "6", "--judge", "openai:local-judge", "--judge_api_key_env", "EVAL_JUDGE_KEY"]
    with ChatServer(lambda request: next(answers)) as server:
        assert cmd_eval([*argv, "--judge_base_url", server.url]) == 0
    out = capsys.readouterr().out
    assert len(server.requests) == 6  # the untrained baseline never repeats the SFT model's completion
    assert {r["model"] for r in server.requests} == {"local-judge"}
    assert "judge: openai:local-judge;" in out
    assert "malformed verdicts: 1 of 6 (excluded from the win rate, which is over the 5 well-formed" in out
    assert "'no idea'" in out and "position bias: the judge picked the completion shown first" in out


# ----------------------------------------------------------------------------------------------------------------
# The agent task: greedy episodes whose tools run, judged on their final answers.


@pytest.fixture(scope="module")
def agent_assets():
    from rlhfkit.tasks import builtin_assets

    return builtin_assets("test", task="agent", log=lambda *a, **k: None)


def calculator_script(text: str) -> str:
    """A model that calls the calculator on the user's question, then answers with the result it read."""
    from rlhfkit.tasks.chat_tokenizer import CALL_CLOSE, CALL_OPEN, TOOL_CALL, TOOL_CALL_END

    question = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    if "<tool_response>" in text:
        return text.rsplit("<tool_response>", 1)[1].split("</tool_response>", 1)[0] + "<|im_end|>"
    return f"{TOOL_CALL}{CALL_OPEN}{question}{CALL_CLOSE}{TOOL_CALL_END}<|im_end|>"


def test_agent_task_is_judged_on_episodes_whose_tools_run(agent_assets, monkeypatch, capsys):
    from rlhfkit.sampling import completions as sampling_completions
    from tests.tool_chat import scripted_generate

    sft = str(agent_assets / "sft")
    argv = ["--model", sft, "--baseline", sft, "--task", str(agent_assets), "--num_examples", "6"]
    tokenizer = AutoTokenizer.from_pretrained(sft)
    monkeypatch.setattr(sampling_completions, "generate", scripted_generate(tokenizer, calculator_script))
    assert cmd_eval(argv) == 0
    out = capsys.readouterr().out
    assert "6 prompts of the agent task" in out and "greedy episodes with its tools (calculator)" in out
    # every episode called the calculator once and answered with its result: right every time, on both sides
    assert out.count("accuracy 100.0%, tool calls per episode 1.00 (100.0% of the episodes call a tool)") == 2
    assert "Model win rate: 50.00%" in out and "judge: task:agent; 6 verdicts (wins 0, ties 6, losses 0)" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--judge", "openai:gpt-4o-mini"],
            r"--judge openai:gpt-4o-mini: the agent task is judged .* by its own checker",
        ),
        (["--temperature", "0.7"], r"--temperature: the agent task's episodes are greedy"),
        (["--max_new_tokens", "12"], r"--max_new_tokens: the agent task's episodes are greedy"),
    ],
)
def test_agent_task_flags_that_do_not_apply_are_refused(agent_assets, extra, message, capsys):
    sft = str(agent_assets / "sft")
    assert cmd_eval(["--model", sft, "--baseline", sft, "--task", str(agent_assets), *extra]) == 2
    assert __import__("re").search(message, capsys.readouterr().err)
