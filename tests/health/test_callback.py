"""HealthCallback driven as a transformers Trainer drives it (TrainingArguments, TrainerState, TrainerControl, on_log
with TRL's GRPO logs; no model): quiet on a healthy stream; a finding printed and appended to health.jsonl on a NaN or
a KL far from the reference; "stop" ends training on a critical finding, "warn" does not; eval_ keys reach the rules
as eval/."""

import json
import math

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from rlhfkit.health import CRITICAL, HealthCallback
from rlhfkit.health.callback import logged_row
from rlhfkit.tracking.rundir import HEALTH_FILE


def grpo_logs(**changes) -> dict:
    """One healthy step of what TRL's GRPOTrainer passes to on_log (bare names), with `changes`."""
    logs = {
        "loss": 0.01, "grad_norm": 0.5, "learning_rate": 1e-6, "num_tokens": 1024.0, "kl": 0.001, "entropy": 0.3,
        "reward": 0.5, "reward_std": 0.3, "completions/clipped_ratio": 0.0, "frac_reward_zero_std": 0.1,
        "completions/mean_length": 12.0, "epoch": 0.01,
    }  # fmt: skip
    return {**logs, **changes}


def drive(callback: HealthCallback, output_dir, logs_by_step) -> tuple[TrainerState, list[TrainerControl]]:
    """on_log for each (step, logs), as the Trainer calls it, with a fresh TrainerControl each time."""
    args = TrainingArguments(output_dir=str(output_dir), report_to="none")
    state, controls = TrainerState(), []
    for step, logs in logs_by_step:
        state.global_step = step
        control = TrainerControl()
        assert callback.on_log(args, state, control, logs=logs) is control
        controls.append(control)
    return state, controls


def health_lines(output_dir) -> list[dict]:
    path = output_dir / HEALTH_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def healthy(steps=range(1, 31)):
    return [(step, grpo_logs(epoch=step / 100)) for step in steps]


def test_importable_from_the_health_package():
    from rlhfkit.health.callback import HealthCallback as defined

    assert HealthCallback is defined
    with pytest.raises(ValueError, match="mode='off'"):
        HealthCallback(mode="off")


def test_logged_row_reads_numbers_and_eval_keys_under_the_rules_names():
    logs = {"kl": 0.5, "eval_task_success": 0.25, "eval_loss": 1, "train/reward": 0.75, "epoch": 1.0}
    logs |= {"is_done": True, "note": "x", "_runtime": 3.0, "global_step": 9}
    row = logged_row(logs)
    assert row == {"kl": 0.5, "eval/task_success": 0.25, "eval/loss": 1.0, "reward": 0.75, "epoch": 1.0}
    assert isinstance(row["eval/loss"], float)


def test_a_healthy_stream_gives_no_finding_and_no_health_file(tmp_path, capsys):
    callback = HealthCallback(mode="stop")
    _, controls = drive(callback, tmp_path, healthy())
    assert callback.findings == [] and not (tmp_path / HEALTH_FILE).exists()
    assert not any(c.should_training_stop or c.should_save for c in controls)
    assert "health" not in capsys.readouterr().out  # no panel printed
    assert callback.monitor.history.step == 30  # every row reached the rules


def test_a_nan_is_a_critical_finding_written_to_health_jsonl_and_warn_mode_goes_on(tmp_path, capsys):
    callback = HealthCallback()  # mode="warn"
    stream = healthy(range(1, 11)) + [(11, grpo_logs(loss=math.nan)), (12, grpo_logs(loss=math.inf))]
    _, controls = drive(callback, tmp_path, stream + healthy(range(13, 16)))
    assert [(f.step, f.rule, f.severity) for f in callback.findings] == [(11, "nonfinite_metric", CRITICAL)]
    (line,) = health_lines(tmp_path)  # the episode goes on at step 12: reported once
    assert line["step"] == 11 and line["rule"] == "nonfinite_metric" and line["severity"] == CRITICAL
    assert list(line["metrics"]) == ["loss"] and math.isnan(line["metrics"]["loss"])
    assert line == json.loads(json.dumps(callback.findings[0].to_dict()))
    assert not any(c.should_training_stop or c.should_save for c in controls)
    assert "nonfinite_metric at step 11" in capsys.readouterr().out


def test_stop_mode_ends_training_on_a_kl_far_from_the_reference(tmp_path):
    callback = HealthCallback(mode="stop")
    stream = healthy(range(1, 11)) + [(11, grpo_logs(kl=3.0))]  # GRPO's kl is per token: >= 2 nats is critical
    _, controls = drive(callback, tmp_path, stream)
    found = [(f.step, f.rule, f.severity) for f in callback.findings]
    assert (11, "kl_far_from_reference", CRITICAL) in found and all(step == 11 for step, _, _ in found)
    assert [(c.should_training_stop, c.should_save) for c in controls] == [(False, False)] * 10 + [(True, True)]
    assert [(d["step"], d["rule"], d["severity"]) for d in health_lines(tmp_path)] == found
    assert health_lines(tmp_path)[found.index((11, "kl_far_from_reference", CRITICAL))]["metrics"] == {"kl": 3.0}


def test_eval_keys_reach_the_rules_as_eval_names(tmp_path):
    callback = HealthCallback(mode="stop")
    eval_logs = {"eval_loss": 0.2, "eval_task_success": math.nan, "eval_runtime": 1.0, "epoch": 0.1}
    _, controls = drive(callback, tmp_path, healthy(range(1, 6)) + [(5, eval_logs)])
    (finding,) = callback.findings
    assert (finding.step, finding.rule) == (5, "nonfinite_metric")
    assert list(finding.metrics) == ["eval/task_success"] and controls[-1].should_training_stop
    assert health_lines(tmp_path)[0]["metrics"].keys() == {"eval/task_success"}


def test_an_empty_or_non_numeric_log_is_not_a_row(tmp_path):
    callback = HealthCallback(mode="stop")
    drive(callback, tmp_path, [(1, {}), (2, {"note": "x", "_runtime": 1.0})])
    assert callback.monitor.history.step is None and callback.findings == []


def test_other_processes_decide_alike_but_only_process_zero_writes(tmp_path, capsys):
    callback = HealthCallback(mode="stop")
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    state, control = TrainerState(is_world_process_zero=False), TrainerControl()
    state.global_step = 3
    callback.on_log(args, state, control, logs=grpo_logs(loss=math.nan))
    assert [f.rule for f in callback.findings] == ["nonfinite_metric"] and control.should_training_stop
    assert not (tmp_path / HEALTH_FILE).exists() and "health" not in capsys.readouterr().out


def test_thresholds_are_passed_to_the_rules(tmp_path):
    callback = HealthCallback(mode="stop", thresholds="kl_critical=5")
    _, controls = drive(callback, tmp_path, healthy(range(1, 6)) + [(6, grpo_logs(kl=3.0))])
    assert "kl_far_from_reference" not in [f.rule for f in callback.findings]
    assert not controls[-1].should_training_stop
    with pytest.raises(ValueError, match="unknown health threshold"):
        HealthCallback(thresholds="kl_limit=5")
