"""`rlhfkit report` without a browser: reading run directories, ordering, smoothing, the HTML's content."""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from rlhfkit.errors import ReportError
from rlhfkit.report import build_report, cmd_report, load_run
from rlhfkit.report.build import _markers
from rlhfkit.report.charts import Marker
from rlhfkit.report.page import differing_keys, flatten, sample_steps
from rlhfkit.report.series import chart_sections, detect_trainer, ema, first_last, metric_names, series, x_key
from tests.report import browser, fakeruns
from tests.report.conftest import ROOT


@pytest.fixture(scope="module")
def two_run_report(synthetic_runs, tmp_path_factory):
    """Report of the synthetic PPO and GRPO runs together (the mixed case: no shared episode axis)."""
    out = tmp_path_factory.mktemp("report-two")
    path = build_report(list(synthetic_runs), out, smooth=0.6)
    return path, path.read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------------
# Reading


def test_load_run_skips_a_truncated_last_line_and_keeps_the_rest(synthetic_runs):
    run = load_run(synthetic_runs[0])
    updates = [r for r in run.metrics if "episode" in r]
    assert len(updates) == fakeruns.PPO_UPDATES
    assert [r["step"] for r in run.metrics if "eval/task_success" in r] == sorted(fakeruns.PPO_EVAL)
    assert any("skipped 1 unreadable line" in note for note in run.notes)
    assert run.name == "ppo-synthetic"
    assert [f["rule"] for f in run.findings] == [f["rule"] for f in fakeruns.PPO_FINDINGS]
    assert math.isnan(run.findings[1]["metrics"]["loss/value_avg"])


def test_missing_health_file_is_not_the_same_as_no_findings(synthetic_runs, tmp_path):
    assert load_run(synthetic_runs[1]).findings is None
    checked = fakeruns.write_grpo_run(tmp_path / "checked")
    (checked / "health.jsonl").write_text("")
    assert load_run(checked).findings == []
    # Every run directory gets an empty health.jsonl; with `health: off` it means "not checked".
    config = json.loads((checked / "run_config.json").read_text())
    (checked / "run_config.json").write_text(json.dumps({**config, "health": "off"}))
    assert load_run(checked).findings is None


@pytest.mark.parametrize("case", ["missing", "no-metrics"])
def test_bad_run_directory_is_a_one_line_error_naming_it(case, tmp_path, capsys):
    bad = tmp_path / "not-a-run"
    if case == "no-metrics":
        bad.mkdir()
        (bad / "run_config.json").write_text("{}")
    status = cmd_report([str(bad), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("rlhfkit report: error:") and str(bad) in err
    assert not (tmp_path / "out" / "report.html").exists()


def test_unusable_options_are_errors(synthetic_runs, tmp_path, capsys):
    out = str(tmp_path / "out")
    assert cmd_report([str(synthetic_runs[0]), "--out", out, "--smooth", "1.0"]) == 2
    assert "--smooth" in capsys.readouterr().err
    assert cmd_report([str(synthetic_runs[0]), "--out", out, "--metrics", "nope/*"]) == 2
    assert "nope/*" in capsys.readouterr().err
    with pytest.raises(ReportError):
        build_report([], out)


# ------------------------------------------------------------------------------------------------
# Curves


def test_a_run_that_logged_nothing_still_gets_a_page(tmp_path):
    """A crash before the first update leaves an empty metrics.jsonl: the report says so instead of failing."""
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("")
    html = build_report([run_dir], tmp_path / "out").read_text()
    assert "holds no metrics yet" in html and "run_config.json is missing" in html


def test_findings_are_placed_on_the_charts_of_the_metrics_they_name(synthetic_runs):
    markers = _markers([load_run(synthetic_runs[0])], "episode")
    assert markers == {
        "val/ratio": [Marker(20 * fakeruns.PPO_BATCH, "warning")],
        "loss/value_avg": [Marker(40 * fakeruns.PPO_BATCH, "critical")],
    }


def test_detect_trainer_from_metric_names():
    assert detect_trainer(["objective/kl", "val/ratio"]) == "ppo"
    assert detect_trainer(["reward", "kl", "entropy"]) == "grpo"
    assert detect_trainer(["rewards/format/mean", "frac_reward_zero_std"]) == "grpo"
    assert detect_trainer(["rewards/format/mean", "val/ratio"]) == "ppo"  # PPO logs reward functions too
    assert detect_trainer(["rewards/format/mean"]) == "unknown"
    assert detect_trainer(["eval/task_success"]) == "unknown"


def test_ppo_charts_start_with_true_success_then_the_crucial_values(synthetic_runs):
    names = metric_names(load_run(synthetic_runs[0]))
    sections = dict(chart_sections(names, {"ppo"}))
    assert list(sections) == ["Crucial values", "Watch for stability", "Everything else"]
    assert sections["Crucial values"][:5] == [
        "eval/task_success",
        "objective/rlhf_reward",
        "objective/scores",
        "objective/kl",
        "objective/entropy",
    ]
    assert sections["Watch for stability"][:3] == ["loss/value_avg", "val/ratio", "policy/clipfrac_avg"]
    charted = [n for members in sections.values() for n in members]
    assert sorted(charted) == sorted(set(names)) and "episode" not in charted


def test_grpo_charts_use_the_grpo_crucial_values(synthetic_runs):
    names = metric_names(load_run(synthetic_runs[1]))
    crucial = dict(chart_sections(names, {"grpo"}))["Crucial values"]
    assert crucial[:5] == ["eval/task_success", "reward", "kl", "entropy", "completions/clipped_ratio"]
    assert "rewards/correct/mean" in crucial


def test_metrics_option_keeps_the_users_order_and_globs():
    names = ["objective/kl", "objective/scores", "lr", "eval/task_success"]
    assert chart_sections(names, {"ppo"}, ["lr", "objective/*"]) == [
        ("Selected metrics", ["lr", "objective/kl", "objective/scores"])
    ]


def test_x_axis_is_episode_only_when_every_run_has_it(synthetic_runs):
    ppo, grpo = (load_run(p) for p in synthetic_runs)
    assert x_key([ppo]) == "episode" and x_key([ppo, grpo]) == "step"
    # Eval rows carry no episode: it is interpolated from the update rows (step 0 = episode 0).
    s = series(ppo, "eval/task_success", "episode")
    assert s.x.tolist() == [0, 20 * fakeruns.PPO_BATCH, 40 * fakeruns.PPO_BATCH]
    assert s.y.tolist() == [0.25, 0.5, 0.75]


def test_a_step_logged_twice_keeps_its_last_value(tmp_path):
    run_dir = fakeruns.write_grpo_run(tmp_path / "resumed")
    with open(run_dir / "metrics.jsonl", "a") as f:  # a resumed run logs step 30 again
        f.write(json.dumps({"step": 30, "reward": 9.0}) + "\n")
    s = series(load_run(run_dir), "reward", "step")
    assert s.steps.tolist() == list(range(1, 31)) and s.y[-1] == 9.0


def test_ema_matches_tensorboard_debiased_smoothing_and_skips_nan():
    assert ema(np.array([1.0, 2.0]), 0.0).tolist() == [1.0, 2.0]
    # w = 0.5: s1 = 0.5 / (1 - 0.5) = 1; s2 = (0.25 + 1.0) / (1 - 0.25) = 5/3
    np.testing.assert_allclose(ema(np.array([1.0, 2.0]), 0.5), [1.0, 5 / 3], rtol=1e-12)
    out = ema(np.array([1.0, np.nan, 2.0]), 0.5)
    assert math.isnan(out[1])
    np.testing.assert_allclose(out[[0, 2]], [1.0, 5 / 3], rtol=1e-12)


def test_first_last_is_exact_for_evaluations_and_windowed_for_updates(synthetic_runs):
    run = load_run(synthetic_runs[0])
    ev = first_last(series(run, "eval/task_success", "episode"))
    assert (ev.first, ev.last, ev.window) == (0.25, 0.75, 1)
    # 40 updates -> the mean of 2 values at each end; rlhf_reward = -1 + step / 20.
    fl = first_last(series(run, "objective/rlhf_reward", "episode"))
    assert fl.window == 2
    assert fl.first == pytest.approx(-0.925) and fl.last == pytest.approx(0.975)
    # The value loss ends in NaN: the summary must say so rather than show the last finite value.
    vl = first_last(series(run, "loss/value_avg", "episode"))
    assert math.isnan(vl.last) and vl.nonfinite == 1


def test_sample_steps_are_first_middle_last():
    assert sample_steps([0, 10, 20, 30, 40, 10]) == [0, 20, 40]
    assert sample_steps([0, 10]) == [0, 10]
    assert sample_steps([5]) == [5]
    assert sample_steps([]) == []


def test_config_differences_compare_nested_keys_and_absent_ones():
    a = flatten({"lr": 1, "nested": {"a": 1, "b": [1, 2]}, "same": None})
    b = flatten({"lr": 2, "nested": {"a": 1, "b": [1, 3]}, "same": None, "extra": 0})
    assert differing_keys([a, b]) == ["lr", "nested/b", "extra"]


# ------------------------------------------------------------------------------------------------
# The page


def test_report_files_are_written_one_png_per_chart(two_run_report, synthetic_runs):
    path, html = two_run_report
    names = set(metric_names(load_run(synthetic_runs[0]))) | set(metric_names(load_run(synthetic_runs[1])))
    pngs = {p.name for p in path.parent.glob("*.png")}
    assert {n.replace("/", "-") + ".png" for n in names} <= pngs
    assert "health-timeline.png" in pngs
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in path.parent.glob("*.png"))
    assert html.count('<figure id="chart-') == len(names)


def test_report_is_self_contained(two_run_report):
    _, html = two_run_report
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html, re.I)
    assert "@import" not in html and "url(" not in html and "<script" not in html.lower().replace("&lt;script", "")
    assert html.count('src="data:image/png;base64,') >= 20


def test_report_escapes_model_output(two_run_report):
    _, html = two_run_report
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert fakeruns.HTML_COMPLETION not in html


def test_summary_states_first_and_last_values(two_run_report):
    _, html = two_run_report
    summary = html[html.index('id="summary"') : html.index('id="charts"')]
    assert "0.25 → 0.75" in summary  # PPO eval/task_success
    assert "0.1 → 0.4" in summary  # GRPO eval/task_success
    assert "-0.925 → 0.975" in summary  # PPO objective/rlhf_reward, 2-value windows
    assert '<span class="badge" style="background:#c81e1e">1 critical</span>' in summary
    assert "not checked" in summary  # the GRPO run has no health.jsonl
    assert summary.index("eval/task_success") < summary.index("objective/rlhf_reward")


def test_samples_show_first_middle_last_steps_only(two_run_report):
    _, html = two_run_report
    samples = html[html.index('id="samples"') : html.index('id="config"')]
    for step in (0, 20, 40):
        assert fakeruns.ppo_response(step, 0) in samples
    for step in (10, 30):
        assert fakeruns.ppo_response(step, 0) not in samples
    assert "grpo-s0-1" in samples and "grpo-s30-1" in samples and "grpo-s10-1" not in samples
    assert "correct 2/4" in samples  # step 0: rows 0 and 2 of 3, plus the HTML one (False)


def test_config_shows_only_differing_keys_for_several_runs(two_run_report):
    _, html = two_run_report
    config = html[html.index('id="config"') :]
    shown = config[: config.index("<details>")]
    for key in ("run_name", "learning_rate", "num_generations", "nested/a", "per_device_train_batch_size"):
        assert f"<td>{key}</td>" in shown
    assert "<td>kl_coef</td>" not in shown and "<td>nested/b</td>" not in shown


def test_findings_table_lists_each_finding(two_run_report):
    _, html = two_run_report
    health = html[html.index('id="health"') : html.index('id="samples"')]
    for finding in fakeruns.PPO_FINDINGS:
        assert f"<code>{finding['rule']}</code>" in health and finding["advice"] in health
    assert "loss/value_avg = NaN" in health


@pytest.mark.slow
def test_real_ppo_run_charts_every_logged_scalar(tracked_run, tmp_path):
    """A run written by the trainer itself: every logged scalar gets a chart, the samples are shown."""
    run_dir, _ = tracked_run
    path = build_report([run_dir], tmp_path / "report", smooth=0.0)
    html = path.read_text(encoding="utf-8")
    logged = set(metric_names(load_run(run_dir)))
    assert {"eval/task_success", "objective/rlhf_reward", "objective/kl", "loss/value_avg"} <= logged
    charted = set(re.findall(r'data-metric="([^"]+)"><img', html))
    assert charted == logged
    first_query = json.loads((run_dir / "samples.jsonl").read_text().splitlines()[0])["query"]
    assert first_query in html
    config = json.loads((run_dir / "run_config.json").read_text())
    health_ran = (run_dir / "health.jsonl").exists() and config.get("health") != "off"
    assert ("The health checks did not run" in html) == (not health_ran)


# ------------------------------------------------------------------------------------------------
# Command line, in a subprocess as a user runs it


def run_command(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_module_command_writes_the_report_and_prints_its_path(synthetic_runs, tmp_path):
    result = run_command("-m", "rlhfkit.report", str(synthetic_runs[1]), "--out", "out", "--metrics", "reward",
                         "--smooth", "0", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"Report: {os.path.join('out', 'report.html')}"
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == ["reward.png"]
    help_result = run_command("-m", "rlhfkit.report", "--help", cwd=tmp_path)
    assert help_result.returncode == 0 and "--smooth" in help_result.stdout and "--metrics" in help_result.stdout


@pytest.mark.slow
def test_rlhfkit_report_subcommand(synthetic_runs, tmp_path):
    result = run_command("-m", "rlhfkit.cli", "report", str(synthetic_runs[0]), "--out", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "report.html").is_file()
    missing = run_command("-m", "rlhfkit.cli", "report", "no-such-run", "--out", "out", cwd=tmp_path)
    assert missing.returncode == 2 and "no-such-run" in missing.stderr
    help_result = run_command("-m", "rlhfkit.cli", "report", "--help", cwd=tmp_path)
    assert help_result.returncode == 0 and help_result.stdout.startswith("usage: rlhfkit report")


def test_missing_browser_skips_unless_ci_requires_it(monkeypatch):
    """Without Chromium the browser tests skip, naming what to install; RLHFKIT_REQUIRE_BROWSER=1 fails them."""
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.delenv(browser.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium-driver"):
        browser.require_browser()
    monkeypatch.setenv(browser.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="RLHFKIT_REQUIRE_BROWSER=1"):
        browser.require_browser()


def test_before_after_opens_the_report_and_escapes_model_output(synthetic_runs, tmp_path):
    """A run with before_after.json (written by rlhfkit quickstart) gets a first section with each judge's win rate
    and the example completions; runs without one get no such section."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(synthetic_runs[0], run)
    data = {
        "baseline": "the SFT model",
        "prompts": 256,
        "win_rates": [
            {
                "judge": "task:sort",
                "win_rate": 0.6,
                "ci_low": 0.55,
                "ci_high": 0.65,
                "wins": 40,
                "ties": 200,
                "losses": 16,
            }
        ],  # fmt: skip
        "examples": [{"prompt": "sort 31=", "before": "31<b>", "after": "13", "verdict": "after wins"}],
    }
    (run / "before_after.json").write_text(json.dumps(data))
    html = build_report([run], tmp_path / "out").read_text()
    assert html.index("Before and after") < html.index("Crucial values")
    assert "<b>60.0%</b> win rate by task:sort (40 wins, 200 ties, 16 losses; 95% interval 55.0% to 65.0%)" in html
    assert "31&lt;b&gt;" in html and "31<b>" not in html  # model output is escaped
    assert "Before and after" not in build_report([synthetic_runs[0]], tmp_path / "plain").read_text()


def test_each_finding_gets_evidence_charts_with_its_threshold(synthetic_runs, tmp_path, monkeypatch):
    """A finding's row carries a small chart of each metric it names, around its step, with the threshold it was held
    against (health.jsonl's "thresholds"; findings written before they carried one get the chart without it)."""
    from rlhfkit.report import charts

    ppo, _ = synthetic_runs
    run = tmp_path / "run"
    run.mkdir()
    for name in ("metrics.jsonl", "run_config.json"):
        (run / name).write_bytes((ppo / name).read_bytes())
    finding = {**fakeruns.PPO_FINDINGS[0], "thresholds": {"val/ratio": 2.0}}
    (run / "health.jsonl").write_text(json.dumps(finding) + "\n" + json.dumps(fakeruns.PPO_FINDINGS[1]) + "\n")
    drawn = []
    original = charts.evidence_chart

    def spy(name, points, step, threshold, severity):
        drawn.append((name, [s for s, _ in points], step, threshold, severity))
        return original(name, points, step, threshold, severity)

    monkeypatch.setattr(charts, "evidence_chart", spy)
    html = build_report([run], tmp_path / "out").read_text(encoding="utf-8")
    steps = list(range(5, 26))  # 15 observations before step 20, 5 after
    assert drawn[0] == ("val/ratio", steps, 20, 2.0, "warning")
    assert drawn[1][0] == "loss/value_avg" and drawn[1][2:] == (40, None, "critical")
    health = html[html.index('id="health"') :]
    assert 'alt="val/ratio around step 20"' in health and 'alt="loss/value_avg around step 40"' in health
