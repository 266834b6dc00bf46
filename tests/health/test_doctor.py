"""doctor(): replay a run directory's metrics.jsonl or a TRL run's TensorBoard events; cmd_doctor(): the summary of
what was read (reader, rows and steps, mapped names, notes, rules without their metrics), table with the evidence,
exit status, errors."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.health import CRITICAL, RULES, WARNING, Thresholds, cmd_doctor, doctor, resume_monitor
from rlhfkit.health.doctor import rules_without_metrics, summary, summary_lines
from rlhfkit.health.sources import Source

ROOT = Path(__file__).resolve().parents[2]
HEALTHY_PPO = Path(__file__).with_name("healthy_ppo_metrics.jsonl")


def write_run(run_dir: Path, ratios, torn_tail: str | None = None) -> Path:
    """A run directory whose metrics.jsonl has one row per ratio (steps 1..n) and an eval row at step 0."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": 0, "eval/task_success": 0.4})]
    lines += [json.dumps({"step": i, "val/ratio": r, "loss/value_avg": 0.2}) for i, r in enumerate(ratios, 1)]
    text = "\n".join(lines) + "\n" + (torn_tail or "")
    (run_dir / "metrics.jsonl").write_text(text)
    return run_dir


def write_trl_tensorboard(output_dir: Path, changes: dict[int, dict[str, float]] | None = None) -> Path:
    """A TRL GRPO output_dir with TensorBoard events (runs/<name>/, TRL's keys under train/) of 12 healthy steps, with
    `changes` per step."""
    from torch.utils.tensorboard import SummaryWriter

    healthy = {"train/loss": 0.01, "train/kl": 0.001, "train/entropy": 0.3, "train/reward": 0.5}
    healthy |= {"train/reward_std": 0.3, "train/completions/clipped_ratio": 0.0, "train/frac_reward_zero_std": 0.1}
    writer = SummaryWriter(str(output_dir / "runs" / "Nov25_23-06-20_host"))
    for step in range(1, 13):
        for tag, value in {**healthy, **(changes or {}).get(step, {})}.items():
            writer.add_scalar(tag, value, step)
    writer.close()
    return output_dir


def test_doctor_on_a_crashed_run_skips_the_torn_last_line(tmp_path):
    run = write_run(tmp_path / "run", [1.0] * 30 + [3.0] * 5 + [15.0], torn_tail='{"step": 37, "val/rat')
    d = doctor(run)
    assert (d.rows, d.skipped_lines, d.last_step) == (37, [38], 36)
    assert [(f.step, f.rule, f.severity) for f in d.findings] == [
        (31, "ratio_far_from_one", WARNING),
        (36, "ratio_far_from_one", CRITICAL),
    ]
    assert d.firing_at_end == {"ratio_far_from_one": CRITICAL}


def test_doctor_applies_thresholds(tmp_path):
    run = write_run(tmp_path / "run", [1.0, 3.0])
    assert doctor(run, Thresholds(ratio_warning_high=4.0)).findings == []


def test_doctor_on_the_healthy_run(tmp_path):
    run = tmp_path / "healthy"
    run.mkdir()
    shutil.copy(HEALTHY_PPO, run / "metrics.jsonl")
    d = doctor(run)
    assert (d.findings, d.rows, d.skipped_lines, d.last_step) == ([], 171, [], 160)


def test_cmd_doctor_no_findings_exit_0(tmp_path, capsys):
    run = write_run(tmp_path / "run", [1.0] * 5)
    assert cmd_doctor([str(run)]) == 0
    out = capsys.readouterr().out
    assert "6 rows up to step 5" in out and "No findings" in out


def test_cmd_doctor_warnings_only_exit_0_critical_exit_1(tmp_path, capsys):
    assert cmd_doctor([str(write_run(tmp_path / "warn", [1.0, 3.0]))]) == 0
    out = capsys.readouterr().out
    assert "ratio_far_from_one" in out and "0 critical, 1 warning, 0 info finding(s)" in out and "What to try" in out
    assert cmd_doctor([str(write_run(tmp_path / "crit", [1.0, 3.0, 20.0]))]) == 1
    out = capsys.readouterr().out
    assert (
        "1 critical, 1 warning, 0 info finding(s)" in out and "Still firing at the last row: ratio_far_from_one" in out
    )


def test_cmd_doctor_on_trl_tensorboard_events_shows_the_evidence_of_each_finding(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # the table's evidence cells unwrapped
    out = write_trl_tensorboard(tmp_path / "sick", {5: {"train/loss": math.nan}, 9: {"train/kl": 5.0}})
    found = [(f.step, f.rule, f.severity) for f in doctor(out).findings]
    assert (5, "nonfinite_metric", CRITICAL) in found and (9, "kl_far_from_reference", CRITICAL) in found
    assert cmd_doctor([str(out)]) == 1
    printed = capsys.readouterr().out
    assert f"12 rows up to step 12 (TensorBoard events in {out / 'runs' / 'Nov25_23-06-20_host'})" in printed
    assert "loss: 1: 0.01, 2: 0.01, 3: 0.01, 4: 0.01, [5: nan], 6: 0.01, 7: 0.01 " in printed  # no threshold
    kl = "kl: 5: 0.001, 6: 0.001, 7: 0.001, 8: 0.001, [9: 5], 10: 0.001, 11: 0.001"
    assert f"{kl} (threshold {Thresholds().kl_critical:g})" in printed


def test_cmd_doctor_on_healthy_trl_tensorboard_events_exit_0(tmp_path, capsys):
    out = write_trl_tensorboard(tmp_path / "healthy")
    assert doctor(out).findings == []
    assert cmd_doctor([str(out)]) == 0
    printed = capsys.readouterr().out
    assert "12 rows up to step 12 (TensorBoard events in" in printed and "No findings" in printed


def test_cmd_doctor_mentions_the_torn_line(tmp_path, capsys):
    run = write_run(tmp_path / "run", [1.0] * 3, torn_tail='{"step": 4, "val')
    assert cmd_doctor([str(run)]) == 0
    assert "skipped unreadable line(s) 5" in capsys.readouterr().out


def test_cmd_doctor_json_output_the_summary_then_one_finding_per_line(tmp_path, capsys):
    run = str(write_run(tmp_path / "run", [1.0, 3.0]))
    assert cmd_doctor([run, "--json"]) == 0
    first, line = capsys.readouterr().out.splitlines()
    assert json.loads(line)["rule"] == "ratio_far_from_one" and json.loads(line)["step"] == 2
    facts = json.loads(first)["summary"]
    assert facts == {
        "run": run,
        "source": "metrics.jsonl",
        "reader": "metrics.jsonl",
        "rows": 3,
        "steps": {"first": 0, "last": 2, "count": 3},
        "skipped_lines": [],
        "framework": None,
        "mapped": {},
        "notes": [],
        "rules_without_metrics": facts["rules_without_metrics"],
        "findings": {"critical": 0, "warning": 1, "info": 0},
    }
    assert (
        "ratio_far_from_one" not in facts["rules_without_metrics"] and "kl_runaway" in facts["rules_without_metrics"]
    )


def test_cmd_doctor_thresholds_flag(tmp_path, capsys):
    run = str(write_run(tmp_path / "run", [1.0, 3.0]))
    assert cmd_doctor([run, "--health_thresholds", "ratio_warning_high=4"]) == 0
    assert "No findings" in capsys.readouterr().out
    assert cmd_doctor([run, "--health_thresholds", "ratio_high=4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlhfkit doctor: error: unknown health threshold(s) ratio_high") and err.count("\n") == 1


def test_cmd_doctor_missing_directory_or_metrics_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert cmd_doctor([str(missing)]) == 2
    assert capsys.readouterr().err == f"rlhfkit doctor: error: {str(missing)!r} does not exist\n"
    (tmp_path / "empty").mkdir()
    assert cmd_doctor([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "no metrics.jsonl" in err and str(tmp_path / "empty" / "metrics.jsonl") in err


def test_cmd_doctor_without_run_dir_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cmd_doctor([])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "usage: rlhfkit doctor" in err and "run_dir" in err


@pytest.mark.slow
def test_cmd_doctor_in_a_subprocess(tmp_path):
    run = write_run(tmp_path / "run", [1.0, 20.0])
    code = "import sys; from rlhfkit.health import cmd_doctor; sys.exit(cmd_doctor(sys.argv[1:]))"
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="120")
    result = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, env=env)
    assert result.returncode == 1, result.stderr
    assert "ratio_far_from_one" in result.stdout and "critical" in result.stdout


def test_cmd_doctor_prints_the_summary_above_the_findings(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    entries = [{"reward": 0.5, "kl": 0.001, "completion_length": None, "step": s} for s in (10, 20, 30)]
    entries[1]["kl"] = 5.0
    entries.append({"train_runtime": 100.0, "train_loss": 0.01, "train_samples_per_second": 2.0, "step": 30})
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": entries}))
    assert cmd_doctor([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    head = out.split("Health findings")[0].splitlines()
    idle = rules_without_metrics([{"reward": 1, "kl": 1}])
    assert head == [
        f"rlhfkit doctor {tmp_path}: 3 rows up to step 30 ({tmp_path / 'trainer_state.json'})",
        "Read with the trainer_state reader: 3 rows, steps 10..30 (3 steps).",
        "Note: the final summary row at step 30 is not a training row, left out (train_runtime 100, train_loss 0.01, "
        "train_samples_per_second 2).",
        "Note: null or non-numeric values left out: completion_length (3 rows).",
        f"Not run, no metric they read in this run ({len(idle)} of {len(RULES)} rules): {', '.join(idle)}.",
        head[-1],  # the table's title line
    ]
    assert out.index("kl_far_from_reference") > out.index("Not run")


def test_the_summary_names_the_metrics_mapped_from_other_frameworks_names():
    rows = [{"step": 1, "reward": 0.5, "kl": 0.01}, {"step": 3, "reward": 0.6, "kl": 0.02}]
    mapped = {"reward": "critic/score/mean", "kl": "critic/kl", "entropy": "entropy"}  # the same name: not shown
    source = Source(rows, "verl console log x.log", [7], "verl_log", mapped, ["a note"], "verl")
    facts = summary("x.log", doctor(None, source=source))
    assert facts["mapped"] == {"reward": "critic/score/mean", "kl": "critic/kl"} and facts["framework"] == "verl"
    assert facts["steps"] == {"first": 1, "last": 3, "count": 2} and facts["skipped_lines"] == [7]
    lines = summary_lines(facts)
    assert lines[:3] == [
        "Read with the verl_log reader: 2 rows, steps 1..3 (2 steps).",
        "Metrics mapped from the run's names (verl): reward <- critic/score/mean, kl <- critic/kl.",
        "Note: a note.",
    ]


def test_rules_without_metrics_are_those_whose_metrics_no_row_holds():
    assert "nonfinite_metric" not in rules_without_metrics([])  # it reads every metric: it always runs
    assert rules_without_metrics([]) == [rule.name for rule in RULES if rule.metrics]
    idle = rules_without_metrics([{"step": 1, "reward": 0.5}, {"step": 2, "val/ratio": 1.0}])
    assert "reward_collapse" not in idle and "ratio_far_from_one" not in idle and "kl_runaway" in idle


def test_cmd_doctor_revision_goes_with_a_run_dir_only(capsys):
    with pytest.raises(SystemExit):
        cmd_doctor(["--trackio", "p", "--revision", "main"])
    assert "--revision goes with a Hub repo id" in capsys.readouterr().err


def test_resume_monitor_continues_the_episode_and_keeps_the_start_level(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"step": s, "val/ratio": 3.0 if s >= 25 else 1.0, "policy/entropy_avg": 2.0 if s <= 5 else 0.5}
        for s in range(1, 41)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monitor = resume_monitor(run, until_step=30)  # rows 31..40 were logged after the last checkpoint
    assert monitor.history.step == 30 and monitor.firing() == {"ratio_far_from_one": WARNING}
    assert monitor.observe(31, {"val/ratio": 3.0}) == []  # the episode reported at step 25 goes on
    # The entropy start level is the run's (2.0), not the resume point's (0.5): 0.15 < 0.1 * 2.0 fires.
    found = [monitor.observe(s, {"policy/entropy_avg": 0.15}) for s in range(32, 37)]
    assert [f.rule for fs in found for f in fs] == ["entropy_collapse"]


def test_resume_monitor_without_metrics_is_fresh(tmp_path):
    monitor = resume_monitor(tmp_path, until_step=10)
    assert monitor.history.step is None and monitor.firing() == {}


def test_a_reader_that_closes_the_pipe_ends_the_doctor_quietly(tmp_path):
    """`rlhfkit doctor RUN --json | head -1`: the pipe is closed before the doctor writes; it exits with 141 (128 +
    SIGPIPE, as a shell's commands do) and no traceback."""
    import subprocess
    import sys

    rows = [{"step": s, "reward": 0.5, "kl": float("nan") if s == 3 else 0.01} for s in range(1, 6)]
    state = tmp_path / "trainer_state.json"
    state.write_text(json.dumps({"log_history": rows}))
    process = subprocess.Popen(
        [sys.executable, "-m", "rlhfkit.cli", "doctor", str(state), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # before the interpreter has even imported rlhfkit
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141 and "Traceback" not in stderr, stderr
