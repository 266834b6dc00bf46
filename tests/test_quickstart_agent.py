"""`rlhfkit quickstart --task agent`: the agent task's assets (test preset), a short GRPO or PPO run with the calculator,
greedy episodes of the policy and the SFT model judged by the task's checker; the win rate, accuracies and tool calls
written to agent_eval.json. Plus the flags' bad input."""

import json

import pytest

from rlhfkit.errors import UsageError
from rlhfkit.quickstart import AGENT_EVAL_FILE, cmd_quickstart, split_choice
from rlhfkit.tracking.rundir import BEFORE_AFTER_FILE

FAST = ["--task", "agent", "--preset", "test", "--report_to", "none", "--num_sample_generations", "0"]
ALGORITHM_FLAGS = {
    "grpo": ["--max_steps", "1", "--per_device_train_batch_size", "8", "--num_generations", "4",
             "--gradient_accumulation_steps", "1"],
    "ppo": ["--total_episodes", "8", "--per_device_train_batch_size", "8", "--local_rollout_forward_batch_size", "8",
            "--num_ppo_epochs", "1"],
}  # fmt: skip


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_agent_quickstart_trains_and_judges_episodes(algorithm, tmp_path, capsys):
    run_dir = tmp_path / "qs"
    argv = ["--algorithm", algorithm, "--output_dir", str(run_dir), *FAST, *ALGORITHM_FLAGS[algorithm]]
    assert cmd_quickstart(argv) == 0
    out = capsys.readouterr().out
    assert f"{algorithm.upper()} policy vs the SFT model on 32 held-out prompts" in out
    assert out.count("Model win rate:") == 1 and "judge: task:agent" in out
    summary = json.loads((run_dir / AGENT_EVAL_FILE).read_text())
    win = summary["win_rate"]
    assert summary["prompts"] == 32 == win["judged"] == win["wins"] + win["ties"] + win["losses"]
    assert win["win_rate"] == pytest.approx((win["wins"] + win["ties"] / 2) / 32)
    for side in ("sft", "policy"):
        assert 0.0 <= summary[side]["accuracy"] <= 1.0 and summary[side]["tool_calls_per_episode"] >= 0.0
    # wins and losses are exactly where one side's episode answers right and the other's does not
    assert win["wins"] - win["losses"] == round(32 * (summary["policy"]["accuracy"] - summary["sft"]["accuracy"]))
    before_after = json.loads((run_dir / BEFORE_AFTER_FILE).read_text())
    assert before_after["win_rates"][0]["judge"] == "task:agent" and before_after["examples"]
    assert "*" in before_after["examples"][0]["prompt"]  # the user's question, not a rendered conversation
    config = json.loads((run_dir / "run_config.json").read_text())
    assert config["reward_funcs"] == ["correctness"] and config["max_tool_calling_iterations"] == 2


def test_quickstart_task_flag_is_checked():
    assert split_choice(["--task=agent", "--seed", "1"], "task", ("sort", "agent"), "sort") == (
        "agent",
        ["--seed", "1"],
    )
    assert split_choice(["--seed", "1"], "task", ("sort", "agent"), "sort") == ("sort", ["--seed", "1"])
    with pytest.raises(UsageError, match=r"--task 'chess': must be one of sort, reverse, addition, agent"):
        cmd_quickstart(["--task", "chess"])
    with pytest.raises(UsageError, match=r"--task needs a value"):
        cmd_quickstart(["--task"])
    with pytest.raises(UsageError, match=r"--preset 'huge': must be one of default, test"):
        cmd_quickstart(["--preset", "huge"])
