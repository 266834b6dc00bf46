"""sources.py: a run's logged rows read back from rlhfkit's metrics.jsonl, TensorBoard event files, a W&B offline run
and a Trackio project, each written here with the tracker's own writer from TRL-style ``train/...`` keys; tracker keys
mapped to the rules' names; which reader a file or directory goes to (trainer_state.json, W&B CSV, verl: their own
tests are test_trainer_state.py, test_wandb_csv.py, test_hub.py); other frameworks' names mapped (frameworks.py);
runs without RL metrics; and the errors for what holds no run."""

import json
import math
import os
from pathlib import Path

import pytest

from rlhfkit.health import cmd_doctor, sources
from rlhfkit.health.sources import Source, read_source, read_trackio, rows_by_step, rule_name

STEPS = (1, 2, 3, 4)


def trl_logs(step: int) -> dict[str, float]:
    """What transformers sends a tracker for one GRPO step: TRL's names under train/ (each value distinct per step)."""
    return {
        "train/kl": 0.001 * step,
        "train/entropy": 0.3 + 0.01 * step,
        "train/reward": step / 10,
        "train/completions/clipped_ratio": 0.25 * (step - 1),
    }


def expected_row(step: int) -> dict[str, float]:
    """trl_logs(step) as the rules read it."""
    kl, entropy, reward, clipped = trl_logs(step).values()
    return {"step": step, "kl": kl, "entropy": entropy, "reward": reward, "completions/clipped_ratio": clipped}


def write_tensorboard(log_dir: Path, logs_by_step: dict[int, dict[str, float]]) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(log_dir))
    for step, logs in logs_by_step.items():
        for tag, value in logs.items():
            writer.add_scalar(tag, value, step)
    writer.close()
    return log_dir


@pytest.fixture
def trackio_dir(tmp_path, monkeypatch):
    """Trackio's local store in tmp_path. trackio reads $TRACKIO_DIR once, at import, into module constants: those
    are pointed here (and the variable, for any process started meanwhile)."""
    import trackio.sqlite_storage
    import trackio.utils

    store = tmp_path / "trackio"
    monkeypatch.setenv("TRACKIO_DIR", str(store))
    monkeypatch.setattr(trackio.utils, "TRACKIO_DIR", store)
    monkeypatch.setattr(trackio.sqlite_storage, "TRACKIO_DIR", store)
    return store


def log_trackio(project: str, run: str, steps=STEPS) -> None:
    import trackio

    trackio.init(project=project, name=run)
    for step in steps:
        trackio.log({**trl_logs(step), "train/global_step": step}, step=step)
    trackio.finish()


@pytest.fixture(scope="module")
def wandb_source(tmp_path_factory):
    """One W&B offline run (W&B starts a service process: written once for the module), logged as transformers'
    WandbCallback does (train/global_step with each row, W&B's own _step counting from 0), with train/loss NaN at
    step 2; and what read_source makes of its directory."""
    import wandb

    root = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}.items():
            mp.setenv(name, value)
        for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            mp.setenv(name, str(root / name.lower()))
        settings = wandb.Settings(console="off", x_disable_stats=True, save_code=False, disable_git=True)
        run = wandb.init(mode="offline", dir=str(root), project="rlhfkit-tests", id="sources", settings=settings)
        for step in STEPS:
            wandb.log({**trl_logs(step), "train/loss": math.nan if step == 2 else 0.1, "train/global_step": step})
        run.finish()
        wandb.teardown()
    return root, read_source(root)


# ------------------------------------------------------------------------------------------------ keys and rows


def test_rule_name_takes_train_off_and_drops_the_step_and_tracker_bookkeeping():
    assert rule_name("train/kl") == "kl"
    assert rule_name("train/completions/clipped_ratio") == "completions/clipped_ratio"
    assert rule_name("train/frac_reward_zero_std") == "frac_reward_zero_std"
    assert rule_name("eval/task_success") == "eval/task_success"  # evaluation keys stay as they are
    assert rule_name("kl") == "kl" and rule_name("val/ratio") == "val/ratio"  # rlhfkit's own names pass through
    for key in ("train/global_step", "global_step", "_step", "step", "_runtime", "_timestamp"):
        assert rule_name(key) is None, key


def test_rows_by_step_merges_per_step_in_step_order_numbers_only():
    items = [
        (3, {"train/kl": 0.3, "_step": 2}),
        (1, {"train/kl": 0.1, "train/global_step": 1}),
        (3, {"train/reward": 0.7, "eval/task_success": 0.5}),
        (2, {"train/flag": True, "train/name": "x", "_runtime": 1.5}),  # nothing numeric left: no row
        (1.0, {"train/entropy": float("nan")}),  # a float step joins step 1; NaN is a number and kept
    ]
    rows = rows_by_step(items)
    assert [row["step"] for row in rows] == [1, 3]
    assert rows[0]["kl"] == 0.1 and math.isnan(rows[0]["entropy"]) and set(rows[0]) == {"step", "kl", "entropy"}
    assert rows[1] == {"step": 3, "kl": 0.3, "reward": 0.7, "eval/task_success": 0.5}


# ------------------------------------------------------------------------------------------------ TensorBoard


def test_tensorboard_events_of_a_trl_output_dir(tmp_path):
    logs = {step: trl_logs(step) for step in STEPS}
    logs[2] = {**logs[2], "train/loss": math.nan}
    logs[4] = {**logs[4], "eval/reward": 0.9}
    run = write_tensorboard(tmp_path / "out" / "runs" / "Nov25_23-06-20_host", logs)
    source = read_source(tmp_path / "out")  # the output_dir, as TRL leaves it: events under runs/<name>/
    assert source.description == f"TensorBoard events in {run}" and source.skipped_lines == []
    assert [row["step"] for row in source.rows] == list(STEPS)
    for row, step in zip(source.rows, STEPS):
        extra = {"loss"} if step == 2 else {"eval/reward"} if step == 4 else set()
        assert set(row) == set(expected_row(step)) | extra
        assert {k: row[k] for k in expected_row(step)} == pytest.approx(expected_row(step), rel=1e-6)  # float32
    assert math.isnan(source.rows[1]["loss"]) and source.rows[3]["eval/reward"] == pytest.approx(0.9)
    assert repr(read_source(run)) == repr(source)  # one run's own directory reads the same (repr: NaN != NaN)


def test_tensorboard_with_several_runs_reads_the_newest(tmp_path):
    old = write_tensorboard(tmp_path / "runs" / "old", {1: {"train/kl": 0.5}})
    new = write_tensorboard(tmp_path / "runs" / "new", {7: {"train/kl": 0.25}})
    os.utime(old, (2_000_000_000, 2_000_000_000))  # "old" is the newer one now
    os.utime(new, (1_000_000_000, 1_000_000_000))
    source = read_source(tmp_path)
    assert source.description == f"TensorBoard events in {old}" and source.rows == [{"step": 1, "kl": 0.5}]


def test_metrics_jsonl_is_read_as_logged_and_wins_over_event_files(tmp_path):
    write_tensorboard(tmp_path / "runs" / "x", {1: {"train/kl": 9.0}})
    rows = [{"step": 1, "kl": 0.001, "reward": 0.5}, {"step": 2, "kl": 0.002, "eval/task_success": 0.4}]
    text = "".join(json.dumps(row) + "\n" for row in rows) + '{"step": 3, "kl"'  # a crash tore the last line
    (tmp_path / "metrics.jsonl").write_text(text)
    source = read_source(tmp_path)
    assert source[:4] == (rows, "metrics.jsonl", [3], "metrics.jsonl") and source.mapped == {} and source.notes == []
    assert read_source(tmp_path / "metrics.jsonl") == source  # the file itself reads as its directory


# ------------------------------------------------------------------------------------------------ W&B


def test_wandb_offline_run_rows_take_trls_global_step_and_the_rules_names(wandb_source):
    root, source = wandb_source
    (wandb_file,) = root.glob("wandb/offline-run-*/run-sources.wandb")
    assert source.description == f"W&B run {wandb_file}"
    assert [row["step"] for row in source.rows] == list(STEPS)  # train/global_step (1..4), not W&B's _step (0..3)
    for row, step in zip(source.rows, STEPS):
        assert {k: v for k, v in row.items() if k != "loss"} == pytest.approx(expected_row(step))
    assert [row.get("loss") for row in source.rows if row["step"] != 2] == [0.1, 0.1, 0.1]


def test_wandb_offline_run_keeps_a_nan(wandb_source):
    # W&B's JSON writes NaN as the string "NaN": it must reach the rules as a float NaN (nonfinite_metric).
    _, source = wandb_source
    row = next(row for row in source.rows if row["step"] == 2)
    assert math.isnan(row["loss"])


def test_read_source_finds_the_newest_wandb_run_from_each_level(tmp_path, monkeypatch):
    read = []
    monkeypatch.setattr(sources, "read_wandb", lambda path: read.append(path) or sources.Source([], "W&B"))
    runs = []
    for name, when in (("offline-run-20250101_000000-a", 2_000_000_000), ("offline-run-20250102_000000-b", 1)):
        run = tmp_path / "out" / "wandb" / name
        run.mkdir(parents=True)
        (run / f"run-{name[-1]}.wandb").write_bytes(b"")
        os.utime(run / f"run-{name[-1]}.wandb", (when, when))
        runs.append(run)
    newest = runs[0] / "run-a.wandb"
    for path in (tmp_path / "out", tmp_path / "out" / "wandb", newest):
        read_source(path)
    read_source(runs[1])  # one run's directory: its own file, however old
    assert read == [newest, newest, newest, runs[1] / "run-b.wandb"]


def test_an_unreadable_wandb_file_is_a_value_error_naming_it(tmp_path):
    bad = tmp_path / "run-x.wandb"
    bad.write_text("not a W&B transaction log\n")
    with pytest.raises(ValueError, match="W&B could not read") as error:
        read_source(tmp_path)
    assert str(bad) in str(error.value)


# ------------------------------------------------------------------------------------------------ Trackio


def test_trackio_run_rows(trackio_dir):
    log_trackio("rlhfkit-sources", "grpo")
    assert list(trackio_dir.glob("*.db"))  # the store is the test's own
    source = read_trackio("rlhfkit-sources", None)  # the project's only run
    assert source.description == "Trackio run 'grpo' of project 'rlhfkit-sources'" and source.skipped_lines == []
    assert source.rows == [pytest.approx(expected_row(step)) for step in STEPS]
    assert set(source.rows[0]) == set(expected_row(1))  # no timestamp, no train/global_step
    assert read_trackio("rlhfkit-sources", "grpo").rows == source.rows


def test_trackio_needs_the_run_name_when_there_are_several_and_a_run_with_logs(trackio_dir):
    with pytest.raises(ValueError, match=r"Trackio project 'nothing' has 0 runs \(none\): pass --run NAME"):
        read_trackio("nothing", None)
    log_trackio("two-runs", "first", steps=(1, 2))
    log_trackio("two-runs", "second", steps=(5,))
    with pytest.raises(ValueError, match=r"'two-runs' has 2 runs \(first, second\): pass --run NAME"):
        read_trackio("two-runs", None)
    assert [row["step"] for row in read_trackio("two-runs", "second").rows] == [5]
    with pytest.raises(ValueError, match=r"no logs for run 'third' \(runs: first, second\)"):
        read_trackio("two-runs", "third")


# ------------------------------------------------------------------------------------------------ no run


def test_a_path_holding_no_run_is_file_not_found_naming_what_was_looked_for(tmp_path):
    (tmp_path / "empty" / "checkpoint-10").mkdir(parents=True)
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError) as error:
        read_source(tmp_path / "empty")
    message = str(error.value)
    assert str(tmp_path / "empty" / "metrics.jsonl") in message
    assert "*.wandb" in message and "events.out.tfevents" in message
    with pytest.raises(FileNotFoundError, match="does not exist") as error:
        read_source(tmp_path / "missing")
    assert str(tmp_path / "missing") in str(error.value)
    with pytest.raises(ValueError, match="is a JSON object without 'log_history'"):
        read_source(tmp_path / "empty" / "config.json")  # read as a trainer_state.json: it is not one
    (tmp_path / "notes.txt").write_text("lr 1e-5, 3 epochs\n")
    with pytest.raises(FileNotFoundError, match="is not a log that rlhfkit doctor reads: pass a run directory"):
        read_source(tmp_path / "notes.txt")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(FileNotFoundError, match=r"\(it is empty\)"):
        read_source(tmp_path / "nothing")
    with pytest.raises(ValueError, match="--revision main is for a Hub repo id"):
        read_source(tmp_path / "empty", revision="main")


# ------------------------------------------------------------------------------------------------ Source, readers


def test_source_keeps_its_first_fields_positional_and_the_new_ones_default():
    source = Source([{"step": 1, "kl": 0.1}], "somewhere", [4])
    assert (
        source.rows == [{"step": 1, "kl": 0.1}] and source.description == "somewhere" and source.skipped_lines == [4]
    )
    assert (source.reader, source.mapped, source.notes, source.framework) == ("", {}, [], None)
    assert Source([], "x").skipped_lines == []


def test_each_reader_names_itself(tmp_path, wandb_source):
    write_tensorboard(tmp_path / "runs" / "x", {1: trl_logs(1)})
    assert read_source(tmp_path).reader == "tensorboard" and wandb_source[1].reader == "wandb"
    (tmp_path / "h.csv").write_text("_step,train/kl\n1,0.1\n")
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [{"kl": 0.1, "step": 1}]}))
    assert read_source(tmp_path / "h.csv").reader == "wandb_csv"
    assert read_source(tmp_path / "trainer_state.json").reader == "trainer_state"


def test_a_file_starting_like_json_is_read_as_a_log_history_whatever_its_name(tmp_path):
    (tmp_path / "step_logs.txt").write_text(json.dumps([{"reward": 0.5, "step": 1}]))
    assert read_source(tmp_path / "step_logs.txt").rows == [{"step": 1, "reward": 0.5}]


def test_a_verl_console_log_goes_to_verls_reader_and_its_names_through_map_names(tmp_path, monkeypatch):
    log = tmp_path / "train.log"
    log.write_text("config: ...\n(main_task pid=1) step:1 - critic/score/mean:0.5 - critic/kl:0.01\n")

    def fake_map_names(rows):
        renamed = [
            {{"critic/score/mean": "reward"}.get(key, key): value for key, value in row.items()} for row in rows
        ]
        return renamed, {"reward": "critic/score/mean"}, "verl"

    monkeypatch.setattr(sources, "map_names", fake_map_names)
    source = read_source(log)
    assert source.reader == "verl_log" and source.description == f"verl console log {log}"
    assert source.rows == [{"step": 1, "reward": 0.5, "critic/kl": 0.01}]
    assert (source.mapped, source.framework) == ({"reward": "critic/score/mean"}, "verl")


def test_rows_without_any_metric_the_rules_read_are_not_an_rl_run(tmp_path):
    sft = {step: {"train/loss": 2.0 / step, "train/learning_rate": 1e-5, "train/grad_norm": 1.0} for step in STEPS}
    run = write_tensorboard(tmp_path / "sft" / "runs" / "x", sft)
    with pytest.raises(ValueError) as error:
        read_source(tmp_path / "sft")
    assert str(error.value) == (
        f"TensorBoard events in {run} holds no RL metrics (keys found: grad_norm, learning_rate, loss), none of what "
        "the health rules read (reward, kl, entropy, completions/clipped_ratio, val/ratio, objective/scores, ...): is "
        "it an SFT or DPO run, or from a framework whose names rlhfkit does not know? Pass the logs of a PPO or GRPO "
        "run."
    )
    (tmp_path / "rlhfkit").mkdir()
    (tmp_path / "rlhfkit" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    assert read_source(tmp_path / "rlhfkit").rows == [{"step": 1, "loss": 0.5}]  # rlhfkit's own rows: as logged


def test_the_real_verl_log_opens_with_its_names_mapped(capsys):
    wild = Path(__file__).resolve().parents[2].parent / "shared" / "wild-runs" / "verl"
    if not wild.is_dir():
        pytest.skip(f"the real verl run is read from ../shared/wild-runs/verl, not found at {wild}")
    (log,) = wild.glob("*.log")
    source = read_source(log)
    assert (source.reader, source.framework, len(source.rows)) == ("verl_log", "verl", 106)
    assert source.mapped["reward"] == "critic/score/mean" and source.mapped["kl"] == "critic/kl"
    assert cmd_doctor([str(log)]) in (0, 1)
    assert "Metrics mapped from the run's names (verl): reward <- critic/score/mean" in capsys.readouterr().out
