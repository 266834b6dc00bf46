"""Each rule fires on a constructed stream at the step a hand computation predicts, and stays silent
on a healthy one; the real healthy PPO run gives no finding, with a margin. Rules are well formed and read only
metric names the trainers log."""

import json
import math
import random
import re
from pathlib import Path

import pytest

from rlhfkit.health import CRITICAL, INFO, RULES, SEVERITIES, WARNING, HealthMonitor, Thresholds, parse_thresholds
from rlhfkit.metrics.registry import TRAINERS, metrics_for

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


def only(rule, found):
    """The (step, rule, severity) tuples of one rule."""
    return [f for f in found if f[1] == rule]


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


def test_ratio_far_from_one_must_stay_strictly_inside_and_escalates():
    assert replay(series("val/ratio", [1.0, 0.51, 1.99, 1.5])) == []
    assert replay(series("val/ratio", [1.0, 0.5])) == [(2, "ratio_far_from_one", WARNING)]  # 0.50 exactly
    assert replay(series("val/ratio", [1.0, 2.0])) == [(2, "ratio_far_from_one", WARNING)]
    assert replay(series("val/ratio", [1.0, 2.5])) == [(2, "ratio_far_from_one", WARNING)]
    assert replay(series("val/ratio", [12.0])) == [(1, "ratio_far_from_one", CRITICAL)]
    assert replay(series("val/ratio", [0.1])) == [(1, "ratio_far_from_one", CRITICAL)]
    (f,) = findings(series("val/ratio", [2.5]))
    assert f.metrics == {"val/ratio": 2.5} and "2.5, not inside (0.5, 2)" in f.message
    assert f.thresholds == {"val/ratio": 2.0}


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
    assert only("kl_negative", replay(series(name, [0.3, -0.5] * 20))) == [(20, "kl_negative", WARNING)]  # mean -0.1


def test_kl_runaway_needs_growth_and_the_floor():
    # Medians 3 then 8: 8 >= 2.5 * 3 and 8 >= 5 -> fires once both 20-observation windows are full.
    assert replay(series("objective/kl", [3.0] * 20 + [8.0] * 20)) == [(40, "kl_runaway", WARNING)]
    assert replay(series("objective/kl", [3.0] * 20 + [7.0] * 20)) == []  # 2.33x
    assert replay(series("objective/kl", [0.5] * 20 + [4.0] * 20)) == []  # 8x but below kl_floor 5
    assert replay(series("kl", [0.0] + [0.005] * 19 + [0.06] * 20)) == [(40, "kl_runaway", WARNING)]  # GRPO floor 0.05


def _climb(slope, length=6.0, wobble=0.0, n=80):
    """PPO rows: objective/kl = 0.5 + slope * k (+ wobble on odd k) nats per sequence of `length` tokens."""
    return [
        {"objective/kl": 0.5 + slope * k + wobble * (k % 2), "tokens/responses_len_mean": length} for k in range(n)
    ]


def test_kl_runaway_on_a_steady_climb():
    """0.03 nats/sequence per update over 6 tokens: the Theil-Sen slope over the 60-observation window is 0.03, so the
    climb is 0.03 * 60 / 6 = 0.3 nats/token >= 0.25, and a series that rises in all its 1770 pairs has Mann-Kendall
    z = 1769 / sqrt(60 * 59 * 125 / 18) = 11.3: fires at the 60th observation, the first with a full window. The
    window-to-window test stays quiet (medians 0.785 and 1.385 at the 40th: 1.8x, below the 5-nat floor)."""
    assert only("kl_runaway", replay(_climb(0.03))) == [(60, "kl_runaway", WARNING)]
    (f,) = [f for f in findings(_climb(0.03)) if f.rule == "kl_runaway"]
    assert "by 0.3 nats/token" in f.message and "Mann-Kendall z = 11.3" in f.message
    # The threshold drawn: the window's start level (median of its first 5: 0.56) plus 0.25 nats/token * 6 tokens.
    assert f.thresholds == {"objective/kl": pytest.approx(0.56 + 1.5)}
    # 0.02 per update is 0.2 nats/token over the window; the same climb over 12-token completions is 0.15.
    assert only("kl_runaway", replay(_climb(0.02))) == []
    assert only("kl_runaway", replay(_climb(0.03, length=12.0))) == []
    # Noise on every other update leaves the robust slope at 0.03 (the 870 same-parity pairs are exactly 0.03 and
    # hold the median) and z at 10.2: still the 60th.
    assert only("kl_runaway", replay(_climb(0.03, wobble=0.2))) == [(60, "kl_runaway", WARNING)]
    # One outlier moves neither statistic much: a flat KL with a single spike is no climb.
    spike = [{"objective/kl": 0.5, "tokens/responses_len_mean": 6.0}] * 59 + [{"objective/kl": 20.0}]
    assert only("kl_runaway", replay(spike)) == []
    # GRPO's kl is per token already: 0.005 per step is 0.3 over 60 observations (from 0.2: the window medians at
    # the 40th, 0.2475 and 0.3475, are no 2.5-fold growth).
    climb = series("kl", [0.2 + 0.005 * k for k in range(60)])
    assert only("kl_runaway", replay(climb)) == [(60, "kl_runaway", WARNING)]
    assert only("kl_runaway", replay(series("kl", [0.2 + 0.004 * k for k in range(60)]))) == []  # 0.24


def test_kl_runaway_trend_needs_a_rise_that_stands_out_of_the_noise():
    """The same 0.03 per update under Gaussian noise of 3 nats (seed 0): the Theil-Sen slope still says 0.55
    nats/token over the window, but the Mann-Kendall z is 1.97: a rise the noise could make, quiet. With noise of
    0.3 nats it is z = 7.5 and fires."""
    from rlhfkit.health.rules import mann_kendall_z, theil_sen_slope

    def rows(noise):
        g = random.Random(0)
        return [
            {"objective/kl": 3.5 + 0.03 * k + g.gauss(0, noise), "tokens/responses_len_mean": 6.0} for k in range(60)
        ]

    values = [row["objective/kl"] for row in rows(3.0)]
    assert theil_sen_slope(values) * 60 / 6 == pytest.approx(0.554, abs=1e-3)
    assert mann_kendall_z(values) == pytest.approx(1.97, abs=0.01)
    assert only("kl_runaway", replay(rows(3.0))) == []
    assert mann_kendall_z([row["objective/kl"] for row in rows(0.3)]) > 3
    assert only("kl_runaway", replay(rows(0.3))) == [(60, "kl_runaway", WARNING)]


def test_trend_statistics_against_hand_computations():
    from rlhfkit.health.rules import mann_kendall_z, theil_sen_slope

    # Slopes of [0, 1, 3]: 1, 3, 1.5 (pair 0-2) -> median 1.5; S = 3, var = 3 * 2 * 11 / 18: z = 2 / sqrt(11 / 3).
    assert theil_sen_slope([0.0, 1.0, 3.0]) == 1.5
    assert mann_kendall_z([0.0, 1.0, 3.0]) == pytest.approx(2 / math.sqrt(11 / 3))
    assert mann_kendall_z([3.0, 1.0, 0.0]) == pytest.approx(-2 / math.sqrt(11 / 3))
    assert mann_kendall_z([1.0] * 10) == 0.0  # ties count neither way
    # A level shift held for half the window: cross pairs slope 2 / d, the median pair at d = 54 or 55.
    assert theil_sen_slope([0.5] * 30 + [2.5] * 30) == pytest.approx((2 / 54 + 2 / 55) / 2)


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
        {"objective/entropy": 0.12, "policy/entropy_avg": 0.03}
    ] * 5
    (f,) = findings(rows)
    assert (f.step, f.severity) == (10, WARNING)
    assert f.metrics == {"objective/entropy": 0.12, "policy/entropy_avg": 0.03}
    assert "objective/entropy median 0.12 (6% of its start level 2)" in f.message
    assert f.thresholds == {"objective/entropy": 0.2, "policy/entropy_avg": 0.04000000000000001}


@pytest.mark.parametrize("name", ["objective/entropy", "entropy"])
def test_entropy_falling_to_a_twentieth_in_one_step_is_critical_at_once(name):
    # A PPO run at learning rate 0.5: 2.16 -> 0.086 (4%) at the second update, before any window is full.
    assert replay(series(name, [2.16, 0.086])) == [(2, "entropy_collapse", CRITICAL)]
    assert replay(series(name, [2.16, 0.12])) == []  # 5.6%: left to the windowed check


@pytest.mark.parametrize(
    "entropy, length", [("policy/entropy_avg", "tokens/responses_len_mean"), ("entropy", "completions/mean_length")]
)
def test_sampling_nearly_greedy_on_the_entropy_of_a_whole_completion(entropy, length):
    """0.05 nats/token over 6-token completions is 0.3 nats a completion, exp(0.3) = 1.35 equally likely completions:
    below ln 2 once the median of the last five entropies is 0.05 (the 6th row here, three of five); 0.12 nats/token
    is 0.72 nats, just above it."""
    rows = [{entropy: e, length: 6.0} for e in [0.3] * 3 + [0.05] * 5]
    assert replay(rows) == [(6, "sampling_nearly_greedy", WARNING)]
    (f,) = findings(rows)
    assert f.metrics == {entropy: 0.05} and f.thresholds == {entropy: pytest.approx(0.6931 / 6)}
    assert "0.3 nats per completion, worth 1.35 equally likely completions" in f.message and "temperature" in f.advice
    assert replay([{entropy: 0.12, length: 6.0}] * 20) == []
    # The same 0.05 nats/token over 20-token completions is 1 nat: two to three completions, quiet.
    assert replay([{entropy: 0.05, length: 20.0}] * 20) == []
    # Without the completion length there is no whole-completion entropy.
    assert replay(series(entropy, [0.05] * 20)) == []


def test_completions_clipped_warns_when_held_and_not_falling():
    # The median of the last 5 and of the last 20 both reach 0.6 at the 20th observation.
    assert replay(series("completions/clipped_ratio", [0.6] * 20)) == [(20, "completions_clipped", WARNING)]
    assert replay(series("completions/clipped_ratio", [0.4] * 40)) == []
    (f,) = findings(series("completions/clipped_ratio", [0.6] * 20))
    assert "60% of completions" in f.message and "max_completion_length" in f.advice


def test_completions_clipped_is_quiet_while_a_rambling_start_learns_to_stop():
    """Every completion cut at first, then fewer and fewer (a starting model that rambles): the level falls more
    than clipped_recovering below its highest, so no finding, though it stays above the warning level for 20 steps."""
    falling = [1.0] * 5 + [1.0 - 0.02 * i for i in range(1, 30)]
    assert replay(series("completions/clipped_ratio", falling)) == []


def test_completions_clipped_is_critical_only_when_held_and_the_reward_falls():
    """All completions cut for 40 steps. A reward that rises meanwhile (the model still learns, and stands at the top
    of its range): a warning. A reward
    alternating 0.9/1.0 that drops to 0.2 from step 30: critical once the median of the last 5 rewards is 0.2 (step
    33), far more than 3 noise units (successive differences of 0.1 and one of 0.75: about 0.07 a unit) below the
    median 0.95 of the observations before."""
    rising = [{"completions/clipped_ratio": 1.0, "reward": 0.02 * i, "reward_std": 0.3} for i in range(40)]
    assert only("completions_clipped", replay(rising)) == [(20, "completions_clipped", WARNING)]
    rewards = [0.9 + 0.1 * (i % 2) for i in range(29)] + [0.2] * 11
    falling = [{"completions/clipped_ratio": 1.0, "reward": r, "reward_std": 0.3} for r in rewards]
    assert only("completions_clipped", replay(falling)) == [
        (20, "completions_clipped", WARNING),
        (32, "completions_clipped", CRITICAL),
    ]


def test_completions_clipped_is_critical_when_held_while_the_reward_never_moves():
    """Every completion cut from the start and a reward that never moves (cut answers all score 0): critical once the
    median over the last 20 is at least 0.9 (the 20th), the reward having 20 observations to judge by."""
    stuck = [{"completions/clipped_ratio": 1.0, "reward": 0.0, "reward_std": 0.0} for _ in range(25)]
    assert only("completions_clipped", replay(stuck)) == [(20, "completions_clipped", CRITICAL)]
    (f,) = [f for f in findings(stuck) if f.rule == "completions_clipped"]
    assert "reward has not moved in 20 observations" in f.message


def _zero_std_rows(rewards, zero_std):
    return [{"reward": r, "reward_std": 0.0, "frac_reward_zero_std": z} for r, z in zip(rewards, zero_std)]


def test_reward_zero_std_warns_from_half_of_the_groups():
    assert replay(series("frac_reward_zero_std", [0.5] * 5)) == [(5, "reward_zero_std", WARNING)]
    assert replay(series("frac_reward_zero_std", [0.45] * 20)) == []


def test_reward_zero_std_with_a_reward_that_never_moved_is_no_signal_critical_when_held():
    """Every completion earns the same (1, or 0) from the start: the reward has no range, so nothing says the groups
    are solved; a warning at 5, critical once the median of the last 20 is at least 0.95 (the 20th)."""
    for value in (0.0, 1.0):
        found = replay(_zero_std_rows([value] * 25, [1.0] * 25))
        assert only("reward_zero_std", found) == [(5, "reward_zero_std", WARNING), (20, "reward_zero_std", CRITICAL)]
        assert "no learning signal" in findings(_zero_std_rows([value] * 25, [1.0] * 25))[-1].message


def test_reward_zero_std_near_the_rewards_top_is_a_solved_task():
    """The reward climbs from 0 to 1 over 30 steps while more and more groups are all right, then stays at 1 with
    every group without spread. At the 23rd step 3 of the last 5 shares are 0.8; the reward's level (median of the
    last 5: 20/30) is 91% of the way up its range so far (0 to 22/30): info, and it stays info to the end."""
    rewards = [i / 30 for i in range(30)] + [1.0] * 20
    zero_std = [0.4] * 20 + [0.8] * 10 + [1.0] * 20
    found = findings(_zero_std_rows(rewards, zero_std))
    assert [(f.step, f.rule, f.severity) for f in found] == [(23, "reward_zero_std", INFO)]
    assert "91% of the way" in found[0].message and "nothing left to learn" in found[0].message
    monitor = HealthMonitor()
    for step, row in enumerate(_zero_std_rows(rewards, zero_std), start=1):
        monitor.observe(step, row)
    assert monitor.firing() == {"reward_zero_std": INFO}


def test_reward_zero_std_near_the_rewards_bottom_is_no_signal():
    """The reward fell from 1 to 0 and stays there with every group without spread (from step 21): a warning once 3
    of the last 5 groups' shares are 1 (the 23rd), critical once 11 of the last 20 are (the 31st), the reward's level
    at the bottom of its range."""
    rewards = [1.0 - i / 20 for i in range(20)] + [0.0] * 25
    zero_std = [0.3] * 20 + [1.0] * 25
    found = only("reward_zero_std", replay(_zero_std_rows(rewards, zero_std)))
    assert found == [(23, "reward_zero_std", WARNING), (31, "reward_zero_std", CRITICAL)]


def test_clip_ratio_high():
    assert replay(series("clip_ratio/region_mean", [0.25] * 5)) == [(5, "clip_ratio_high", WARNING)]
    assert replay(series("clip_ratio/region_mean", [0.15] * 20)) == []


def _hacked(success_after, score_after, before=20, after=5):
    """PPO rows: success alternating 0.40/0.50 and score alternating 0.0/0.1 for `before` updates, then both at
    constant levels for `after` updates."""
    rows = [{"objective/scores": 0.1 * (i % 2), "rollout/task_success": 0.4 + 0.1 * (i % 2)} for i in range(before)]
    return rows + [{"objective/scores": score_after, "rollout/task_success": success_after}] * after


def test_reward_overoptimised_when_true_success_falls_beyond_its_noise_while_the_score_rises():
    """Hand computation for _hacked(0.25, 0.3) at the 23rd update, the first whose window of 3 (updates 21-23) is
    all after the change: success level 0.25, score level 0.3. The best earlier window holds two 0.5 and a 0.4:
    0.467, with score level 0.0667. Step-to-step noise of success: 19 differences of 0.1, one of 0.25 and two of 0
    over 22 differences, sqrt(0.2525 / 44) = 0.0758, times sqrt(2/3): 0.0619 a noise unit; the fall of 0.217 is
    more than 3 of them (0.186). The score rose 0.233, more than its own noise unit. At the 22nd update the window
    still holds a 0.5: a fall of 0.133 only."""
    found = only("reward_overoptimised", replay(_hacked(0.25, 0.3)))
    assert found == [(23, "reward_overoptimised", WARNING)]
    (f,) = [f for f in findings(_hacked(0.25, 0.3)) if f.rule == "reward_overoptimised"]
    assert "rollout/task_success fell from 0.467 to 0.25 while objective/scores rose from 0.0667 to 0.3" in f.message
    assert f.thresholds["rollout/task_success"] == pytest.approx(1.4 / 3 - 3 * math.sqrt(0.2525 / 44 * 2 / 3))
    assert f.thresholds["objective/scores"] == pytest.approx(0.2 / 3)
    # The score falls with success (the policy got worse, not a hack) -> not this rule.
    assert only("reward_overoptimised", replay(_hacked(0.25, 0.0))) == []
    # A fall within the noise: success never falls 3 noise units below its best level.
    assert only("reward_overoptimised", replay(_hacked(0.38, 0.3))) == []


def test_reward_overoptimised_on_eval_success_for_grpo():
    """GRPO: reward at 0, then 0.5; greedy success before training 0.45, then every 10 steps 0.50, 0.52, 0.46, 0.38:
    the mean of the last three is 0.493 (above 0.45 + 0.02) at the third evaluation and 0.453 at the fourth, where
    it fires."""
    rows = [{"eval/task_success": 0.45}]
    for i in range(40):
        rows.append({"reward": 0.0 if i < 20 else 0.5, "entropy": 0.5})
        if i % 10 == 9:
            rows.append({"eval/task_success": [0.50, 0.52, 0.46, 0.38][i // 10]})
    assert only("reward_overoptimised", replay(rows)) == [(len(rows), "reward_overoptimised", WARNING)]
    rows[-1] = {"eval/task_success": 0.9}  # the last evaluation recovers: 0.627 on average, rising
    assert only("reward_overoptimised", replay(rows)) == []


def test_value_updates_clipped_on_the_median_of_five():
    assert replay(series("val/clipfrac_avg", [0.0] * 3 + [0.2] * 3)) == [(6, "value_updates_clipped", WARNING)]
    assert replay(series("val/clipfrac_avg", [0.0, 0.0, 0.3] * 7)) == []  # at most 2 of any 5 are high: median 0
    assert replay(series("val/clipfrac_avg", [0.1] * 20)) == []


def _values(moves, returns_var=4.0, approxkl=1e-3):
    """PPO rows whose value predictions moved by `moves[k]` (val/vpred - val/mean) in update k."""
    return [
        {"val/vpred": 0.5 + m, "val/mean": 0.5, "returns/var": returns_var, "policy/approxkl_avg": approxkl}
        for m in moves
    ]


def test_value_not_learning_when_the_value_predictions_do_not_move():
    """A frozen value model: val/vpred equals val/mean to float rounding (2e-6 over a returns' spread of 2 is 1e-6,
    below 4e-6) while the policy moves: fires at the first full window of 5."""
    assert replay(_values([2e-6] * 8)) == [(5, "value_not_learning", WARNING)]
    (f,) = findings(_values([0.0] * 5))
    assert f.metrics == {"val/vpred": 0.5, "val/mean": 0.5} and "0 of the returns' spread" in f.message
    # It starts when the freeze does: three moving updates then frozen ones, the median turns at the 8th.
    assert replay(_values([0.02] * 5 + [0.0] * 5)) == [(8, "value_not_learning", WARNING)]
    # The nearest healthy run moved 1.5e-5 of the spread (3e-5 here): quiet; so are two still updates out of five.
    assert replay(_values([3e-5] * 20)) == []
    assert replay(_values([0.0, 0.0, 0.01, 0.01, 0.01] * 4)) == []


def test_value_not_learning_is_silent_when_nothing_could_move():
    # One optimizer step per update: the policy's approxkl is float rounding too, so there is nothing to tell.
    assert replay(_values([0.0] * 20, approxkl=1e-14)) == []
    # Returns without variance: no scale to hold the movement against; without val/vpred there is no telling.
    assert replay(_values([0.0] * 20, returns_var=0.0)) == []
    assert replay([{k: v for k, v in row.items() if k != "val/vpred"} for row in _values([0.0] * 20)]) == []


def test_value_loss_critical_at_once_needs_100x_the_first_and_an_absolute_floor():
    # A PPO run at learning rate 0.5: 1.31 at the first update, 1518 at the second.
    assert replay(series("loss/value_avg", [1.31, 1518.0])) == [(2, "value_loss_spike", CRITICAL)]
    # A tiny first value loss: 100x of 3e-4 is 0.03, but a value loss under 1.0 is not a crisis.
    assert replay(series("loss/value_avg", [3e-4, 0.08])) == []
    (f,) = findings(series("loss/value_avg", [0.02, 2.5]))
    assert f.severity == CRITICAL and f.thresholds == {"loss/value_avg": 2.0}


def test_updates_too_large_single_approxkl_is_critical_at_once():
    # A PPO run at learning rate 0.5: approxkl 449 at the first update; the clip fraction plays no part.
    assert replay([{"policy/approxkl_avg": 449.0, "policy/clipfrac_avg": 0.0}]) == [(1, "updates_too_large", CRITICAL)]
    assert replay([{"policy/approxkl_avg": 0.9, "policy/clipfrac_avg": 0.0}] * 10) == []


ZERO_KL = {"objective/kl": 0.0, "tokens/responses_len_mean": 6.0}  # step 1: the policy is the reference


@pytest.mark.parametrize(
    "rows, expected",
    [
        # GRPO: kl is per token. One observation of 2.5 is critical at once.
        (series("kl", [0.0, 0.01, 2.5]), [(3, "kl_far_from_reference", CRITICAL)]),
        # PPO: objective/kl per sequence / tokens/responses_len_mean: 55.3 / 6 = 9.2 nats/token (a PPO run at learning rate 0.5).
        (
            [
                {"objective/kl": 0.0, "tokens/responses_len_mean": 6.0},
                {"objective/kl": 55.3, "tokens/responses_len_mean": 6.0},
            ],
            [(2, "kl_far_from_reference", CRITICAL)],
        ),
        # 11 nats over 6 tokens = 1.83/token: not critical; 20 of them are a median above 0.5 -> a warning at the 20th.
        (
            [ZERO_KL] + [{"objective/kl": 11.0, "tokens/responses_len_mean": 6.0}] * 19,
            [(20, "kl_far_from_reference", WARNING)],
        ),
        # 2.9 nats over 6 tokens = 0.48/token, held: below the level.
        ([ZERO_KL] + [{"objective/kl": 2.9, "tokens/responses_len_mean": 6.0}] * 39, []),
        # Without the completion length PPO's KL has no per-token level.
        (series("objective/kl", [55.3] * 30), []),
    ],
)
def test_kl_far_from_reference(rows, expected):
    assert only("kl_far_from_reference", replay(rows)) == expected


def test_kl_at_step_one_means_the_reference_is_not_the_starting_policy():
    assert replay(series("kl", [0.03, 0.03])) == [(1, "kl_far_from_reference", WARNING)]
    assert replay(series("kl", [0.0, 0.03])) == []  # later KL is training's
    (f,) = findings(series("kl", [0.03]))
    assert "before any update" in f.message and f.thresholds == {"kl": pytest.approx(0.01)}
    # A stream that starts later (a resumed run, or a TRL run logging every 10 steps) has no step-1 observation.
    monitor = HealthMonitor()
    assert monitor.observe(10, {"kl": 0.03}) == []


def test_logprob_mismatch_at_once():
    name = "sampling/sampling_logp_difference/mean"
    assert replay(series(name, [0.001, 0.06])) == [(2, "logprob_mismatch", WARNING)]
    assert replay(series(name, [0.6])) == [(1, "logprob_mismatch", CRITICAL)]
    assert replay(series(name, [0.049] * 10)) == []


def _async_rows(kls, masked=None, staleness=4.0):
    """Rows of an async_generation run: the mismatch KL per step, the masked share (0 unless given), the age."""
    masked = masked or [0.0] * len(kls)
    return [
        {"off_policy/mismatch_kl": k, "off_policy/masked_frac": m, "sample/staleness_mean": staleness, "reward": 1.0}
        for k, m in zip(kls, masked)
    ]


def test_off_policy_mismatch_on_the_median_of_five():
    # The labelled stale_offpolicy run's shape: about 0.05 at max_staleness 4, then 0.19, 0.5, 0.57, 0.88 after the
    # learning rate rises: the median of the last five reaches 0.2 at the 4th high value (step 8 here).
    kls = [0.05, 0.03, 0.07, 0.02, 0.19, 0.5, 0.57, 0.88, 0.63, 0.55]
    assert replay(_async_rows(kls)) == [(8, "off_policy_mismatch", WARNING)]
    (f,) = findings(_async_rows(kls))
    assert f.metrics == {"off_policy/mismatch_kl": 0.5} and f.thresholds == {"off_policy/mismatch_kl": 0.2}
    assert "batches 4 updates old" in f.message and "max_staleness" in f.advice
    # Healthy max_staleness 1 and 4 runs of the built-in task stay below 0.02 and 0.13: quiet, even with single
    # values above the level's threshold.
    assert replay(_async_rows([0.01, 0.016, 0.005] * 10, staleness=1.0)) == []
    assert replay(_async_rows([0.05, 0.127, 0.1, 0.25, 0.03] * 6)) == []


def test_off_policy_mismatch_on_the_masked_share_and_critical_at_once():
    masked = [0.02, 0.05, 0.08, 0.15, 0.3, 0.2]  # the median of the last five: 0.08 at the 5th, 0.15 at the 6th
    assert replay(_async_rows([0.01] * 6, masked)) == [(6, "off_policy_mismatch", WARNING)]
    (f,) = findings(_async_rows([0.01] * 6, masked))
    assert f.metrics == {"off_policy/masked_frac": 0.15} and "15% of the tokens" in f.message
    assert replay(_async_rows([0.01] * 20, [0.09] * 20)) == []
    # A KL of a nat per token needs no window; the first steps of a run (no masked share yet) are read too.
    assert replay(series("off_policy/mismatch_kl", [1e-7, 1.0])) == [(2, "off_policy_mismatch", CRITICAL)]
    assert replay(series("off_policy/mismatch_kl", [0.99])) == []
    # A synchronous run logs none of these metrics: the rule never evaluates.
    monitor = HealthMonitor()
    monitor.observe(1, {"reward": 1.0, "kl": 0.01})
    assert "off_policy_mismatch" not in monitor.firing()


@pytest.mark.parametrize("name", ["objective/scores_std", "reward_std"])
def test_reward_scale_jump_against_the_previous_ten(name):
    stream = series(name, [0.5, 0.7] * 5 + [60.0])  # median 0.6: 60 is exactly 100x
    assert replay(stream) == [(11, "reward_scale_jump", CRITICAL)]
    assert replay(series(name, [0.5, 0.7] * 5 + [59.0])) == []
    assert replay(series(name, [0.5] * 9 + [500.0])) == []  # 9 previous observations: too few


def test_reward_collapse_in_spreads_below_its_level_before():
    """GRPO: reward 1.0 for 10 steps, then 0.35, with reward_std 0.8 throughout: the median of the last 5 falls to
    0.35, 0.65 below its median before (1.0), more than 0.75 spreads (0.6) and 3 noise units (one successive
    difference of 0.65 in 14: 0.078 a unit) -> fires at the 13th step (3 of the last 5)."""
    rows = [{"reward": r, "reward_std": 0.8} for r in [1.0] * 10 + [0.35] * 5]
    assert replay(rows) == [(13, "reward_collapse", WARNING)]
    assert replay([{"reward": r, "reward_std": 0.8} for r in [1.0] * 10 + [0.5] * 5]) == []  # 0.5 spreads


def test_a_flat_noisy_reward_is_no_collapse():
    """A reward that only wobbles (Gaussian noise of sd 0.4 around -0.26, within-group std 0.8, 400 steps, as a real
    Wordle run logged): its dips below the best level are noise, and the rule stays quiet."""
    rng = random.Random(0)
    rows = [{"reward": -0.26 + rng.gauss(0, 0.4), "reward_std": 0.8} for _ in range(400)]
    assert only("reward_collapse", replay(rows)) == []


def test_entropy_rising_warns_and_is_critical_when_the_reward_falls():
    """GRPO entropy 0.5 for 20 steps, then 6.0 (the policy going random). With a reward that holds at 0.9/1.0: a
    warning once the median of the last 5 entropies is 6 (the 23rd). With a reward that drops to 0 at the same
    step: critical at the 23rd (the reward's median of 5 is 0, far below its median 0.95 before)."""
    entropy = [0.5] * 20 + [6.0] * 10
    held = [{"entropy": e, "reward": 0.9 + 0.1 * (i % 2)} for i, e in enumerate(entropy)]
    assert only("entropy_rising", replay(held)) == [(23, "entropy_rising", WARNING)]
    rewards = [0.9 + 0.1 * (i % 2) for i in range(20)] + [0.0] * 10
    falling = [{"entropy": e, "reward": r} for e, r in zip(entropy, rewards)]
    assert only("entropy_rising", replay(falling)) == [(23, "entropy_rising", CRITICAL)]
    ppo = [{"policy/entropy_avg": e, "objective/scores": r} for e, r in zip(entropy, rewards)]
    assert only("entropy_rising", replay(ppo)) == [(23, "entropy_rising", CRITICAL)]
    # Not a rise of a sequence's entropy (it grows with the length), and not a rise under twice the start.
    assert replay(series("objective/entropy", [0.5] * 20 + [6.0] * 10)) == []
    assert only("entropy_rising", replay(series("entropy", [0.5] * 20 + [0.95] * 10))) == []


def test_kl_not_measured_is_said_once_as_info():
    found = findings(series("kl", [0.0] * 40))
    assert [(f.step, f.rule, f.severity) for f in found] == [(5, "kl_not_measured", INFO)]
    assert "beta = 0" in found[0].message
    assert replay(series("kl", [0.0] * 4 + [0.001] + [0.0] * 30)) == []  # measured, and near 0


def test_every_rule_is_exercised_by_this_file():
    source = Path(__file__).read_text()
    assert [r.name for r in RULES if f'"{r.name}"' not in source] == []


# --- streams: presence of metrics, gaps, GRPO --------------------------------------------------------


def test_windows_count_observations_not_rows():
    # 20 observations of objective/kl, each step also logging an evaluation in a row of its own (rows with eval/*
    # keys only): fires at the 20th observation.
    rows = []
    for step in range(1, 21):
        rows += [(step, {"objective/kl": -0.1}), (step, {"eval/task_success": 0.5}), (step, {"eval/scores": 0.1})]
    monitor = HealthMonitor()
    found = [(f.step, f.rule) for step, row in rows for f in monitor.observe(step, row)]
    assert found == [(20, "kl_negative")]


def test_windows_span_the_same_steps_whatever_the_logging_interval():
    """A run logging every 10 steps (each row the mean of 10 steps, as TRL's logging_steps) holds a tenth as many
    observations in each window: kl_negative's 20-step window is 2 rows, so it fires at step 20, as the run logging
    every step does."""
    every_step, every_10 = HealthMonitor(), HealthMonitor()
    first = [f.step for step in range(1, 41) for f in every_step.observe(step, {"objective/kl": -0.1})]
    tenth = [f.step for step in range(10, 401, 10) for f in every_10.observe(step, {"objective/kl": -0.1})]
    assert first == [20] and tenth == [20]
    assert every_10.history.interval == 10 and every_10.windowed.kl_window == 2
    assert every_10.windowed.smooth_window == 1 and Thresholds().for_interval(1) == Thresholds()


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


# --- agents: episodes with tools -----------------------------------------------------------------


def test_tools_never_called_needs_no_calls_from_the_start_through_the_last_ten():
    assert replay(series("tools/call_frequency", [0.0] * 10)) == [(10, "tools_never_called", WARNING)]
    assert replay(series("tools/call_frequency", [0.0] * 9)) == []  # too few observations yet
    # A single step with calls among the last ten, or calls at the start, is tool use.
    assert replay(series("tools/call_frequency", [0.0] * 9 + [0.1] + [0.0] * 9)) == []
    assert only("tools_never_called", replay(series("tools/call_frequency", [0.5] + [0.0] * 30))) == []
    (f,) = findings(series("tools/call_frequency", [0.01] * 10))
    assert "offered tools for 10 steps" in f.message and "response_template" in f.advice
    # Episodes that end on a call the turn cap left unanswered did call (TRL counts only the calls it runs).
    capped = [{"tools/call_frequency": 0.0, "tools/turn_cap_ratio": 0.9}] * 10
    assert only("tools_never_called", replay(capped)) == []


def test_tool_failures_on_all_calls_or_one_tool():
    stream = series("tools/failure_frequency", [0.6] * 5)
    assert replay(stream) == [(5, "tool_failures", WARNING)]
    assert replay(series("tools/failure_frequency", [0.45] * 20)) == []
    # One tool failing most of its calls while the overall share stays low (the other tool is called more).
    rows = [{"tools/failure_frequency": 0.2, "tools/search/failure_frequency": 0.8, "tools/add/failure_frequency": 0}]
    (f,) = findings(rows * 5)
    assert f.rule == "tool_failures" and f.metrics == {"tools/search/failure_frequency": 0.8}
    assert "tools/search/failure_frequency = 80%" in f.message


def test_turn_cap_reached_from_half_of_the_episodes():
    assert replay(series("tools/turn_cap_ratio", [0.5] * 5)) == [(5, "turn_cap_reached", WARNING)]
    assert replay(series("tools/turn_cap_ratio", [0.4] * 20)) == []


def test_tool_use_abandoned_when_calls_fall_to_a_quarter_while_the_reward_holds():
    def rows(calls_after, reward_after):
        before = [{"tools/call_frequency": 0.8, "reward": 0.3}] * 5
        return before + [{"tools/call_frequency": calls_after, "reward": reward_after}] * 5

    # Calls 0.8 -> 0.1 (<= 0.25 x 0.8) with the reward 0.3 -> 0.9, medians of the first and last five: flagged at
    # step 10, once the two levels share no observation.
    assert only("tool_use_abandoned", replay(rows(0.1, 0.9))) == [(10, "tool_use_abandoned", WARNING)]
    assert only("tool_use_abandoned", replay(rows(0.3, 0.9))) == []  # 0.3 > 0.2: still using the tools
    assert only("tool_use_abandoned", replay(rows(0.1, 0.1))) == []  # the reward fell too: not earned without tools
    # A run that never used the tools much is the other rule's case.
    low = [{"tools/call_frequency": 0.1, "reward": 0.3}] * 5 + [{"tools/call_frequency": 0.0, "reward": 0.9}] * 5
    assert only("tool_use_abandoned", replay(low)) == []
    (f,) = findings(rows(0.1, 0.9))
    assert "fell from 0.8 to 0.1" in f.message and "reward rose from 0.3 to 0.9" in f.message


def test_a_solved_task_makes_a_deterministic_policy_and_groups_without_spread_info_not_a_warning():
    # The agent task's healthy runs: once the policy calls the tool on every prompt, it is right nearly every time,
    # its entropy collapses and most groups have no spread. That is convergence, as the checker says.
    def rows(success):
        start = [{"entropy": 0.5, "frac_reward_zero_std": 0.2, "rollout/task_success": 0.4}] * 5
        return start + [{"entropy": 0.02, "frac_reward_zero_std": 0.9, "rollout/task_success": success}] * 5

    converged = findings(rows(0.97))
    assert {(f.rule, f.severity) for f in converged} == {("entropy_collapse", INFO), ("reward_zero_std", INFO)}
    assert all("the task looks solved" in f.message for f in converged)
    # Below solved_success the same stream warns (critical: a single entropy below 5% of the first).
    assert {(f.rule, f.severity) for f in findings(rows(0.6))} >= {
        ("entropy_collapse", CRITICAL),
        ("reward_zero_std", WARNING),
    }
    # Once solved, a later dip of success keeps them info (a fall of success is reward_collapse's to report); a task
    # without a checker keeps its warnings.
    dipped = rows(0.97) + [{"entropy": 0.02, "frac_reward_zero_std": 0.9, "rollout/task_success": 0.7}]
    assert all(f.severity == INFO for f in findings(dipped) if f.rule in ("entropy_collapse", "reward_zero_std"))
    unchecked = [{k: v for k, v in r.items() if k != "rollout/task_success"} for r in rows(0.97)]
    assert {f.severity for f in findings(unchecked)} >= {CRITICAL, WARNING}


def test_rules_are_well_formed():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    for rule in RULES:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", rule.name), rule.name
        assert rule.severities and set(rule.severities) <= set(SEVERITIES), rule.name
        assert rule.advice.strip() and rule.condition.strip(), rule.name


def test_rules_read_only_metric_names_that_trainers_log():
    known = {m.name for trainer in TRAINERS for m in metrics_for(trainer, None)}
    assert [m for rule in RULES for m in rule.metrics if m not in known] == []
