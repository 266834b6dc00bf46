"""`rlhfkit report` on any run `rlhfkit doctor` reads (rundata.load_run -> health/sources.py read_source): a TRL
output_dir's TensorBoard logs, a trainer_state.json, the real third-party runs in ../shared/wild-runs/ (TRL
trainer states and log_history lists, a verl console log), and one of them beside an rlhfkit run directory. Each
gets the same charts and health section as a run directory, its findings being the doctor's; what is not a run
is a one-line error (exit status 2)."""

import json
import math
import re
from pathlib import Path

import pytest

from rlhfkit.errors import ReportError
from rlhfkit.health.doctor import doctor
from rlhfkit.report import build_report, cmd_report, load_run, rundata
from rlhfkit.report.series import metric_names
from tests.health.test_sources import write_tensorboard
from tests.report.conftest import ROOT

# Third-party runs, read where they lie (they are not copied into the repository); see their README.
WILD_RUNS = ROOT.parent / "shared" / "wild-runs"
WILD_FILES = sorted([*WILD_RUNS.glob("trl/*.json"), *WILD_RUNS.glob("verl/*.log")])
# Two of them in the fast loop (a TRL checkpoint's trainer_state.json logged at every step; verl's console log); the rest,
# 1-3 s of chart drawing each, with the slow tests.
FAST_WILD = ("IMJONEZZ__UnslothGRPO__llama3.1-8b-gsm8k-ckpt250", "eric-haibin-lin__verl-data__gemma-2-2b-it-ppo")
SLOW = [pytest.mark.slow]
WILD_PARAMS = [
    pytest.param(path, id=f"{path.parent.name}/{path.stem}", marks=[] if path.stem.startswith(FAST_WILD) else SLOW)
    for path in WILD_FILES
]
NO_WILD_RUNS = f"no third-party runs in {WILD_RUNS} (the shared data beside the repository is not there)"


def charted(html: str) -> list[str]:
    """The metrics the page has a chart (an <img> in a figure) for, in page order."""
    return re.findall(r'data-metric="([^"]+)"><img', html)


def listed_findings(html: str) -> list[tuple[int, str]]:
    """(step, rule) of each row of the health section's findings table, in table order."""
    health = html[html.index('id="health"') : html.index('id="samples"')]
    row = r'<tr><td class="num">(\d+)</td>(?:<td>[^<]*</td>)?<td><span class="badge"[^>]*>[^<]*</span></td>'
    return [(int(step), rule) for step, rule in re.findall(row + r"<td><code>([^<]+)</code>", health)]


def doctors_findings(path) -> list[tuple[int, str]]:
    """`rlhfkit doctor`'s findings on the same input, in the table's order (by step, stable)."""
    findings = sorted(doctor(path).findings, key=lambda f: f.step)
    return [(f.step, f.rule) for f in findings]


def assert_same_charts_and_findings(run, html: str) -> None:
    """Every logged metric of `run` has its chart, and the findings table lists exactly the doctor's findings."""
    loaded = load_run(run)
    assert loaded.metrics, f"{run}: no metric rows read"
    assert set(charted(html)) == set(metric_names(loaded)) and len(charted(html)) == len(metric_names(loaded))
    assert listed_findings(html) == doctors_findings(run)
    assert ("The health checks ran and found nothing" in html) == (not loaded.findings)


# ------------------------------------------------------------------------------------------------ TensorBoard


def trl_logs(step: int) -> dict[str, float]:
    """A TRL GRPO run as transformers sends it to TensorBoard, logged every 5 steps: the entropy collapses at step
    100, so the doctor has something to find."""
    return {
        "train/reward": step / 200,
        "train/kl": 0.001 * step,
        "train/entropy": 0.3 if step < 100 else 0.005,
        "train/completions/clipped_ratio": 0.1,
        "train/rewards/format_reward/mean": 0.5,
    }


@pytest.fixture(scope="module")
def trl_tensorboard_run(tmp_path_factory):
    """A TRL output_dir holding TensorBoard events under runs/<name>/, as TRL leaves it."""
    out = tmp_path_factory.mktemp("tensorboard") / "grpo-trl-out"
    write_tensorboard(out / "runs" / "Nov25_23-06-20_host", {step: trl_logs(step) for step in range(5, 205, 5)})
    return out


def test_a_trl_tensorboard_run_reads_as_its_rows_with_the_doctors_findings(trl_tensorboard_run):
    run = load_run(trl_tensorboard_run)
    assert run.name == "grpo-trl-out" and run.config == {} and run.samples == []
    assert [row["step"] for row in run.metrics] == list(range(5, 205, 5))
    assert set(metric_names(run)) == {
        "reward",
        "kl",
        "entropy",
        "completions/clipped_ratio",
        "rewards/format_reward/mean",
    }
    assert [(f["step"], f["rule"]) for f in run.findings] == [(f.step, f.rule) for f in doctor(run.path).findings]
    assert ("entropy_collapse", "critical") in {(f["rule"], f["severity"]) for f in run.findings}
    assert any("TensorBoard events in" in line for line in run.origin) and run.notes == []


def test_a_trl_tensorboard_run_gets_the_charts_and_findings_of_a_run_directory(trl_tensorboard_run, tmp_path):
    html = build_report([trl_tensorboard_run], tmp_path / "out").read_text(encoding="utf-8")
    assert "<title>rlhfkit report: grpo-trl-out</title>" in html
    assert_same_charts_and_findings(trl_tensorboard_run, html)
    pngs = {p.name for p in (tmp_path / "out").glob("*.png")}
    assert {"completions-clipped_ratio.png", "rewards-format_reward-mean.png", "health-timeline.png"} <= pngs
    assert "Where the numbers come from" in html and "replayed" in html
    assert "Problems reading" not in html  # where the numbers came from is not a problem


def test_a_run_directory_and_a_trl_run_in_one_report(synthetic_runs, trl_tensorboard_run, tmp_path):
    _, grpo = synthetic_runs  # an rlhfkit GRPO run: the same metric names, its own health checks (not run)
    html = build_report([grpo, trl_tensorboard_run], tmp_path / "out").read_text(encoding="utf-8")
    assert "rlhfkit report: 2 runs" in html
    assert set(charted(html)) == set(metric_names(load_run(grpo))) | set(metric_names(load_run(trl_tensorboard_run)))
    health = html[html.index('id="health"') : html.index('id="samples"')]
    assert "<td>grpo-trl-out</td>" in health and "<td>grpo-synthetic</td>" not in health
    summary = html[html.index('id="summary"') : html.index('id="charts"')]
    assert "not checked" in summary and "1 critical" in summary
    samples = html[html.index('id="samples"') : html.index('id="config"')]
    assert "grpo-s0-1" in samples  # the run directory's samples are still there


def test_run_directories_are_read_as_before(synthetic_runs, tmp_path):
    """A run directory keeps its own name, config, samples and health.jsonl; the page says nothing about sources."""
    run = load_run(synthetic_runs[0])
    assert run.origin == [] and run.config["run_name"] == "ppo-synthetic" and run.samples
    html = build_report([synthetic_runs[0]], tmp_path / "out").read_text(encoding="utf-8")
    assert "Where the numbers come from" not in html and "Problems reading the run directories" in html


# ------------------------------------------------------------------------------------------------ trainer_state.json


def trainer_state(log_history: list[dict]) -> dict:
    return {"global_step": 30, "logging_steps": 10, "max_steps": 30, "log_history": log_history}


def made_up_log_history() -> list[dict]:
    """TRL's log_history: training rows every 10 steps (reward NaN at step 20), an eval row, the summary row."""
    rows = []
    for step in (10, 20, 30):
        rows.append(
            {"step": step, "epoch": step / 100, "loss": 0.01, "grad_norm": 0.2, "learning_rate": 1e-5,
             "reward": math.nan if step == 20 else step / 100, "reward_std": 0.3, "kl": 0.001 * step,
             "completions/mean_length": 100.0, "completions/clipped_ratio": 0.05, "completion_length": None}
        )  # fmt: skip
    rows.insert(2, {"step": 20, "epoch": 0.2, "eval_loss": 0.4, "eval_reward": 0.35, "eval_runtime": 3.0})
    rows.append({"step": 30, "epoch": 0.3, "train_runtime": 120.0, "train_loss": 0.01, "total_flos": 0.0,
                 "train_samples_per_second": 4.0, "train_steps_per_second": 0.25})  # fmt: skip
    return rows


def write_trainer_state(checkpoint: Path) -> Path:
    checkpoint.mkdir(parents=True)
    path = checkpoint / "trainer_state.json"
    path.write_text(json.dumps(trainer_state(made_up_log_history()), indent=2))  # NaN as JSON's NaN, as Python writes
    return path


def test_a_trainer_state_json_gets_charts_nan_marks_and_the_doctors_findings(tmp_path):
    path = write_trainer_state(tmp_path / "grpo-out" / "checkpoint-30")
    run = load_run(path)
    assert run.name == "grpo-out/checkpoint-30"  # "trainer_state" says nothing: named after its checkpoint
    assert [row["step"] for row in run.metrics if "reward" in row] == [10, 20, 30]
    assert math.isnan(next(row["reward"] for row in run.metrics if row["step"] == 20))
    html = build_report([path], tmp_path / "out").read_text(encoding="utf-8")
    assert "<title>rlhfkit report: grpo-out/checkpoint-30</title>" in html
    assert_same_charts_and_findings(path, html)
    reward = html[html.index('data-metric="reward"><img') :]
    assert "1 NaN/inf values" in reward[: reward.index("</figure>")]
    assert any("eval" in name and "reward" in name for name in charted(html))  # the eval row is charted
    assert not {"train_runtime", "train_loss", "total_flos"} & set(charted(html))  # the summary row is not a curve
    # The checkpoint directory and the output_dir holding it read the same rows (repr: NaN != NaN).
    assert repr(load_run(path.parent).metrics) == repr(run.metrics)
    output_dir = load_run(tmp_path / "grpo-out")
    assert repr(output_dir.metrics) == repr(run.metrics) and output_dir.name == "grpo-out"
    assert any("checkpoint-30" in line for line in output_dir.origin)  # the page says which checkpoint was read


def test_a_trainer_state_and_a_run_directory_in_one_report(synthetic_runs, tmp_path):
    path = write_trainer_state(tmp_path / "grpo-out" / "checkpoint-30")
    html = build_report([synthetic_runs[1], path], tmp_path / "out").read_text(encoding="utf-8")
    assert "rlhfkit report: 2 runs" in html and "grpo-out/checkpoint-30" in html
    assert {"reward", "kl", "eval/task_success"} <= set(charted(html))


# ------------------------------------------------------------------------------------------------ W&B CSV export


def test_a_wandb_history_csv_export_gets_charts_and_the_doctors_findings(tmp_path):
    """W&B's history exported as CSV (W&B's _step beside transformers' train/global_step, logged every 10 steps)."""
    names = list(trl_logs(10))
    lines = [",".join(["_step", "train/global_step", *names])]
    for i, step in enumerate(range(10, 410, 10)):
        values = [("NaN" if name == "train/kl" and step == 200 else str(v)) for name, v in trl_logs(step).items()]
        lines.append(",".join([str(i), str(step), *values]))
    path = tmp_path / "wandb-grpo-history.csv"
    path.write_text("\n".join(lines) + "\n")
    html = build_report([path], tmp_path / "out").read_text(encoding="utf-8")
    assert "<title>rlhfkit report: wandb-grpo-history</title>" in html
    assert_same_charts_and_findings(path, html)
    assert [row["step"] for row in load_run(path).metrics][:2] == [10, 20]  # transformers' step, not W&B's _step
    kl = html[html.index('data-metric="kl"><img') :]
    assert "1 NaN/inf values" in kl[: kl.index("</figure>")]


# ------------------------------------------------------------------------------------------------ real runs


@pytest.mark.skipif(not WILD_FILES, reason=NO_WILD_RUNS)
@pytest.mark.parametrize("path", WILD_PARAMS)
def test_a_real_run_gets_its_charts_and_the_doctors_findings(path, tmp_path):
    report = build_report([path], tmp_path / "out")
    html = report.read_text(encoding="utf-8")
    assert f"<title>rlhfkit report: {path.stem}</title>" in html
    assert_same_charts_and_findings(path, html)
    assert len(list(report.parent.glob("*.png"))) >= len(charted(html))


@pytest.mark.skipif(not WILD_FILES, reason=NO_WILD_RUNS)
def test_a_real_trl_run_beside_a_run_directory(synthetic_runs, tmp_path):
    trl = next(p for p in WILD_FILES if p.parent.name == "trl")
    html = build_report([synthetic_runs[1], trl], tmp_path / "out").read_text(encoding="utf-8")
    assert {"reward", "kl"} <= set(charted(html)) and trl.stem in html


# ------------------------------------------------------------------------------------------------ errors, CLI


@pytest.mark.parametrize("case", ["text-file", "empty-directory"])
def test_what_is_not_a_run_is_a_one_line_error(case, tmp_path, capsys):
    bad = tmp_path / ("notes.txt" if case == "text-file" else "empty")
    bad.write_text("not a run\n") if case == "text-file" else bad.mkdir()
    status = cmd_report([str(bad), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("rlhfkit report: error:") and str(bad) in err
    assert not (tmp_path / "out" / "report.html").exists()


def test_read_source_errors_become_one_line_report_errors(monkeypatch):
    def fail(path, revision=None):
        raise ValueError(f"W&B could not read {path}:\nTraceback (most recent call last):\n  boom")

    monkeypatch.setattr(rundata, "read_source", fail)
    with pytest.raises(ReportError) as error:
        load_run("some/run.wandb")
    assert str(error.value) == "W&B could not read some/run.wandb: Traceback (most recent call last): boom"


def test_a_hub_repo_id_is_read_by_read_source_at_the_revision(monkeypatch):
    """Hub ids are read_source's business: load_run passes the id and the revision on and names the run after them."""
    asked = []

    def fake(path, revision=None):
        asked.append((path, revision))
        return rundata.Source([{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.6}], f"Hub repo {path}")

    monkeypatch.setattr(rundata, "read_source", fake)
    run = load_run("someone/grpo-run", revision="v2")
    assert asked == [("someone/grpo-run", "v2")]
    assert run.name == "someone/grpo-run@v2" and [r["reward"] for r in run.metrics] == [0.5, 0.6]
    assert load_run("someone/grpo-run").name == "someone/grpo-run" and asked[-1] == ("someone/grpo-run", None)


def test_a_hub_repo_at_a_revision_beside_a_local_trainer_state(hub, tmp_path, capsys):
    """`rlhfkit report ORG/NAME LOCAL --revision R`: the revision is the Hub run's; the local run is read as it is."""
    from tests.hub_cache import REVISION, cache_model

    newer = "fedcba9876543210fedcba9876543210fedcba98"
    for revision, history in ((REVISION, made_up_log_history()[:2]), (newer, made_up_log_history())):
        saved = tmp_path / f"saved-{revision[:6]}"
        saved.mkdir()
        (saved / "trainer_state.json").write_text(json.dumps(trainer_state(history)))
        cache_model(hub, "me/grpo", saved, revision)  # the last one is "main"
    assert [row["step"] for row in load_run("me/grpo").metrics] == [10, 20, 30]
    run = load_run("me/grpo", revision=REVISION)
    assert run.name == f"me/grpo@{REVISION}" and [row["step"] for row in run.metrics] == [10, 20]
    assert any(f"Hub model repo me/grpo (revision {REVISION}" in line for line in run.origin)
    local = write_trainer_state(tmp_path / "local-out" / "checkpoint-30")
    out = tmp_path / "out"
    assert cmd_report(["me/grpo", str(local), "--revision", REVISION, "--out", str(out)]) == 0
    html = (out / "report.html").read_text(encoding="utf-8")
    assert f"<b>me/grpo@{REVISION}</b>" in html and "<b>local-out/checkpoint-30</b>" in html
    assert "reward" in charted(html)
    capsys.readouterr()
    assert cmd_report([str(local), "--revision", REVISION, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--revision" in err and "local path" in err
    assert cmd_report(["me/not-cached", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "me/not-cached" in err and "HF_HUB_OFFLINE" in err


def test_help_names_the_inputs(capsys):
    with pytest.raises(SystemExit):
        cmd_report(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for form in ("run directory", "trainer_state.json", "TensorBoard", "W&B", "--revision"):
        assert form in text, form
