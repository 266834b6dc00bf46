"""wandb_csv.py: a W&B history exported as CSV read as the rules' rows: the step column, empty cells, NaN and inf
strings, a chart panel's export; the errors for what is not one; the real TRL runs of ../shared/wild-runs/trl
written as W&B history CSVs read back as their trainer_state.json reads, with a NaN put into them."""

import csv
import math
from pathlib import Path

import pytest

from rlhfkit.health import CRITICAL, cmd_doctor, doctor
from rlhfkit.health.sources import read_source
from rlhfkit.health.wandb_csv import cell_value, column_names
from tests.health.test_trainer_state import WILD_FILES, wild_file


def write_csv(path: Path, header: list[str], records: list[list[object]]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(records)
    return path


def history_csv(path: Path, rows: list[dict]) -> Path:
    """`rows` (the rules' names, with "step") as W&B's history of a TRL run exported with pandas: an unnamed index
    column, W&B's _step from 0, transformers' train/global_step and train/ keys, eval/ keys as they are, empty
    cells where a row lacks a key, floats written with repr (NaN as "nan")."""
    keys = sorted({key for row in rows for key in row} - {"step"})
    names = [key if key.startswith("eval/") else f"train/{key}" for key in keys]
    records = [
        [index, index, row["step"], *[repr(row[key]) if key in row else "" for key in keys], 12.5 * index]
        for index, row in enumerate(rows)
    ]
    return write_csv(path, ["", "_step", "train/global_step", *names, "_runtime"], records)


def test_cells():
    assert cell_value("0.25") == 0.25 and cell_value(" 3 ") == 3.0
    assert cell_value("") is None and cell_value("  ") is None and cell_value("True") is None
    assert cell_value("abc") is None
    assert math.isnan(cell_value("NaN")) and math.isnan(cell_value("nan"))
    assert cell_value("inf") == math.inf and cell_value("-Infinity") == -math.inf


def test_a_history_csv_takes_transformers_global_step_and_the_rules_names(tmp_path):
    header = ["", "_step", "train/global_step", "train/reward", "train/kl", "eval/reward", "_runtime", "_timestamp"]
    records = [
        [0, 0, 1, 0.5, 0.01, "", 1.0, 1700000000],
        [1, 1, 2, "", 0.02, "", 2.0, 1700000001],  # empty cell: no reward at step 2
        [2, 2, 2, "", "", 0.7, 2.5, 1700000002],  # an eval row of step 2: merged
        [3, 3, 3, "NaN", "inf", "", 3.0, 1700000003],
    ]
    source = read_source(write_csv(tmp_path / "history.csv", header, records))
    assert source.reader == "wandb_csv" and source.description == f"W&B history CSV {tmp_path / 'history.csv'}"
    assert source.notes == ["steps from the 'train/global_step' column"]
    assert source.rows[:2] == [{"step": 1, "reward": 0.5, "kl": 0.01}, {"step": 2, "kl": 0.02, "eval/reward": 0.7}]
    assert math.isnan(source.rows[2]["reward"]) and source.rows[2]["kl"] == math.inf
    found = [(f.step, f.rule, f.severity) for f in doctor(tmp_path / "history.csv").findings]
    assert (3, "nonfinite_metric", CRITICAL) in found


def test_without_global_step_the_step_is_wandbs_own(tmp_path):
    path = write_csv(tmp_path / "h.csv", ["_step", "reward", "kl"], [[0, 0.1, 0.0], [1, 0.2, 0.01]])
    assert read_source(path).rows == [{"step": 0, "reward": 0.1, "kl": 0.0}, {"step": 1, "reward": 0.2, "kl": 0.01}]
    path = write_csv(tmp_path / "s.csv", ["step", "train/kl", "note"], [[5, 0.1, "ok"], ["", 0.2, "x"]])
    source = read_source(path)
    assert source.rows == [{"step": 5, "kl": 0.1}] and source.notes[1] == "1 row(s) without a step left out"


def test_a_chart_panel_export_of_one_run(tmp_path):
    header = ["Step", "grpo-1 - train/reward", "grpo-1 - train/reward__MIN", "grpo-1 - train/reward__MAX"]
    path = write_csv(tmp_path / "panel.csv", header, [[1, 0.5, 0.4, 0.6], [2, 0.6, 0.5, 0.7]])
    assert read_source(path).rows == [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.6}]
    assert column_names(header, "x") == ["Step", "train/reward", None, None]


def test_a_chart_panel_export_of_several_runs_is_refused(tmp_path, capsys):
    header = ["Step", "a - train/reward", "b - train/reward"]
    path = write_csv(tmp_path / "panel.csv", header, [[1, 0.5, 0.4]])
    assert cmd_doctor([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds the columns of 2 runs (a, b): export one run's history" in err


@pytest.mark.parametrize(
    "header, records, message",
    [
        ([], [], "is empty: pass a W&B history exported as CSV"),
        (["train/reward", "train/kl"], [[0.5, 0.1]], "has no step column (train/global_step, global_step, _step, "
         "step, Step; columns found: train/reward, train/kl)"),
        (["_step", "train/reward"], [["", 0.5]], "has no row with a number in its step column '_step'"),
        (["_step", "train/loss", "train/learning_rate"], [[1, 0.5, 1e-5]], "holds no RL metrics (keys found: "
         "learning_rate, loss)"),
    ],
)  # fmt: skip
def test_what_is_not_a_history_exits_2_with_one_line(header, records, message, tmp_path, capsys):
    path = tmp_path / "history.csv"
    write_csv(path, header, records) if header else path.write_text("")
    assert cmd_doctor([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_a_binary_file_named_csv_exits_2(tmp_path, capsys):
    (tmp_path / "h.csv").write_bytes(b"\xff\xfe\x00\x01")
    assert cmd_doctor([str(tmp_path / "h.csv")]) == 2
    assert "is not a text CSV file" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ real runs


@pytest.mark.parametrize("nth", range(len(WILD_FILES)))
def test_a_real_run_as_a_history_csv_reads_as_its_trainer_state_and_a_nan_is_critical_at_its_step(nth, tmp_path):
    rows = read_source(wild_file(WILD_FILES[nth])).rows
    assert read_source(history_csv(tmp_path / "history.csv", rows)).rows == rows
    step = rows[len(rows) // 2]["step"]
    metrics = sorted(set(rows[len(rows) // 2]) - {"step"})
    metric = metrics[nth % len(metrics)]
    rows[len(rows) // 2][metric] = math.nan
    nonfinite = [
        (f.step, f.severity, list(f.metrics))
        for f in doctor(history_csv(tmp_path / "nan.csv", rows)).findings
        if f.rule == "nonfinite_metric"
    ]
    assert nonfinite == [(step, CRITICAL, [metric])]
