"""rlhfkit's health checks on runs of TRL's own GRPOTrainer (TRL 1.16, a test-only dependency): live, through
HealthCallback inside TRL's trainer, and afterwards with `rlhfkit doctor` on what TRL logged to TensorBoard, W&B
(offline) and Trackio. A healthy run gives no finding anywhere; a learning rate far too high gives the same findings
live and in every tracker's record."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.cli import main
from rlhfkit.health import CRITICAL, doctor
from rlhfkit.health.sources import read_trackio
from rlhfkit.tasks import builtin_assets

pytestmark = pytest.mark.slow  # TRL scripts trained in subprocesses

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8  # trl_grpo_run.STEPS


def trl_grpo(out: Path, run_name: str, learning_rate: float, mode: str = "warn") -> dict:
    """A TRL GRPO run in its own process (tests/health/trl_grpo_run.py); its callback's findings and steps."""
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    script = ROOT / "tests" / "health" / "trl_grpo_run.py"
    command = [sys.executable, str(script), str(out), run_name, str(learning_rate), mode]
    result = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "live.json").read_text())


def triples(findings) -> list[tuple]:
    return [
        (f["step"], f["rule"], f["severity"]) if isinstance(f, dict) else (f.step, f.rule, f.severity)
        for f in findings
    ]


def wandb_run(out: Path) -> Path:
    (run,) = out.glob("wandb/offline-run-*")
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    builtin_assets()  # built once here, not in two processes at a time
    root = tmp_path_factory.mktemp("trl")
    return {name: (root / name, trl_grpo(root / name, name, lr)) for name, lr in (("healthy", 1e-5), ("sick", 0.5))}


def test_a_healthy_trl_run_has_no_finding_live_or_in_any_tracker(runs):
    out, live = runs["healthy"]
    assert live == {"steps": STEPS, "findings": []}
    assert doctor(out / "trl").findings == []  # TensorBoard event files under output_dir/runs/
    assert doctor(wandb_run(out)).findings == []
    assert doctor(None, source=read_trackio("trl-health", "healthy")).findings == []


def test_an_injected_failure_is_found_live_and_by_the_doctor_in_every_tracker(runs):
    out, live = runs["sick"]
    found = triples(live["findings"])
    assert any(severity == CRITICAL for _, _, severity in found), found
    tensorboard = doctor(out / "trl")
    assert "TensorBoard" in tensorboard.source.description and triples(tensorboard.findings) == found
    wandb = doctor(wandb_run(out))
    assert "W&B" in wandb.source.description and triples(wandb.findings) == found
    assert triples(doctor(None, source=read_trackio("trl-health", "sick")).findings) == found
    # The callback kept its findings where rlhfkit doctor and report read them.
    kept = [json.loads(line) for line in (out / "trl" / "health.jsonl").read_text().splitlines()]
    assert triples(kept) == found


def test_the_doctor_command_reads_a_trl_run_and_exits_1_on_a_critical_finding(runs, capsys):
    out, _ = runs["sick"]
    assert main(["doctor", str(out / "trl")]) == 1
    printed = capsys.readouterr().out
    assert "TensorBoard events" in printed and "critical" in printed and "evidence" in printed
    assert main(["doctor", "--trackio", "trl-health", "--run", "healthy"]) == 0


def test_health_callback_stop_ends_trls_training_on_a_critical_finding(tmp_path):
    live = trl_grpo(tmp_path / "stopped", "stopped", 0.5, mode="stop")
    critical = next(f for f in live["findings"] if f["severity"] == CRITICAL)
    assert live["steps"] == critical["step"] < STEPS
