"""One writer per run directory: a second run on a directory another process writes exits 2 naming that process; a
killed run's lock never blocks the next; a run holds its lock from its trainer's construction to its end."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from rlhfkit.cli import main
from rlhfkit.tracking.rundir import LOCK_FILE, locked_by
from rlhfkit.trainers.build import build_ppo_trainer
from tests.helpers import asset_flags
from tests.trainers.test_ppo import small_config

HOLDER = textwrap.dedent(
    """
    import sys, time
    from rlhfkit.tracking.rundir import RunLock
    lock, holder = RunLock.acquire(sys.argv[1], command="rlhfkit ppo --output_dir first-run")
    print("locked" if lock is not None else f"refused {holder['pid']}", flush=True)
    if lock is not None:
        time.sleep(600)
    """
)


def hold_lock(output_dir) -> subprocess.Popen:
    """A process holding output_dir's lock, as a running run does (the lock function alone: starts in a moment)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(output_dir)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def try_lock(output_dir) -> str:
    """What another process gets when it asks for output_dir's lock: 'locked', or 'refused <holder's pid>'."""
    done = subprocess.run(
        [sys.executable, "-c", HOLDER.replace("time.sleep(600)", "pass"), str(output_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout.strip()


def cli_flags(assets, output_dir) -> list[str]:
    return [
        *asset_flags(assets), "--output_dir", str(output_dir), "--report_to", "none", "--total_episodes", "16",
        "--per_device_train_batch_size", "8", "--local_rollout_forward_batch_size", "8", "--response_length", "4",
        "--num_ppo_epochs", "1", "--num_sample_generations", "0",
    ]  # fmt: skip


@pytest.fixture
def holder(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')  # the first run has logged a row
    proc = hold_lock(out)
    yield out, proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize(
    "extra",
    [[], ["--overwrite_output_dir"], ["--resume_from_checkpoint", "latest"]],
    ids=["fresh", "overwrite", "resume"],
)
def test_a_second_run_on_a_directory_being_written_exits_2_naming_the_first(tiny_assets, holder, extra, capsys):
    out, proc = holder
    assert main(["ppo", *cli_flags(tiny_assets, out), *extra]) == 2
    err = capsys.readouterr().err
    assert f"is being written by another run: process {proc.pid}" in err
    assert "command: rlhfkit ppo --output_dir first-run" in err and "choose another --output_dir" in err
    assert "already holds a run" not in err  # the live run is the reason, not the files it wrote
    assert (out / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n'  # nothing of the first run touched
    assert proc.poll() is None and locked_by(out)["pid"] == proc.pid


def test_a_killed_runs_lock_does_not_block_the_next_run_which_holds_it_until_its_end(tiny_assets, tmp_path):
    args = small_config(tiny_assets, tmp_path, total_episodes=16, num_sample_generations=0)
    proc = hold_lock(args.output_dir)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lock_file = os.path.join(args.output_dir, LOCK_FILE)
    with open(lock_file) as f:
        assert json.load(f)["pid"] == proc.pid  # the dead run's lock file is still there
    trainer = build_ppo_trainer(args)  # proceeds
    assert try_lock(args.output_dir) == f"refused {os.getpid()}"  # held from the trainer's construction...
    trainer.train()
    assert not os.path.exists(lock_file) and locked_by(args.output_dir) is None  # ... to the end of training
    with open(os.path.join(args.output_dir, "metrics.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == [1, 1]  # the update's row, then train()'s summary row

    # Trainers built one after another in one process: the next run on the directory locks it again...
    again = build_ppo_trainer(small_config(tiny_assets, tmp_path, total_episodes=16, overwrite_output_dir=True))
    assert try_lock(args.output_dir) == f"refused {os.getpid()}"
    # ... a trainer rebuilt while an earlier one of this process never ended supersedes it (a notebook's retry) ...
    rebuilt = build_ppo_trainer(small_config(tiny_assets, tmp_path, total_episodes=16, overwrite_output_dir=True))
    assert not again.run.lock.held and rebuilt.run.lock.held
    assert try_lock(args.output_dir) == f"refused {os.getpid()}"
    # ... and the trainer's end() releases it without training.
    rebuilt.end()
    assert try_lock(args.output_dir) == "locked"
