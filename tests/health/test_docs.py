"""docs/health.md shows every rule with its numbers (tests/test_docs.py keeps it fresh); rules read registered metrics."""

import re
from dataclasses import fields

from rlhfkit.health import RULES, SEVERITIES, Thresholds, render_markdown
from rlhfkit.health.docs import placeholders
from rlhfkit.metrics.registry import TRAINERS, metrics_for


def test_docs_show_each_rule_with_its_default_numbers():
    text = render_markdown()
    for rule in RULES:
        assert f"### `{rule.name}`" in text and rule.advice in text
    assert "`val/ratio` at or outside 0.5 or 2 (warning), at or outside 0.1 or 10 (critical)" in text
    assert "| `value_loss_spike_factor` | 5 |" in text


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


def test_every_threshold_is_used_and_documented():
    used = {name for rule in RULES for name in placeholders(rule.condition)}
    used.add("quiet_observations")  # the monitor's, documented in "How it works"
    assert {f.name for f in fields(Thresholds)} == used
    assert all(f.metadata["help"].strip() for f in fields(Thresholds))
