"""docs/health.md shows every rule with its numbers (tests/test_docs.py keeps it fresh), and every threshold is used
by a rule's condition and documented."""

from dataclasses import fields

from bench.health.docs import placeholders, render_markdown
from rlhfkit.health import RULES, Thresholds


def test_docs_show_each_rule_with_its_default_numbers():
    text = render_markdown()
    for rule in RULES:
        assert f"### `{rule.name}`" in text and rule.advice in text
    assert "`val/ratio` at or outside 0.5 or 2 (warning), at or outside 0.1 or 10 (critical)" in text
    assert "| `value_loss_spike_factor` | 5 |" in text


def test_every_threshold_is_used_and_documented():
    used = {name for rule in RULES for name in placeholders(rule.condition)}
    used.add("quiet_observations")  # the monitor's, documented in "How it works"
    assert {f.name for f in fields(Thresholds)} == used
    assert all(f.metadata["help"].strip() for f in fields(Thresholds))
