"""Fixtures of the report tests: synthetic runs, one real tiny PPO run logged to Trackio, a browser."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import asset_flags
from tests.report import browser, fakeruns

ROOT = Path(__file__).resolve().parents[2]
TRACKED_PROJECT = "report-test"
TRACKED_RUN = "tracked-run"


@pytest.fixture(scope="session")
def synthetic_runs(tmp_path_factory):
    """(PPO run directory, GRPO run directory), see fakeruns.py."""
    tmp = tmp_path_factory.mktemp("synthetic-runs")
    return fakeruns.write_ppo_run(tmp / "ppo"), fakeruns.write_grpo_run(tmp / "grpo")


@pytest.fixture(scope="session")
def tracked_run(tiny_assets, tmp_path_factory):
    """A finished `rlhfkit ppo` run on the tiny task, logged to Trackio in its own TRACKIO_DIR.

    Returns (run directory, TRACKIO_DIR). A subprocess, as a user runs it: trackio reads TRACKIO_DIR once,
    at import, so the store must belong to a fresh process.
    """
    tmp = tmp_path_factory.mktemp("tracked")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRACKIO_DIR=str(tmp / "trackio"), HF_HUB_OFFLINE="1")
    out = tmp / "run"
    cmd = [sys.executable, "-m", "rlhfkit.cli", "ppo", *asset_flags(tiny_assets)]
    cmd += ["--output_dir", str(out), "--run_name", TRACKED_RUN, "--project", TRACKED_PROJECT]
    cmd += ["--report_to", "trackio", "--per_device_train_batch_size", "8", "--num_ppo_epochs", "1"]
    cmd += ["--total_episodes", "32", "--response_length", "8", "--num_sample_generations", "2", "--save_steps", "0"]
    result = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, tmp / "trackio"


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    """One headless Chromium per test module (skips, or fails under RLHFKIT_REQUIRE_BROWSER=1, without it)."""
    browser.require_browser()
    driver = browser.start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()
