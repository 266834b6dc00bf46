"""HealthMonitor: one report per episode of trouble, escalation, re-arming, the logged health scalars."""

import json
import math

import pytest

from rlhfkit.health import CRITICAL, INFO, WARNING, Finding, HealthMonitor, Hit, Rule, Thresholds


def observe_all(monitor, values, name="val/ratio", start=1):
    """Observe one value per step; return {step: [rule, severity] of each new finding}."""
    out = {}
    for step, value in enumerate(values, start=start):
        for f in monitor.observe(step, {name: value}):
            out.setdefault(step, []).append((f.rule, f.severity))
    return out


def test_a_rule_that_keeps_firing_is_reported_once():
    monitor = HealthMonitor()
    reported = observe_all(monitor, [3.0] * 30)
    assert reported == {1: [("ratio_far_from_one", WARNING)]}
    assert monitor.summary_metrics() == {"health/warnings": 1, "health/critical": 0}


def test_reported_again_only_after_quiet_observations():
    # quiet_observations = 10: 9 quiet evaluations are not enough to close the episode, 10 are.
    monitor = HealthMonitor()
    reported = observe_all(monitor, [3.0] * 3 + [1.0] * 9 + [3.0] + [1.0] * 10 + [3.0])
    assert reported == {1: [("ratio_far_from_one", WARNING)], 24: [("ratio_far_from_one", WARNING)]}


def test_quiet_observations_is_configurable():
    monitor = HealthMonitor(Thresholds(quiet_observations=2))
    assert sorted(observe_all(monitor, [3.0, 1.0, 1.0, 3.0, 1.0, 3.0])) == [1, 4]


def test_escalation_is_reported_but_not_de_escalation_or_a_repeat():
    monitor = HealthMonitor()
    reported = observe_all(monitor, [3.0, 12.0, 3.0, 12.0, 3.0])
    assert reported == {1: [("ratio_far_from_one", WARNING)], 2: [("ratio_far_from_one", CRITICAL)]}
    # A critical episode opened directly is one report too.
    assert observe_all(HealthMonitor(), [12.0, 3.0, 12.0]) == {1: [("ratio_far_from_one", CRITICAL)]}


def test_summary_metrics_count_rules_firing_at_the_last_step():
    monitor = HealthMonitor()
    assert monitor.summary_metrics() == {"health/warnings": 0, "health/critical": 0}
    monitor.observe(1, {"val/ratio": 12.0, "loss/value_avg": float("nan")})
    # ratio (critical), value_loss_spike (critical: NaN) and nonfinite_metric (critical).
    assert monitor.summary_metrics() == {"health/warnings": 0, "health/critical": 3}
    monitor.observe(2, {"val/ratio": 3.0, "loss/value_avg": 0.2})
    assert monitor.summary_metrics() == {"health/warnings": 1, "health/critical": 0}
    assert monitor.firing() == {"ratio_far_from_one": WARNING}
    monitor.observe(3, {"eval/task_success": 0.5})  # a row without val/ratio keeps the ratio rule's state
    assert monitor.summary_metrics() == {"health/warnings": 1, "health/critical": 0}
    monitor.observe(4, {"val/ratio": 1.0})
    assert monitor.summary_metrics() == {"health/warnings": 0, "health/critical": 0}


def test_custom_rules_and_info_severity():
    def check(history, thresholds):
        lr = history.row.get("lr")
        return Hit(INFO, {"lr": lr}, f"lr = {lr}") if lr is not None and lr > 1e-3 else None

    rule = Rule("lr_large", ("lr",), (INFO,), "`lr` above 0.001", "Check the schedule.", check)
    monitor = HealthMonitor(rules=[rule])
    (f,) = monitor.observe(7, {"lr": 0.01, "val/ratio": 50.0})  # val/ratio: no built-in rules here
    assert f == Finding(7, "lr_large", INFO, {"lr": 0.01}, "lr = 0.01", "Check the schedule.")
    assert monitor.summary_metrics() == {"health/warnings": 0, "health/critical": 0}  # info is not counted
    with pytest.raises(ValueError, match="unique"):
        HealthMonitor(rules=[rule, rule])


def test_finding_json_record():
    f = Finding(12, "ratio_far_from_one", WARNING, {"val/ratio": 2.5}, "val/ratio = 2.5", "Lower learning_rate.")
    record = json.loads(json.dumps(f.to_dict()))
    assert record == {
        "step": 12,
        "rule": "ratio_far_from_one",
        "severity": WARNING,
        "metrics": {"val/ratio": 2.5},
        "message": "val/ratio = 2.5",
        "advice": "Lower learning_rate.",
        "thresholds": {},
    }
    nan = json.loads(json.dumps(Finding(1, "r", CRITICAL, {"x": math.nan}, "m", "a").to_dict()))
    assert math.isnan(nan["metrics"]["x"])


def test_finding_carries_the_rules_advice_and_the_numbers():
    (f,) = HealthMonitor().observe(5, {"val/ratio": 0.3})
    assert f.metrics == {"val/ratio": 0.3}
    assert f.message == "val/ratio = 0.3, not inside (0.5, 2)."
    assert f.thresholds == {"val/ratio": 0.5}
    assert "learning_rate" in f.advice and "num_ppo_epochs" in f.advice
