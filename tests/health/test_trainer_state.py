"""trainer_state.py: transformers' trainer_state.json (and its log_history list saved alone) as the rules' rows: eval
rows, the summary row, nulls, resumed runs, NaN literals; which file a checkpoint or an output_dir stands for; the
errors for what is not one; and the real TRL runs of ../shared/wild-runs/trl opened by ``rlhfkit doctor`` as a file,
a checkpoint, an output_dir of two checkpoints, with a NaN put into them."""

import json
import math
import shutil
from pathlib import Path

import pytest

from rlhfkit.health import CRITICAL, cmd_doctor, doctor
from rlhfkit.health.sources import read_source
from rlhfkit.health.trainer_state import find_state_file, load_log_history, log_history_rows, read_trainer_state

ROOT = Path(__file__).resolve().parents[2]
# Real runs other people trained (README there), read in place: third-party files, never copied into the repository.
WILD_TRL = ROOT.parent / "shared" / "wild-runs" / "trl"
WILD_FILES = (
    "IMJONEZZ__UnslothGRPO__llama3.1-8b-gsm8k-ckpt250.json",
    "Rusheel86__Chaos-Economy__grpo-200step-trainer_state.json",
    "Sunshine535__nips-grpo-dynamics__qwen35-rho0.70-seed42-step_logs.json",
    "Sunshine535__nips-grpo-dynamics__qwen35-rho0.70-seed43-step_logs.json",
    "Sunshine535__nips-grpo-dynamics__qwen35-rho1.00-seed42-step_logs.json",
    "abdo-ashraf__Gemma-3-RL-Finetuning__gemma3-1b-ckpt250.json",
    "alexchilton__CAS_NLP_MODULE4_GRPO__wordle-grpo-4090-ckpt400.json",
)
BARE_LISTS = {name for name in WILD_FILES if name.startswith("Sunshine535")}  # log_history saved alone
TRAINING_ROWS = {"IMJONEZZ": 250, "Rusheel86": 40, "Sunshine535": 40, "abdo-ashraf": 25, "alexchilton": 400}


def wild_file(name: str) -> Path:
    """A real run's file in ../shared/wild-runs/trl; the test is skipped where that directory is absent."""
    if not WILD_TRL.is_dir():
        pytest.skip(f"the real TRL runs are read from ../shared/wild-runs/trl, not found at {WILD_TRL}")
    return WILD_TRL / name


def wild_state(name: str) -> dict:
    """The file as a trainer_state.json object (a bare log_history list wrapped as transformers saves it)."""
    state = json.loads(wild_file(name).read_text())
    return {"log_history": state} if isinstance(state, list) else state


def with_nan(state, nth: int) -> tuple[object, int, str]:
    """A copy of `state` (object or bare list) with NaN put into one metric of its middle training row: the `nth`
    of that row's metrics (in sorted order, wrapping). Returns the copy, the step and the metric."""
    state = json.loads(json.dumps(state))
    history = state["log_history"] if isinstance(state, dict) else state
    training = [entry for entry in history if "train_runtime" not in entry]
    entry = training[len(training) // 2]
    metrics = sorted(key for key in entry if key not in ("step", "epoch"))
    metric = metrics[nth % len(metrics)]
    entry[metric] = math.nan
    return state, entry["step"], metric


def write_json(path: Path, value) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))  # NaN written as the bare literal, as Python's json does
    return path


def grpo_entry(step: int, **changes) -> dict:
    return {"reward": 0.5, "kl": 0.01, "entropy": 0.4, "loss": 0.0, "epoch": step / 100, "step": step, **changes}


# ------------------------------------------------------------------------------------------------ rows


def test_training_rows_keep_the_bare_names_and_drop_the_bookkeeping():
    rows, notes = log_history_rows([grpo_entry(1), grpo_entry(2, reward=0.7)], "x")
    assert rows == [
        {"step": 1, "reward": 0.5, "kl": 0.01, "entropy": 0.4, "loss": 0.0},
        {"step": 2, "reward": 0.7, "kl": 0.01, "entropy": 0.4, "loss": 0.0},
    ]
    assert notes == []


def test_eval_rows_are_named_as_the_trackers_name_them_and_merge_with_the_training_row_of_their_step():
    entries = [
        grpo_entry(10),
        {"eval_reward": 0.8, "eval_loss": 0.1, "eval_runtime": 3.5, "epoch": 0.1, "step": 10},
        {"test_reward": 0.75, "step": 10},
        grpo_entry(20),
    ]
    rows, notes = log_history_rows(entries, "x")
    assert [row["step"] for row in rows] == [10, 20] and notes == []
    assert rows[0] == {
        **{"step": 10, "reward": 0.5, "kl": 0.01, "entropy": 0.4, "loss": 0.0},
        **{"eval/reward": 0.8, "eval/loss": 0.1, "eval/runtime": 3.5, "test/reward": 0.75},
    }


def test_the_final_summary_row_is_left_out_and_noted_even_at_the_last_training_step():
    summary = {"train_runtime": 4966.9, "train_samples_per_second": 0.644, "train_loss": 0.027, "step": 2}
    rows, notes = log_history_rows([grpo_entry(1), grpo_entry(2), summary], "x")
    assert [row["step"] for row in rows] == [1, 2] and "train_loss" not in rows[1] and "train_runtime" not in rows[1]
    (note,) = notes
    assert note.startswith("the final summary row at step 2 is not a training row, left out") and "train_loss" in note


def test_a_summary_row_holding_the_last_window_is_that_step_s_training_row():
    # TRL's log() merges the metrics pending since the last logging step into the summary row (3 steps logged every
    # 2): those are step 3's training row; the summary's own keys are left out.
    summary = {**grpo_entry(3), "train_runtime": 12.5, "train_samples_per_second": 2.0, "train_loss": 0.03,
               "total_flos": 0.0, "epoch": 0.5}  # fmt: skip
    rows, notes = log_history_rows([grpo_entry(2), summary], "x")
    assert [row["step"] for row in rows] == [2, 3]
    assert rows[1] == {"step": 3, "reward": 0.5, "kl": 0.01, "entropy": 0.4, "loss": 0.0}
    (note,) = notes
    assert note.startswith("the final summary row at step 3 holds the last logging window's metrics")
    assert "train_loss 0.03" in note and "reward" not in note


def test_nulls_strings_and_booleans_are_left_out_and_noted():
    entries = [grpo_entry(step, completion_length=None, model="x", flag=True) for step in (1, 2)]
    rows, notes = log_history_rows(entries, "x")
    assert set(rows[0]) == {"step", "reward", "kl", "entropy", "loss"}
    assert notes == ["null or non-numeric values left out: completion_length (2 rows), model (2 rows), flag (2 rows)"]


def test_nan_and_infinity_literals_are_kept_as_floats(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text('{"log_history": [{"reward": NaN, "kl": Infinity, "entropy": -Infinity, "step": 3}]}')
    (row,) = read_trainer_state(path).rows
    assert math.isnan(row["reward"]) and row["kl"] == math.inf and row["entropy"] == -math.inf


def test_a_resumed_run_replaces_the_rows_from_the_step_it_went_back_to():
    entries = [grpo_entry(step) for step in range(1, 6)] + [grpo_entry(step, reward=0.9) for step in range(3, 8)]
    rows, notes = log_history_rows(entries, "x")
    assert [row["step"] for row in rows] == list(range(1, 8))
    assert [row["reward"] for row in rows] == [0.5, 0.5, 0.9, 0.9, 0.9, 0.9, 0.9]
    assert notes == [
        "log_history goes back from step 5 to step 3 (a run resumed from an earlier checkpoint): the later rows "
        "replace the 3 logged before from step 3 on"
    ]


def test_a_training_row_logged_again_at_the_same_step_is_a_resume_an_eval_row_is_not():
    entries = [grpo_entry(1), grpo_entry(2), {"eval_reward": 0.6, "step": 2}, grpo_entry(2, reward=0.1)]
    rows, notes = log_history_rows(entries, "x")
    assert rows[-1] == {"step": 2, "reward": 0.1, "kl": 0.01, "entropy": 0.4, "loss": 0.0}  # eval row replaced too
    assert len(notes) == 1 and "goes back from step 2 to step 2" in notes[0]


def test_a_log_whose_step_never_advances_is_noted_briefly():
    rows, notes = log_history_rows([grpo_entry(0, reward=r / 10) for r in range(10)], "x")
    assert rows == [{"step": 0, "reward": 0.9, "kl": 0.01, "entropy": 0.4, "loss": 0.0}]
    assert len(notes) == 4 and notes[-1] == "and 6 more such step(s) back"


def test_entries_without_a_step_are_left_out_and_noted():
    rows, notes = log_history_rows([grpo_entry(1), {"reward": 0.3}, "junk"], "x")
    assert [row["step"] for row in rows] == [1]
    assert notes == ["2 log_history entries without a numeric 'step' left out"]


# ------------------------------------------------------------------------------------------------ which file


def test_a_checkpoint_and_an_output_dir_of_checkpoints_stand_for_their_newest_state(tmp_path):
    for step in (50, 250, 100):
        write_json(tmp_path / "out" / f"checkpoint-{step}" / "trainer_state.json", {"log_history": [grpo_entry(step)]})
    (tmp_path / "out" / "checkpoint-300").mkdir()  # a save cut short: no trainer_state.json
    (tmp_path / "out" / "checkpoint-final").mkdir()  # not a checkpoint-N
    path, note = find_state_file(tmp_path / "out")
    assert path == tmp_path / "out" / "checkpoint-250" / "trainer_state.json"
    assert note == "newest of 4 checkpoint(s): checkpoint-250 (checkpoint-300 newer but without a trainer_state.json)"
    assert find_state_file(tmp_path / "out" / "checkpoint-100") == (
        tmp_path / "out" / "checkpoint-100" / "trainer_state.json",
        None,
    )
    assert find_state_file(tmp_path / "out" / "checkpoint-300") is None
    source = read_source(tmp_path / "out")
    assert source.reader == "trainer_state" and source.rows == [{"step": 250, "reward": 0.5, "kl": 0.01,
                                                                  "entropy": 0.4, "loss": 0.0}]  # fmt: skip
    assert source.description == f"{path} ({note})"


def test_a_state_at_the_top_of_an_output_dir_wins_over_its_checkpoints(tmp_path):
    write_json(tmp_path / "trainer_state.json", {"log_history": [grpo_entry(1), grpo_entry(2)]})
    write_json(tmp_path / "checkpoint-1" / "trainer_state.json", {"log_history": [grpo_entry(1)]})
    source = read_source(tmp_path)
    assert source.description == str(tmp_path / "trainer_state.json") and len(source.rows) == 2


def test_a_bare_log_history_list_is_read_like_the_state_and_noted(tmp_path):
    entries = [grpo_entry(1), grpo_entry(2)]
    bare = read_source(write_json(tmp_path / "step_logs.json", entries))
    state = read_source(write_json(tmp_path / "trainer_state.json", {"log_history": entries, "global_step": 2}))
    assert bare.rows == state.rows and bare.notes == ["a log_history list saved alone"] and state.notes == []
    assert load_log_history(tmp_path / "step_logs.json") == (entries, True)


# ------------------------------------------------------------------------------------------------ bad input


def error_line(capsys, argv) -> str:
    """cmd_doctor's exit status must be 2 and its stderr one line: that line."""
    assert cmd_doctor(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlhfkit doctor: error: "), err
    return err


def test_a_truncated_trainer_state_exits_2_saying_it_is_not_valid_json(tmp_path, capsys):
    path = tmp_path / "checkpoint-5" / "trainer_state.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"log_history": [grpo_entry(s) for s in range(1, 6)]}, indent=2)[:150])
    for argv in ([str(path)], [str(path.parent)]):
        err = error_line(capsys, argv)
        assert f"{str(path)!r} is not valid JSON" in err and "cut short by a crash" in err


def test_a_file_that_is_not_json_exits_2(tmp_path, capsys):
    path = tmp_path / "trainer_state.json"
    path.write_text("global_step: 250\n")
    assert "is not valid JSON (Expecting value at line 1, column 1;" in error_line(capsys, [str(path)])
    path.write_bytes(b"\xff\xfe\x00binary")
    assert "is not a text file" in error_line(capsys, [str(path)])


def test_a_json_object_without_log_history_exits_2_naming_its_keys(tmp_path, capsys):
    path = write_json(tmp_path / "config.json", {"model_type": "qwen2", "hidden_size": 64})
    err = error_line(capsys, [str(path)])
    assert "is a JSON object without 'log_history' (keys: model_type, hidden_size)" in err
    assert "trainer_state.json that transformers saves in each checkpoint-*/" in err


def test_other_json_that_is_no_log_history_exits_2(tmp_path, capsys):
    assert "holds a JSON int" in error_line(capsys, [str(write_json(tmp_path / "a.json", 3))])
    err = error_line(capsys, [str(write_json(tmp_path / "b.json", [1, 2, 3]))])
    assert "is a list of 3 entries but not a log_history: no entry is an object with a 'step'" in err
    assert "is empty" in error_line(capsys, [str(write_json(tmp_path / "c.json", {"log_history": []}))])
    err = error_line(capsys, [str(write_json(tmp_path / "d.json", {"log_history": {"step": 1}}))])
    assert "'log_history' in" in err and "is a dict, not a list" in err


def test_an_sft_run_exits_2_saying_it_holds_no_rl_metrics_and_naming_its_keys(tmp_path, capsys):
    sft = [{"loss": 2.1 - s / 10, "grad_norm": 1.0, "learning_rate": 2e-5, "epoch": s / 10, "step": s} for s in (1, 2)]
    sft.append({"eval_loss": 1.9, "eval_runtime": 2.0, "step": 2})
    path = write_json(tmp_path / "sft" / "checkpoint-2" / "trainer_state.json", {"log_history": sft})
    err = error_line(capsys, [str(tmp_path / "sft")])
    assert "holds no RL metrics (keys found: eval/loss, eval/runtime, grad_norm, learning_rate, loss)" in err
    assert str(path) in err and "is it an SFT or DPO run" in err and "Pass the logs of a PPO or GRPO run" in err


def test_a_dpo_run_exits_2_saying_it_holds_no_rl_metrics(tmp_path, capsys):
    keys = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "loss")
    dpo = [{**{key: 0.1 * s for key in keys}, "step": s} for s in (1, 2, 3)]
    err = error_line(capsys, [str(write_json(tmp_path / "trainer_state.json", {"log_history": dpo}))])
    assert "holds no RL metrics (keys found: logps/chosen, loss, rewards/accuracies, rewards/chosen," in err


def test_an_empty_directory_exits_2(tmp_path, capsys):
    err = error_line(capsys, [str(tmp_path)])
    assert f"no metrics.jsonl in {str(tmp_path)!r} (it is empty)" in err and "trainer_state.json" in err


def test_an_unreadable_log_exits_2(tmp_path, capsys):
    path = tmp_path / "train.log"
    path.write_bytes(b"\x00\x01\x02 not a log")
    assert "is not a log that rlhfkit doctor reads" in error_line(capsys, [str(path)])


# ------------------------------------------------------------------------------------------------ NaN


def test_a_nan_makes_nonfinite_metric_critical_at_its_step(tmp_path):
    entries = [grpo_entry(step) for step in range(1, 13)]
    entries[6]["kl"] = math.nan
    for path in (
        write_json(tmp_path / "trainer_state.json", {"log_history": entries}),
        write_json(tmp_path / "step_logs.json", entries),
    ):
        found = [(f.step, f.rule, f.severity) for f in doctor(path).findings]
        assert (7, "nonfinite_metric", CRITICAL) in found, found


# ------------------------------------------------------------------------------------------------ real runs


def test_the_wild_runs_directory_holds_the_files_tested_here():
    wild_file(WILD_FILES[0])
    assert sorted(path.name for path in WILD_TRL.iterdir()) == sorted(WILD_FILES)


@pytest.mark.parametrize("name", WILD_FILES)
def test_a_real_run_opens_as_its_file(name, capsys):
    path = wild_file(name)
    assert cmd_doctor([str(path)]) in (0, 1)
    out = capsys.readouterr().out
    rows = TRAINING_ROWS[name.split("__")[0]]
    assert f"rlhfkit doctor {path}: {rows} rows up to step" in out and "Read with the trainer_state reader" in out
    assert ("Note: a log_history list saved alone." in out) == (name in BARE_LISTS)
    assert ("Note: the final summary row at step 200" in out) == (name in BARE_LISTS)  # only those have one


@pytest.mark.parametrize("name", WILD_FILES)
@pytest.mark.parametrize("bare", [False, True], ids=["wrapped", "bare"])
def test_a_real_run_opens_as_a_checkpoint(name, bare, tmp_path, capsys):
    state = wild_state(name)
    checkpoint = tmp_path / "checkpoint-250"
    write_json(checkpoint / "trainer_state.json", state["log_history"] if bare else state)
    assert cmd_doctor([str(checkpoint)]) in (0, 1)
    assert f"({checkpoint / 'trainer_state.json'})" in capsys.readouterr().out
    assert read_source(checkpoint).rows == read_source(wild_file(name)).rows


@pytest.mark.parametrize("name", WILD_FILES)
def test_a_real_run_opens_as_an_output_dir_of_two_checkpoints_naming_the_newest(name, tmp_path, capsys):
    state = wild_state(name)
    out = tmp_path / "out"
    history = [entry for entry in state["log_history"] if "train_runtime" not in entry]
    early = {**state, "log_history": history[: len(history) // 2]}
    write_json(out / "checkpoint-100" / "trainer_state.json", early)
    shutil.copy(wild_file(name), write_json(out / "checkpoint-250" / "trainer_state.json", {}))
    assert cmd_doctor([str(out), "--json"]) in (0, 1)
    facts = json.loads(capsys.readouterr().out.splitlines()[0])["summary"]
    assert facts["reader"] == "trainer_state" and facts["rows"] == TRAINING_ROWS[name.split("__")[0]]
    newest = out / "checkpoint-250" / "trainer_state.json"
    assert facts["source"] == f"{newest} (newest of 2 checkpoint(s): checkpoint-250)"


@pytest.mark.parametrize("nth", range(len(WILD_FILES)))
def test_a_nan_in_a_real_run_is_critical_at_its_step(nth, tmp_path):
    name = WILD_FILES[nth]
    original = json.loads(wild_file(name).read_text())
    state, step, metric = with_nan(original, nth)
    found = doctor(write_json(tmp_path / name, state)).findings
    nonfinite = [(f.step, f.severity, list(f.metrics)) for f in found if f.rule == "nonfinite_metric"]
    assert nonfinite == [(step, CRITICAL, [metric])], (metric, found)
