"""verl.py: a verl run's rows from its console log (the real one in ../shared/wild-runs/verl, and small made-up ones:
colour codes, Ray prefixes, torn and unreadable lines, nan) and from its file logger's JSONL (both of the writer's
encodings of NaN); the sniffers; and the errors for files that hold no run."""

import json
import math
from pathlib import Path

import pytest

from rlhfkit.health.frameworks import map_names
from rlhfkit.health.verl import (
    looks_like_verl_jsonl,
    looks_like_verl_log,
    parse_step_line,
    read_verl_jsonl,
    read_verl_log,
)

ROOT = Path(__file__).resolve().parents[2]
# Third-party runs live beside the repository (CI clones it with ../shared next to it); read in place, never copied.
VERL_LOGS = sorted((ROOT.parent / "shared" / "wild-runs" / "verl").glob("*.log"))
needs_wild_log = pytest.mark.skipif(
    not VERL_LOGS, reason=f"the real verl console log is read from {ROOT.parent / 'shared' / 'wild-runs' / 'verl'}"
)

PREFIX = "\x1b[2m\x1b[36m(main_task pid=64899)\x1b[0m "


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# The real log: a verl PPO run of December 2024 (wild-runs/README.md).


@needs_wild_log
def test_the_real_log_gives_one_row_per_step_with_its_keys_as_logged():
    source = read_verl_log(VERL_LOGS[0])
    assert [row["step"] for row in source.rows] == list(range(106))  # 107 step lines: step 0 has two
    assert source.skipped_lines == []
    first = source.rows[0]
    assert first["critic/score/mean"] == 0.416
    assert first["test_score/openai/gsm8k"] == 0.521  # its own line, merged into step 0's row
    assert first["timing/gen"] == 48.956 and first["critic/lr(1e-4)"] == 0.1
    listed = ("critic/score/max", "critic/rewards/mean", "critic/advantages/min", "critic/returns/mean")
    listed += ("critic/values/mean", "critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm")
    listed += ("critic/kl", "critic/kl_coeff", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl")
    listed += ("actor/entropy_loss", "actor/grad_norm", "response_length/mean", "prompt_length/max")
    assert all(key in source.rows[50] for key in listed)
    # Later validations are fields of the training line, under another name: every tenth step from step 9.
    assert source.rows[9]["val/test_score/openai/gsm8k"] == 0.546 and "val/test_score/openai/gsm8k" not in first
    assert [row["step"] for row in source.rows if "val/test_score/openai/gsm8k" in row] == list(range(9, 106, 10))


@needs_wild_log
def test_the_real_log_under_the_rules_names():
    rows, sources, framework = map_names(read_verl_log(VERL_LOGS[0]).rows)
    assert framework == "verl"
    assert sources["reward"] == "critic/score/mean" and sources["kl"] == "critic/kl"
    assert sources["entropy"] == "actor/entropy_loss" and sources["policy/clipfrac_avg"] == "actor/pg_clipfrac"
    expected = ("reward", "kl", "entropy", "policy/clipfrac_avg", "policy/approxkl_avg", "loss/value_avg")
    expected += ("val/clipfrac_avg", "val/vpred", "val/mean", "completions/mean_length", "objective/kl_coef")
    assert all(name in rows[5] for name in expected)
    assert rows[0]["reward"] == 0.416 and rows[0]["entropy"] == 0.419
    assert "critic/score/mean" not in rows[0] and rows[0]["critic/score/max"] == 1.0  # the rest kept as logged


@needs_wild_log
def test_the_sniffers_tell_the_real_log():
    assert looks_like_verl_log(VERL_LOGS[0]) and not looks_like_verl_jsonl(VERL_LOGS[0])


# Made-up console logs.


def test_colour_codes_and_ray_prefixes_go_and_lines_of_one_step_merge(tmp_path):
    log = write(
        tmp_path / "run.log",
        [
            PREFIX + "{'actor_rollout_ref': {'actor': {'clip_ratio': 0.2,",
            PREFIX + "step:0 - val/score:0.5",
            PREFIX + "step:0 - actor/entropy:1.25 - \x1b[1mcritic/kl:0.000\x1b[0m",
            "step:1 - actor/entropy:1.125 - critic/lr(1e-4):0.100",
            PREFIX + "Total steps: 210, global_step:7 - x:1",  # not a step line: "steps", "global_step"
        ],
    )
    source = read_verl_log(log)
    assert source.rows == [
        {"step": 0, "val/score": 0.5, "actor/entropy": 1.25, "critic/kl": 0.0},
        {"step": 1, "actor/entropy": 1.125, "critic/lr(1e-4)": 0.1},
    ]
    assert source.skipped_lines == [] and "verl console log" in source.description


def test_nan_and_infinities_survive_as_floats(tmp_path):
    log = write(tmp_path / "run.log", ["step:3 - critic/vf_loss:nan - actor/ppo_kl:inf - actor/pg_loss:-inf"])
    row = read_verl_log(log).rows[0]
    assert math.isnan(row["critic/vf_loss"]) and row["actor/ppo_kl"] == math.inf and row["actor/pg_loss"] == -math.inf


def test_newer_verl_prints_full_precision_numpy_scalars_and_booleans(tmp_path):
    # verl prints pprint.pformat(v) since mid-2025: numpy 2 scalars as np.float64(...); booleans are no metric.
    log = write(tmp_path / "run.log", ["step:2 - actor/pg_loss:np.float64(-0.0251) - a/n:512 - a/flag:True"])
    assert read_verl_log(log).rows == [{"step": 2, "actor/pg_loss": -0.0251, "a/n": 512.0}]


def test_a_torn_or_unreadable_step_line_is_skipped_and_its_number_reported(tmp_path):
    log = write(
        tmp_path / "run.log",
        [
            "step:0 - critic/kl:0.001 - actor/entropy:0.5",
            "starting step 1",
            "step:1 - critic/kl:0.002 - actor/entropy:oops",
            "step:2 - critic/kl:0.003 - actor/ent",  # the job died mid-write
        ],
    )
    source = read_verl_log(log)
    assert [row["step"] for row in source.rows] == [0] and source.skipped_lines == [3, 4]


def test_parse_step_line():
    assert parse_step_line("no metrics here") is None
    assert parse_step_line("step:4") == (4, {})
    assert parse_step_line(PREFIX + "step:4 - a/b:1.5") == (4, {"a/b": 1.5})
    with pytest.raises(ValueError):
        parse_step_line("step:4 - a b:1.5")


@pytest.mark.parametrize("lines", [[], ["hello", "(main_task pid=1) {'trainer': {'total_epochs': 15}}"]])
def test_a_file_without_step_lines_is_a_value_error_naming_what_to_pass(tmp_path, lines):
    log = write(tmp_path / "empty.log", lines)
    with pytest.raises(ValueError, match=r"not a verl console log: \d+ line\(s\), no step line.*trainer\.logger"):
        read_verl_log(log)


def test_only_unreadable_step_lines_is_a_value_error_saying_so(tmp_path):
    log = write(tmp_path / "torn.log", ["step:0 - critic/k"])
    with pytest.raises(ValueError, match=r"1 unreadable step line"):
        read_verl_log(log)


# The file logger's JSONL (verl/utils/tracking.py, FileLogger).


def record(step: int, data: dict) -> str:
    return json.dumps({"step": step, "data": data})


def test_jsonl_records_merge_per_step_and_a_torn_last_line_is_skipped(tmp_path):
    path = write(
        tmp_path / "exp.jsonl",
        [
            record(0, {"val-core/gsm8k/reward/mean@1": 0.5}),
            record(0, {"critic/score/mean": 0.25, "actor/entropy": 1.5, "training/global_step": 0}),
            "",
            record(1, {"critic/score/mean": 0.5, "note": "text", "hist": [1, 2], "flag": True}),
            '{"step": 2, "data": {"critic/score/me',
        ],
    )
    source = read_verl_jsonl(path)
    assert source.rows == [
        {
            "step": 0,
            "val-core/gsm8k/reward/mean@1": 0.5,
            "critic/score/mean": 0.25,
            "actor/entropy": 1.5,
            "training/global_step": 0.0,
        },
        {"step": 1, "critic/score/mean": 0.5},
    ]
    assert source.skipped_lines == [5] and "verl file-logger JSONL" in source.description


def test_jsonl_nan_survives_in_both_of_the_writers_encodings(tmp_path):
    # json.dumps (until January 2026) writes NaN; orjson (since) writes null for every NaN and infinity.
    path = write(tmp_path / "exp.jsonl", ['{"step": 1, "data": {"a": NaN, "b": Infinity}}', record(2, {"a": None})])
    first, second = read_verl_jsonl(path).rows
    assert math.isnan(first["a"]) and first["b"] == math.inf and math.isnan(second["a"])


def test_jsonl_without_records_is_a_value_error(tmp_path):
    for lines in ([], ['{"step": 1, "reward": 0.5}']):  # the second: rlhfkit's metrics.jsonl, not verl's
        with pytest.raises(ValueError, match=r"not a verl file-logger JSONL.*trainer\.logger"):
            read_verl_jsonl(write(tmp_path / "exp.jsonl", lines))


def test_the_sniffers(tmp_path):
    log = write(tmp_path / "run.log", ["booting", PREFIX + "step:0 - critic/kl:0.0"])
    jsonl = write(tmp_path / "exp.jsonl", [record(0, {"critic/kl": 0.0})])
    metrics = write(tmp_path / "metrics.jsonl", ['{"step": 1, "kl": 0.0}'])
    assert looks_like_verl_log(log) and not looks_like_verl_jsonl(log)
    assert looks_like_verl_jsonl(jsonl) and not looks_like_verl_log(jsonl)
    assert not looks_like_verl_log(metrics) and not looks_like_verl_jsonl(metrics)
    assert not looks_like_verl_log(tmp_path / "missing.log") and not looks_like_verl_jsonl(tmp_path / "missing")


@needs_wild_log
@pytest.mark.parametrize("step", [0, 40, 105])
def test_a_nan_put_into_the_real_log_is_critical_at_its_step(tmp_path, step):
    """The real log with one metric of one step made NaN (as a diverging run prints it) and the same run as the file
    logger's JSONL: `rlhfkit doctor` reports nonfinite_metric, critical, at that step, and at no other."""
    from rlhfkit.health.doctor import doctor

    text = VERL_LOGS[0].read_text(encoding="utf-8")
    line = next(line for line in text.splitlines() if f"step:{step} - timing/gen:" in line)
    value = line.split("critic/vf_loss:")[1].split(" ")[0]
    broken = write(
        tmp_path / "run.log", [text.replace(line, line.replace(f"critic/vf_loss:{value}", "critic/vf_loss:nan"))]
    )
    rows = read_verl_log(VERL_LOGS[0]).rows
    jsonl = write(
        tmp_path / "run.jsonl",
        [
            json.dumps(
                {
                    "step": row["step"],
                    "data": {
                        **{k: v for k, v in row.items() if k != "step"},
                        **({"critic/vf_loss": math.nan} if row["step"] == step else {}),
                    },
                }
            )
            for row in rows
        ],
    )
    for path in (broken, jsonl):
        found = [(f.step, f.severity) for f in doctor(path).findings if f.rule == "nonfinite_metric"]
        assert found == [(step, "critical")], path.name
