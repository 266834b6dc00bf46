"""Each rule fires on a constructed stream at the step a hand computation predicts, and stays silent
on a healthy one; the real healthy PPO run gives no finding, with a margin."""

import json
import math
from pathlib import Path

import pytest

from rlhfkit.health import CRITICAL, RULES, WARNING, HealthMonitor, Thresholds, parse_thresholds

HEALTHY_PPO = Path(__file__).with_name("healthy_ppo_metrics.jsonl")


def replay(rows, thresholds=None):
    """Feed rows (dicts, step = 1-based position) to a fresh monitor; return (step, rule, severity) tuples."""
    monitor = HealthMonitor(thresholds)
    found = []
    for step, row in enumerate(rows, start=1):
        found += [(f.step, f.rule, f.severity) for f in monitor.observe(step, row)]
    return found


def findings(rows, thresholds=None):
    monitor = HealthMonitor(thresholds)
    return [f for step, row in enumerate(rows, start=1) for f in monitor.observe(step, row)]


def series(name, values):
    return [{name: v} for v in values]


def healthy_ppo_rows():
    rows = [json.loads(line) for line in HEALTHY_PPO.read_text().splitlines()]
    return [(row.pop("step"), row) for row in rows]


# --- the real healthy run ------------------------------------------------------------------------


def test_healthy_ppo_run_gives_no_finding_and_zero_health_scalars():
    monitor = HealthMonitor()
    rows = healthy_ppo_rows()
    assert len(rows) == 171 and sum("val/ratio" in row for _, row in rows) == 160  # 160 updates + 11 eval rows
    for step, row in rows:
        assert monitor.observe(step, row) == [], step
        assert monitor.summary_metrics() == {"health/warnings": 0, "health/critical": 0}


@pytest.mark.parametrize(
    "tightened, rule",
    [
        ({"ratio_warning_low": 0.95, "ratio_warning_high": 1.05}, "ratio_far_from_one"),  # defaults 0.5, 2
        ({"value_loss_spike_factor": 1.5}, "value_loss_spike"),  # default 5
        ({"kl_growth_factor": 2.0, "kl_floor": 0.5}, "kl_runaway"),  # defaults 2.5, 5
        ({"entropy_collapse_fraction": 0.5}, "entropy_collapse"),  # default 0.1
        ({"reward_kl_growth_factor": 1.0}, "reward_flat_kl_rising"),  # default 1.5: reward never flat over 50
        ({"reward_window": 20}, "reward_flat_kl_rising"),  # default 50: flat 20-windows exist, KL grows < 1.5x
        ({"kl_negative_below": 0.3}, "kl_negative"),  # default -0.05
    ],
)
def test_healthy_ppo_run_stays_quiet_with_margin(tightened, rule):
    # The defaults are not borderline: much tighter thresholds still find nothing in the healthy run.
    assert [f for f in replay([row for _, row in healthy_ppo_rows()], Thresholds(**tightened)) if f[1] == rule] == []


def test_healthy_ppo_update_size_margin_and_where_it_would_fire():
    rows = [row for _, row in healthy_ppo_rows()]
    assert replay(rows, Thresholds(clipfrac_high=0.1, approxkl_high=0.03)) == []  # defaults 0.3, 0.1
    # At a tenth of the defaults the first updates (step 5 = 5th update, after the eval row at step 1) fire.
    assert replay(rows, Thresholds(clipfrac_high=0.03, approxkl_high=0.01))[0] == (6, "updates_too_large", WARNING)


# --- one constructed stream per rule ---------------------------------------------------------------


def test_nonfinite_metric_names_every_bad_metric():
    rows = [{"loss/policy_avg": 0.1, "lr": 1e-5}] * 3 + [{"loss/policy_avg": float("nan"), "lr": float("inf")}]
    (f,) = findings(rows)
    assert (f.step, f.rule, f.severity) == (4, "nonfinite_metric", CRITICAL)
    assert set(f.metrics) == {"loss/policy_avg", "lr"} and math.isnan(f.metrics["loss/policy_avg"])
    assert "loss/policy_avg = nan" in f.message and "lr = inf" in f.message


def test_ratio_far_from_one_bounds_are_inclusive_and_escalate():
    assert replay(series("val/ratio", [1.0, 0.5, 2.0, 1.5])) == []
    assert replay(series("val/ratio", [1.0, 2.5])) == [(2, "ratio_far_from_one", WARNING)]
    assert replay(series("val/ratio", [1.0, 0.4])) == [(2, "ratio_far_from_one", WARNING)]
    assert replay(series("val/ratio", [12.0])) == [(1, "ratio_far_from_one", CRITICAL)]
    assert replay(series("val/ratio", [0.05])) == [(1, "ratio_far_from_one", CRITICAL)]
    (f,) = findings(series("val/ratio", [2.5]))
    assert f.metrics == {"val/ratio": 2.5} and "2.5, outside [0.5, 2]" in f.message


def test_value_loss_spike_against_recent_median():
    # Median of the previous 20 observations is 0.25: 1.5 is 6x (spike), 1.2 is 4.8x (not).
    assert replay(series("loss/value_avg", [0.25] * 20 + [1.5])) == [(21, "value_loss_spike", WARNING)]
    assert replay(series("loss/value_avg", [0.25] * 20 + [1.2])) == []
    # Too little history (needs smooth_window = 5 previous observations) -> no median to compare with.
    assert replay(series("loss/value_avg", [0.25] * 4 + [10.0])) == []
    assert replay(series("loss/value_avg", [0.25] * 5 + [10.0])) == [(6, "value_loss_spike", WARNING)]
    (f,) = findings(series("loss/value_avg", [0.25] * 20 + [1.5]))
    assert "6.0x its median 0.25 over the previous 20 observations" in f.message


def test_value_loss_nan_is_critical():
    found = replay(series("loss/value_avg", [0.25, float("nan")]))
    assert (2, "value_loss_spike", CRITICAL) in found and (2, "nonfinite_metric", CRITICAL) in found


def test_updates_too_large_needs_both_metrics_high_over_the_window():
    high = {"policy/clipfrac_avg": 0.35, "policy/approxkl_avg": 0.12}
    assert replay([high] * 5) == [(5, "updates_too_large", WARNING)]  # median of 5 needs 5 observations
    assert replay([{**high, "policy/approxkl_avg": 0.01}] * 10) == []
    assert replay([{**high, "policy/clipfrac_avg": 0.1}] * 10) == []


@pytest.mark.parametrize("name", ["objective/kl", "kl"])
def test_kl_negative_on_average_over_the_window(name):
    assert replay(series(name, [-0.1] * 20)) == [(20, "kl_negative", WARNING)]
    assert replay(series(name, [-0.1] * 19)) == []  # window not full yet
    assert replay(series(name, [-0.04] * 40)) == []  # mean above -0.05
    assert replay(series(name, [0.3, -0.5] * 20)) == [(20, "kl_negative", WARNING)]  # mean -0.1


def test_kl_runaway_needs_growth_and_the_floor():
    # Medians 3 then 8: 8 >= 2.5 * 3 and 8 >= 5 -> fires once both 20-observation windows are full.
    assert replay(series("objective/kl", [3.0] * 20 + [8.0] * 20)) == [(40, "kl_runaway", WARNING)]
    assert replay(series("objective/kl", [3.0] * 20 + [7.0] * 20)) == []  # 2.33x
    assert replay(series("objective/kl", [0.5] * 20 + [4.0] * 20)) == []  # 8x but below kl_floor 5
    assert replay(series("kl", [0.01] * 20 + [0.06] * 20)) == [(40, "kl_runaway", WARNING)]  # GRPO floor 0.05


def test_kl_coef_rising_steadily():
    # 0.05 * 1.1**k: the 11th observation (k = 10, 2.59x) is the first with 10 changes to inspect.
    assert replay(series("objective/kl_coef", [0.05 * 1.1**k for k in range(15)])) == [(11, "kl_coef_rising", WARNING)]
    assert replay(series("objective/kl_coef", [0.05] * 30)) == []  # a fixed coefficient
    # Doubled, then held: rises in 0 of the last 10 changes -> quiet again.
    monitor = HealthMonitor()
    for step, value in enumerate([0.05 * 1.1**k for k in range(15)] + [0.2] * 10, start=1):
        monitor.observe(step, {"objective/kl_coef": value})
    assert monitor.firing() == {}


@pytest.mark.parametrize("name", ["objective/entropy", "policy/entropy_avg", "entropy"])
def test_entropy_collapse_relative_to_the_start(name):
    # Start level median(first 5) = 2.0; 0.15 < 0.1 * 2.0. Start and current windows may not overlap,
    # so the 10th observation is the first that can fire.
    assert replay(series(name, [2.0] * 5 + [0.15] * 10)) == [(10, "entropy_collapse", WARNING)]
    assert replay(series(name, [2.0] * 5 + [0.3] * 10)) == []  # 15% of the start


def test_entropy_collapse_reports_all_collapsed_entropies():
    rows = [{"objective/entropy": 2.0, "policy/entropy_avg": 0.4}] * 5 + [
        {"objective/entropy": 0.1, "policy/entropy_avg": 0.02}
    ] * 5
    (f,) = findings(rows)
    assert f.metrics == {"objective/entropy": 0.1, "policy/entropy_avg": 0.02}
    assert "objective/entropy = 0.1 (5% of its start level 2)" in f.message


@pytest.mark.parametrize("reward, kl", [("objective/rlhf_reward", "objective/kl"), ("reward", "kl")])
def test_reward_flat_while_kl_grows(reward, kl):
    def rows(rewards, kls):
        return [{reward: r, kl: k} for r, k in zip(rewards, kls)]

    kl_doubles = [1.0] * 25 + [2.0] * 25
    assert replay(rows([0.5] * 50, kl_doubles)) == [(50, "reward_flat_kl_rising", WARNING)]
    assert replay(rows([0.5] * 25 + [0.4] * 25, kl_doubles)) == [(50, "reward_flat_kl_rising", WARNING)]
    assert replay(rows([0.5] * 25 + [0.51] * 25, kl_doubles)) == []  # reward still rising
    assert replay(rows([0.5] * 50, [1.0] * 25 + [1.4] * 25)) == []  # KL grew only 1.4x
    (f,) = findings(rows([0.5] * 25 + [0.4] * 25, kl_doubles))
    assert f"{reward} changed by -0.1" in f.message and "grew 2.0x (1 -> 2)" in f.message


def test_completions_clipped_warns_then_escalates():
    # Median of the last 5: 0.6 from the 5th observation; 0.95 once three of the last five are 0.95.
    stream = series("completions/clipped_ratio", [0.6] * 5 + [0.95] * 5)
    assert replay(stream) == [(5, "completions_clipped", WARNING), (8, "completions_clipped", CRITICAL)]
    assert replay(series("completions/clipped_ratio", [0.4] * 20)) == []
    (f,) = findings(series("completions/clipped_ratio", [0.6] * 5))
    assert "60% of completions" in f.message and "max_completion_length" in f.advice


def test_reward_zero_std_near_one():
    assert replay(series("frac_reward_zero_std", [0.95] * 5)) == [(5, "reward_zero_std", WARNING)]
    assert replay(series("frac_reward_zero_std", [0.85] * 20)) == []


def test_clip_ratio_high():
    assert replay(series("clip_ratio/region_mean", [0.25] * 5)) == [(5, "clip_ratio_high", WARNING)]
    assert replay(series("clip_ratio/region_mean", [0.15] * 20)) == []


def test_reward_overoptimised_score_up_true_success_not():
    """PPO: objective/scores at 0 for 20 updates, then at 0.4 (start and current levels 20 updates each) while sampled
    success stays at 0.45: a warning at the 40th update. With success rising as well, or the score rising less,
    nothing."""
    scores = [0.0] * 20 + [0.4] * 20
    flat = [{"objective/scores": s, "rollout/task_success": 0.45} for s in scores]
    assert replay(flat) == [(40, "reward_overoptimised", WARNING)]
    (f,) = findings(flat)
    assert (
        "objective/scores rose from 0 to 0.4" in f.message
        and "rollout/task_success went from 0.45 to 0.45" in f.message
    )
    learning = [{"objective/scores": s, "rollout/task_success": 0.45 + s / 4} for s in scores]  # +0.1
    assert replay(learning) == []
    assert replay([{"objective/scores": s / 2, "rollout/task_success": 0.45} for s in scores]) == []  # +0.2 only


def test_reward_overoptimised_on_eval_success_for_grpo():
    """GRPO: reward at 0, then 0.5; greedy success before training 0.45, then every 10 steps 0.45, 0.44, 0.40, 0.38
    (last three 0.407 on average): a warning at the last evaluation."""
    rows = [{"eval/task_success": 0.45}]
    for i in range(40):
        rows.append({"reward": 0.0 if i < 20 else 0.5, "entropy": 0.5})
        if i % 10 == 9:
            rows.append({"eval/task_success": [0.45, 0.44, 0.40, 0.38][i // 10]})
    assert replay(rows) == [(len(rows), "reward_overoptimised", WARNING)]
    rows[-1] = {"eval/task_success": 0.9}  # the last evaluation recovers: 0.58 on average, rising
    assert replay(rows) == []


def test_every_rule_is_exercised_by_this_file():
    source = Path(__file__).read_text()
    assert [r.name for r in RULES if f'"{r.name}"' not in source] == []


# --- streams: presence of metrics, gaps, GRPO --------------------------------------------------------


def test_windows_count_observations_not_rows():
    # 20 observations of objective/kl spread over 60 rows (eval rows in between): fires at the 20th observation.
    rows = []
    for _ in range(20):
        rows += [{"objective/kl": -0.1}, {"eval/task_success": 0.5}, {"eval/scores": 0.1}]
    assert replay(rows) == [(58, "kl_negative", WARNING)]


def test_healthy_grpo_like_stream_is_quiet():
    rows = []
    for i in range(200):
        wobble = 0.02 * ((i % 7) - 3)
        rows.append(
            {
                "num_tokens": 1000.0 * (i + 1),
                "completions/mean_length": 5.0,
                "completions/clipped_ratio": 0.05 + wobble,
                "completions/mean_terminated_length": 4.8,
                "rewards/correct/mean": 0.2 + 0.003 * i + wobble,
                "rewards/correct/std": 0.3,
                "reward": 0.2 + 0.003 * i + wobble,
                "reward_std": 0.3,
                "frac_reward_zero_std": 0.4 + wobble,
                "kl": 0.001 + 0.0001 * i,
                "entropy": 0.3 - 0.0005 * i,
                "clip_ratio/low_mean": 0.0,
                "clip_ratio/high_mean": 0.01,
                "clip_ratio/region_mean": 0.01,
                "loss": 0.01 + wobble,
                "lr": 1e-4,
                "episode": 256 * (i + 1),
            }
        )
    assert replay(rows) == []


def test_ppo_rules_do_not_evaluate_on_grpo_rows():
    monitor = HealthMonitor()
    monitor.observe(1, {"val/ratio": 5.0})
    assert monitor.firing() == {"ratio_far_from_one": WARNING}
    monitor.observe(2, {"reward": 0.1, "entropy": 0.3})  # no val/ratio: the rule keeps its state
    assert monitor.firing() == {"ratio_far_from_one": WARNING}


def test_values_that_are_not_numbers_are_ignored():
    assert replay([{"val/ratio": "3.0", "flag": True, "note": None, "lr": 1e-5}] * 3) == []


# --- thresholds -------------------------------------------------------------------------------------


def test_parse_thresholds_from_text_json_and_mapping():
    t = parse_thresholds("ratio_warning_high=3, smooth_window=8")
    assert (t.ratio_warning_high, t.smooth_window, t.ratio_warning_low) == (3.0, 8, 0.5)
    assert isinstance(t.smooth_window, int)
    assert parse_thresholds('{"kl_floor": 7, "kl_window": 30.0}') == Thresholds(kl_floor=7.0, kl_window=30)
    assert parse_thresholds({"zero_std_warning": 0.8}).zero_std_warning == 0.8
    assert parse_thresholds(None) == parse_thresholds("") == Thresholds()


@pytest.mark.parametrize(
    "spec, match",
    [
        ("ratio_warnin_high=3", "unknown health threshold.*ratio_warnin_high.*known: smooth_window"),
        ("ratio_warning_high", "not of the form name=value"),
        ("smooth_window=2.5", "smooth_window='2.5' is not an integer"),
        ({"smooth_window": 2.5}, "smooth_window=2.5 is not an integer"),
        ("kl_floor=high", "kl_floor='high' is not a number"),
        ('{"kl_floor": 7', "not valid JSON"),
        ("smooth_window=0", "positive integer"),
        ("ratio_warning_high=0.9", "ratio_critical_low <= ratio_warning_low < 1"),
    ],
)
def test_parse_thresholds_rejects_bad_input(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_thresholds(spec)


def test_changed_threshold_changes_the_verdict():
    stream = series("val/ratio", [2.5])
    assert replay(stream, parse_thresholds("ratio_warning_high=3")) == []
    assert replay(stream) == [(1, "ratio_far_from_one", WARNING)]


HEALTHY_GRPO = Path(__file__).with_name("healthy_grpo_metrics.jsonl")


def test_healthy_grpo_run_gives_no_finding():
    """A built-in GRPO run (100 steps, greedy success 0.449 -> 0.559): no finding at any step."""
    monitor = HealthMonitor()
    rows = [json.loads(line) for line in HEALTHY_GRPO.read_text().splitlines()]
    assert sum("reward" in row for row in rows) == 100 and "entropy" in rows[1]
    for row in rows:
        step = row.pop("step")
        assert monitor.observe(step, row) == [], step
        assert monitor.summary_metrics() == {"health/warnings": 0, "health/critical": 0}
