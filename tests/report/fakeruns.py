"""Synthetic run directories with known values, written by the real run-directory writer.

A PPO run with everything a report must cope with (eval-only rows, NaN and inf, health findings, a
completion that looks like HTML, a half-written last line) and a GRPO run (different metric names, no
`episode`, no health.jsonl: the health checks did not run). The values are simple functions of the step, so tests can state the
expected first → last exactly.
"""

import json
import math

from rlhfkit.tracking.rundir import RunDirectory

PPO_UPDATES = 40
PPO_BATCH = 16
PPO_EVAL = {0: 0.25, 20: 0.5, 40: 0.75}  # eval/task_success at these steps
PPO_SAMPLE_STEPS = [0, 10, 20, 30, 40]
HTML_COMPLETION = "<script>alert(1)</script>"
PPO_FINDINGS = [
    {"step": 20, "rule": "ratio_far_from_one", "severity": "warning", "metrics": {"val/ratio": 1.9},
     "message": "val/ratio is 1.9", "advice": "Lower the learning rate."},
    {"step": 40, "rule": "value_loss_nan", "severity": "critical", "metrics": {"loss/value_avg": math.nan},
     "message": "loss/value_avg is NaN", "advice": "Lower vf_coef or clip the value loss."},
]  # fmt: skip

GRPO_UPDATES = 30
GRPO_EVAL = {0: 0.1, 15: 0.2, 30: 0.4}


def ppo_response(step: int, i: int) -> str:
    return f"resp-s{step}-{i}"


def ppo_scalars(step: int) -> dict[str, float]:
    """One PPO update's metrics; NaN value loss on the last update, an infinite ratio at update 30."""
    return {
        "objective/rlhf_reward": -1 + step / 20,
        "objective/scores": -0.5 + step / 20,
        "objective/non_score_reward": -0.01 * step,
        "objective/kl": 0.2 * step,
        "objective/entropy": 2.0 - 0.01 * step,
        "policy/approxkl_avg": 0.01,
        "policy/clipfrac_avg": 0.05,
        "loss/policy_avg": -0.01,
        "loss/value_avg": math.nan if step == PPO_UPDATES else 0.5 / step,
        "val/ratio": math.inf if step == 30 else 1.0,
        "rollout/task_success": 0.2 + step / 100,
        "lr": 1e-4 * (1 - step / PPO_UPDATES),
        "eps": 8.0,
        "episode": step * PPO_BATCH,
    }


def write_ppo_run(path, name="ppo-synthetic", learning_rate=1e-4, truncate=True):
    """The synthetic PPO run; `truncate` leaves a half-written line at the end, as a crash does."""
    run = RunDirectory(path)
    config = {"run_name": name, "learning_rate": learning_rate, "kl_coef": 0.05, "per_device_train_batch_size": 16,
              "nested": {"a": 1, "b": [1, 2]}}  # fmt: skip
    run.prepare(config)
    for step in range(PPO_UPDATES + 1):
        if step in PPO_EVAL:
            run.append_metrics(step, {"eval/task_success": PPO_EVAL[step], "eval/scores": step / 40})
        if step in PPO_SAMPLE_STEPS:
            rows = [[f"sort {i}{step}=", ppo_response(step, i), float(i), i % 2 == 0] for i in range(3)]
            if step == 0:
                rows.append(["sort 9=", HTML_COMPLETION, -1.0, False])
            run.append_samples(step, "completions", ["query", "model response", "score", "correct"], rows)
        if step:
            run.append_metrics(step, ppo_scalars(step))
    with open(path / "health.jsonl", "w") as f:
        for finding in PPO_FINDINGS:
            f.write(json.dumps(finding) + "\n")
    if truncate:
        with open(path / "metrics.jsonl", "a") as f:
            f.write('{"step": 41, "objective/kl": 0.')
    return path


def grpo_scalars(step: int) -> dict[str, float]:
    return {
        "reward": 0.1 + step / 100,
        "reward_std": 0.3,
        "kl": 0.001 * step,
        "entropy": 1.5 - step / 100,
        "completions/clipped_ratio": 0.1,
        "completions/mean_length": 12.0,
        "rewards/correct/mean": step / 100,
        "rewards/correct/std": 0.4,
        "clip_ratio/region_mean": 0.02,
        "num_tokens": 1000.0 * step,
    }


def write_grpo_run(path, name="grpo-synthetic"):
    run = RunDirectory(path)
    run.prepare({"run_name": name, "learning_rate": 3e-4, "kl_coef": 0.05, "num_generations": 8,
                 "nested": {"a": 2, "b": [1, 2]}})  # fmt: skip
    (path / "health.jsonl").unlink(missing_ok=True)  # a run from before the health checks existed
    for step in range(GRPO_UPDATES + 1):
        if step in GRPO_EVAL:
            run.append_metrics(step, {"eval/task_success": GRPO_EVAL[step]})
        if step % 10 == 0:
            rows = [[f"12+{i}=", f"grpo-s{step}-{i}", float(i % 2), 0.5 - i % 2] for i in range(2)]
            run.append_samples(step, "completions", ["prompt", "completion", "correct", "advantage"], rows)
        if step:
            run.append_metrics(step, grpo_scalars(step))
    return path
