"""The measured detection of docs/health.md: labels from true success (success_fall), verdicts and the table on hand-made
records, the claims the table makes on the committed run set (the tuning set's; the held-out set's and TRL's tables are
computed from their own records only), and a small subset of the set trained again."""

import json
from pathlib import Path

import pytest

from bench.health import build
from bench.health.agents import MODES as AGENT_MODES
from bench.health.detection import (
    AGENT_RULES,
    AGENTS,
    HELD_OUT,
    LATE_SEEDS,
    TRL,
    TUNING,
    Record,
    in_split,
    load_records,
    render_markdown,
    success_fall,
    verdict,
)
from bench.health.specs import MODES, SPECS
from docs import generate
from rlhfkit.health import CRITICAL, Thresholds

ROOT = Path(__file__).resolve().parents[3]
ALL_RECORDS = load_records(ROOT / "bench" / "health" / "records")
RECORDS = in_split(ALL_RECORDS, TUNING)  # the sort task, on which the thresholds were chosen


def success_rows(values, start=1):
    return [{"step": start + i, "rollout/task_success": v} for i, v in enumerate(values)]


def record(name="r", mode="lr_fast", onset=1, onset_kind="injected", ended=None, rows=(), split=TUNING):
    return Record(
        name,
        "ppo",
        mode,
        f"{mode} injected",
        onset,
        onset_kind,
        ended or {"ended": "finished"},
        list(rows),
        "sort",
        split,
    )


# --- labels -----------------------------------------------------------------------------------------------------------


def test_success_fall_is_the_start_of_a_fall_that_lasts():
    # 0.4 for 20 steps, then 0.2: the level (mean of the last 10) reaches 0.35 = best - 0.05 at step 23 (three 0.2s:
    # 0.34), and never comes back within 0.025 of 0.4.
    assert success_fall(success_rows([0.4] * 20 + [0.2] * 20)) == 23
    # A dip that recovers is noise; a run that ends only 0.05 below its best has not fallen for good.
    assert success_fall(success_rows([0.4] * 20 + [0.2] * 10 + [0.4] * 20)) is None
    assert success_fall(success_rows([0.4] * 20 + [0.35] * 20)) is None
    # A fall inside the first window is seen from half a window on: 5 steps at 0.4 (level 0.4), then 0.0: the level
    # of the first 7 is 0.286, 0.114 below the best.
    assert success_fall(success_rows([0.4] * 5 + [0.0] * 30)) == 6
    assert success_fall(success_rows([0.4] * 15)) is None  # too short to tell


def test_the_run_set_is_labelled_from_outside_the_rules():
    hacks = [r for r in RECORDS if r.mode == "reward_hacking"]
    assert hacks and all(r.onset_kind == "true success falls" and r.onset == success_fall(r.rows) for r in hacks)
    injected = [r for r in RECORDS if r.onset_kind == "injected" and not r.healthy]
    assert all(r.onset == SPECS[r.name].onset for r in injected)
    # every failure mode has runs: the agent task's in its own split
    assert {r.mode for r in RECORDS} == {"healthy", *MODES} - set(AGENT_MODES)
    assert {r.mode for r in in_split(ALL_RECORDS, AGENTS)} == {"healthy", *AGENT_MODES}
    assert {r.name for r in ALL_RECORDS} == set(SPECS)  # one record per spec, none stale
    assert all((r.split, r.task) == (SPECS[r.name].split, SPECS[r.name].task) for r in ALL_RECORDS)


def test_the_held_out_runs_are_of_tasks_no_threshold_was_chosen_on():
    """Every threshold was chosen on the sort task: the tuning split is sort alone, the held-out split never sort."""
    assert {r.task for r in RECORDS} == {"sort"}
    heldout = in_split(ALL_RECORDS, HELD_OUT)
    assert {r.task for r in heldout} == {"reverse", "addition", "reverse-chat"}
    assert sum(r.healthy for r in heldout) >= 20 and sum(not r.healthy for r in heldout) >= 30
    assert {r.algorithm for r in heldout if r.healthy} == {"ppo", "grpo"}


def _means(record, metric, n=10):
    values = [row[metric] for row in record.rows if metric in row]
    return sum(values[:n]) / n, sum(values[-n:]) / n


def test_the_held_out_set_meets_its_targets_and_its_notes_hold():
    """What docs/health.md's held-out section says of its records: every healthy run quiet (those trained after
    value_not_learning's rewrite among them), at least 90% of the sick runs flagged, the reward hacks labelled by
    true success falling from a level it could fall from, and reverse-chat's healthy PPO runs gaining sampled success
    while their greedy success falls."""
    heldout = in_split(ALL_RECORDS, HELD_OUT)
    verdicts = [verdict(r) for r in heldout]
    assert [(v.record.name, [f.rule for f in v.findings]) for v in verdicts if v.record.healthy and v.findings] == []
    late = [r.name for r in heldout if r.healthy and r.seed in LATE_SEEDS]
    assert len(late) == 6 and "heldout-healthy-rev-ppo-epochs1-s4" in late
    sick = [v for v in verdicts if not v.record.healthy and not v.record.unhurt]
    assert len(sick) >= 30 and sum(v.flagged_at is not None for v in sick) >= 0.9 * len(sick)
    hacks = [r for r in heldout if r.mode == "reward_hacking"]
    assert hacks and all(r.onset is not None and 10 <= r.onset <= 14 for r in hacks)
    assert all(
        _means(r, "eval/task_success", 1)[0] >= 0.39 and _means(r, "rollout/task_success")[1] <= 0.01 for r in hacks
    )
    chat_ppo = [r for r in heldout if r.healthy and r.task == "reverse-chat" and r.name.endswith(("-s0", "-s1"))]
    chat_ppo = [r for r in chat_ppo if r.algorithm == "ppo"]
    assert len(chat_ppo) == 2
    for r in chat_ppo:
        (sampled_start, sampled_end), (greedy_start, greedy_end) = (
            _means(r, "rollout/task_success"),
            _means(r, "eval/task_success", 1),
        )
        assert 0.12 <= sampled_start < 0.16 and 0.18 < sampled_end <= 0.21, r.name
        assert abs(greedy_start - 0.77) < 0.005 and 0.68 < greedy_end < 0.72, r.name


# --- verdicts and the table ---------------------------------------------------------------------------------------------


def test_verdict_counts_findings_from_the_onset_and_trainer_stops():
    nan_at_5 = [{"step": s, "loss": 0.1} for s in range(1, 5)] + [{"step": 5, "loss": float("nan")}]
    v = verdict(record(onset=3, rows=nan_at_5))
    assert (v.flagged_at, v.flagged_by, v.critical_at, v.delay) == (5, "nonfinite_metric", 5, 2)
    # The same finding before an injected onset is a false alarm, and the run is not flagged.
    v = verdict(record(onset=6, rows=nan_at_5))
    assert [f.rule for f in v.false_alarms] == ["nonfinite_metric"] and v.flagged_at is None
    # A trainer that refused the input at step 4 flagged it first.
    v = verdict(record(onset=3, rows=nan_at_5, ended={"ended": "RewardFunctionError", "step": 4}))
    assert (v.flagged_at, v.flagged_by, v.critical_at) == (4, "the trainer's reward check (exit 2)", 4)
    # In a healthy run every finding is a false alarm.
    v = verdict(record(mode="healthy", onset=None, rows=nan_at_5))
    assert len(v.false_alarms) == 1 and v.flagged_at is None


def test_table_of_hand_made_records():
    quiet = [{"step": s, "loss": 0.1} for s in range(1, 6)]
    nan = [*quiet, {"step": 6, "loss": float("nan")}]
    records = [
        record("healthy-a", "healthy", None, rows=quiet),
        record("healthy-b", "healthy", None, rows=nan),  # one critical false alarm
        record("sick-a", onset=2, rows=nan),  # flagged 4 steps after its onset
        record("sick-b", onset=2, rows=quiet),  # missed
        record("hack-a", "reward_hacking", None, "true success falls", rows=nan),  # never hurt: in no rate
    ]
    text = render_markdown(records)
    assert (
        "- **Recall:** 1 of 2 runs with a failure flagged (50%); failure modes with at least one rule that fires: 1 of 1."
        in text
    )
    assert (
        "- **False alarms:** 1 finding(s) over 2 healthy runs (1 critical); 0 before the onset of a sick run." in text
    )
    assert "| **lr_fast**: lr_fast injected | 2 | 1 | 1 | 4 | `nonfinite_metric` (1) |" in text
    assert "1 reward-hacking run(s) whose true success never fell" in text
    assert "| hack-a | never | 6 | `nonfinite_metric` | - | - |" in text


def test_each_split_has_its_own_table_computed_from_its_own_records_only():
    quiet = [{"step": s, "loss": 0.1} for s in range(1, 6)]
    nan = [*quiet, {"step": 6, "loss": float("nan")}]
    records = [
        record("tuning-healthy", "healthy", None, rows=quiet),
        record("tuning-sick", onset=2, rows=nan),
        record("heldout-healthy", "healthy", None, rows=nan, split=HELD_OUT),  # a false alarm, held-out only
        record("heldout-sick-a", "truncated", onset=2, rows=quiet, split=HELD_OUT),  # missed
        record("heldout-sick-b", "truncated", onset=2, rows=nan, split=HELD_OUT),
        record(
            "trl-sick",
            onset=2,
            rows=nan,
            split=TRL,
            ended={"ended": "finished", "live": [[6, "nonfinite_metric", "critical"]]},
        ),
    ]
    text = render_markdown(records)
    tuning, rest = text.split("## Held-out detection", 1)
    heldout, trl = rest.split("## TRL's GRPOTrainer", 1)
    assert "- **Recall:** 1 of 1 runs with a failure flagged (100%)" in tuning
    assert "- **False alarms:** 0 finding(s) over 1 healthy runs (0 critical)" in tuning
    assert "heldout-" not in tuning and "trl-" not in tuning
    assert "- **Recall:** 1 of 2 runs with a failure flagged (50%)" in heldout
    assert "- **False alarms:** 1 finding(s) over 1 healthy runs (1 critical)" in heldout
    # side by side: the tuning set's lr_fast beside no held-out run, the held-out set's truncation beside no tuning run
    assert "| **lr_fast** | 1 / 1 | 4 | 0 / 0 | - | - | no held-out run |" in heldout
    assert "| **truncated** | 0 / 0 | - | 1 / 2 | 4 | `nonfinite_metric` (1) | **partly: 1 of 2 missed** |" in heldout
    assert "| `nonfinite_metric` **(holds only on its tuning task)** | 1 (1) | 0 | 1 (1) | 1 |" in heldout
    assert "tuning-" not in heldout.split("### Held-out failure modes")[1] and "trl-" not in heldout
    assert "- **Recall:** 1 of 1 runs with a failure flagged (100%)" in trl
    assert "| trl-sick | 2 | 6, `nonfinite_metric` | 6 | 6 `nonfinite_metric` critical | yes |" in trl


@pytest.mark.skipif(
    not generate.WILD_RUNS.is_dir(), reason=f"the real-runs table reads {generate.WILD_RUNS}, absent here"
)
def test_docs_health_md_is_fresh():
    """docs/health.md is what `make docs` renders from the committed records (all three splits) and the real runs."""
    (page,) = [p for p in generate.PAGES if p.path == "docs/health.md"]
    current = (ROOT / page.path).read_text(encoding="utf-8")
    assert generate.expected(page, current) == current, "docs/health.md is stale: run `make docs`"


# --- what docs/health.md claims of the committed run set ----------------------------------------------------------------


def test_healthy_runs_of_the_set_give_no_finding():
    healthy = [r for r in RECORDS if r.healthy]
    assert len(healthy) >= 20
    assert {r.name: [(f.step, f.rule) for f in verdict(r).findings] for r in healthy} == {r.name: [] for r in healthy}


def test_every_failure_mode_is_flagged_and_recall_is_at_least_90_percent():
    sick = [verdict(r) for r in RECORDS if not r.healthy and not r.unhurt]
    flagged = {v.record.mode for v in sick if v.flagged_at is not None}
    assert flagged == set(MODES) - set(AGENT_MODES)  # the agent task's modes: their own split's test
    assert sum(v.flagged_at is not None for v in sick) >= 0.9 * len(sick)


def test_stale_batches_are_a_real_failure_flagged_first_by_the_off_policy_rule():
    """stale_offpolicy: true success falls to nothing after the onset, and off_policy_mismatch flags it first, within
    5 steps; the healthy asynchronous runs (max_staleness 1 and 4, GRPO and PPO) stay quiet at 3/4 of its thresholds."""
    stale = [r for r in RECORDS if r.mode == "stale_offpolicy"]
    assert len(stale) == 2
    for r in stale:
        success = [row["rollout/task_success"] for row in r.rows if "rollout/task_success" in row]
        before, end = success[r.onset - 11 : r.onset - 1], success[-20:]
        assert sum(before) / len(before) > 0.2 and sum(end) / len(end) < 0.02, r.name
        v = verdict(r)
        assert v.flagged_by == "off_policy_mismatch" and v.delay <= 5, (r.name, v.flagged_by, v.delay)
    healthy_async = [r for r in RECORDS if r.healthy and any("off_policy/mismatch_kl" in row for row in r.rows)]
    assert {r.algorithm for r in healthy_async} == {"grpo", "ppo"} and len(healthy_async) >= 4
    tighter = Thresholds(off_policy_kl_warning=0.15, off_policy_kl_critical=0.75, off_policy_masked_warning=0.075)
    assert [(r.name, f.step) for r in healthy_async for f in verdict(r, tighter).findings] == []


def test_ppo_at_learning_rate_0_5_is_critical_within_two_updates():
    for r in RECORDS:
        if r.name.startswith("lr_fast-ppo"):
            assert verdict(r).critical_at is not None and verdict(r).critical_at <= 2, r.name


def test_the_policy_going_random_is_critical_within_ten_steps_in_every_split():
    """Entropy rising while the reward falls is critical (entropy_rising) within 10 steps of its onset on
    runs of rlhfkit's PPO and GRPO (the tuning and held-out tasks) and of TRL's GRPOTrainer."""
    runs = [verdict(r) for r in ALL_RECORDS if r.mode == "policy_random"]
    assert {(v.record.split, v.record.algorithm) for v in runs} == {
        (TUNING, "ppo"), (TUNING, "grpo"), (HELD_OUT, "ppo"), (HELD_OUT, "grpo"), (TRL, "trl-grpo"),
    }  # fmt: skip
    late = [
        (v.record.name, [(f.step, f.severity) for f in v.findings if f.rule == "entropy_rising"])
        for v in runs
        if not any(
            f.rule == "entropy_rising" and f.severity == CRITICAL and f.step <= v.record.onset + 10 for f in v.findings
        )
    ]
    assert late == []
    healthy = [r for r in ALL_RECORDS if r.healthy]
    assert [(r.name, f.step) for r in healthy for f in verdict(r).findings if f.rule == "entropy_rising"] == []


# --- a subset of the set, trained again --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lr_fast-ppo-lr0.5-s0"])
@pytest.mark.slow
def test_a_spec_trained_again_gets_its_records_verdict(name, tmp_path):
    """The committed record still describes what the spec trains today: the same findings at the same steps (the
    numbers of a run this unstable may differ in the last digits across machines, the verdict may not)."""
    spec = SPECS[name]
    _, _, status = build.train(spec, tmp_path / name)
    assert status == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    again = verdict(
        Record(
            **{field: value for field, value in build.record(spec, tmp_path / name).items() if field in Record._fields}
        )
    )
    committed = verdict(next(r for r in RECORDS if r.name == name))
    assert [(f.step, f.rule, f.severity) for f in again.findings] == [
        (f.step, f.rule, f.severity) for f in committed.findings
    ]
    assert json.loads((tmp_path / name / "outcome.json").read_text()) == committed.record.ended


# --- what the first measurement missed (entropy collapse, KL runaway, a frozen value model) and the rules added for it --


@pytest.mark.parametrize(
    "mode, rule, longest",
    [
        ("entropy_collapse", "sampling_nearly_greedy", 4),  # the first full smooth_window
        ("kl_runaway", "kl_runaway", 59),  # the first full kl_trend_window
        ("value_frozen", "value_not_learning", 5),  # the median of smooth_window turns
    ],
)
def test_the_known_misses_are_flagged_first_by_their_rules(mode, rule, longest):
    runs = [verdict(r) for r in RECORDS if r.mode == mode]
    assert len(runs) >= 2
    assert [(v.record.name, v.flagged_by) for v in runs if v.flagged_by != rule or v.delay > longest] == []


def test_the_rules_for_the_known_misses_stay_quiet_on_healthy_runs_with_tighter_thresholds():
    """The margins table's nearest healthy runs: the completion entropy never below 0.945 nats (threshold ln 2), the
    KL's climb never above 0.176 nats/token over the window (0.25), the value model's predictions never moving less than
    2.07e-5 of the returns' spread (4e-6); on the held-out runs 1.54e-5."""
    tighter = Thresholds(completion_entropy_low=0.9, kl_trend_rise=0.2, value_still=1e-5)
    rules = {"sampling_nearly_greedy", "kl_runaway", "value_not_learning"}
    healthy = [r for r in [*RECORDS, *in_split(ALL_RECORDS, HELD_OUT)] if r.healthy]
    assert [(r.name, f.step, f.rule) for r in healthy for f in verdict(r, tighter).findings if f.rule in rules] == []
    text = render_markdown(RECORDS)
    assert "| `kl_runaway` (kl_runaway) |" in text and "0.176 (0.70x the threshold; healthy-ppo-kl0.1-s0" in text
    assert "2.07e-05 (5.17x the threshold; healthy-ppo-lora-s0" in text


def test_a_frozen_value_model_is_a_real_failure():
    """value_frozen, labelled by its injection: after the freeze the value model's explained variance stays near 1%
    while the same seeds' healthy runs reach 10% by update 100, and the policy still learns (true success rises)."""

    def explained(record, first, last):
        values = [
            row["val/var_explained"]
            for row in record.rows
            if first <= row["step"] <= last and "val/var_explained" in row
        ]
        return sum(values) / len(values)

    by_name = {r.name: r for r in RECORDS}
    for seed in (0, 1):
        frozen, healthy = by_name[f"value_frozen-ppo-frozen@20-s{seed}"], by_name[f"healthy-ppo-default-s{seed}"]
        assert explained(frozen, 60, 120) < 0.03 < 0.1 < explained(healthy, 100, 120), seed
        success = [row["rollout/task_success"] for row in frozen.rows if "rollout/task_success" in row]
        assert sum(success[-20:]) / 20 > sum(success[:20]) / 20 + 0.05, seed


# --- TRL's GRPOTrainer in the labelled set ------------------------------------------------------------------------------


def test_trl_runs_are_read_from_tensorboard_and_the_callback_found_the_same_live():
    """Each TRL run's rows are what rlhfkit doctor reads from TRL's TensorBoard files (train/<name> keys read as the
    bare names); HealthCallback inside TRL's trainer reported exactly the findings the replay of those rows gives."""
    trl = in_split(ALL_RECORDS, TRL)
    assert sum(r.healthy for r in trl) >= 3 and sum(not r.healthy for r in trl) >= 5
    for r in trl:
        assert r.rows and all(not key.startswith("train/") for row in r.rows for key in row), r.name
        replayed = [[f.step, f.rule, f.severity] for f in verdict(r).findings]
        assert r.ended["live"] == replayed, r.name


def test_trl_runs_healthy_quiet_and_sick_flagged():
    verdicts = [verdict(r) for r in in_split(ALL_RECORDS, TRL)]
    assert {v.record.name: v.findings for v in verdicts if v.record.healthy} == {
        v.record.name: [] for v in verdicts if v.record.healthy
    }
    assert [v.record.name for v in verdicts if not v.record.healthy and v.flagged_at is None] == []


def test_each_agent_rule_flags_the_failure_it_is_for_and_no_healthy_agent_run():
    # The agent task's labelled runs: a healthy run solves the task and its converged entropy is info, not a flag.
    agents = [verdict(r) for r in in_split(ALL_RECORDS, AGENTS)]
    healthy = [v for v in agents if v.record.healthy]
    assert len(healthy) >= 6 and not [f for v in healthy for f in v.findings]
    for mode, rule in AGENT_RULES.items():
        runs = [v for v in agents if v.record.mode == mode]
        assert len(runs) >= 3 and all(any(f.rule == rule for f in v.findings) for v in runs), mode
