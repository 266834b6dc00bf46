"""docs/health.md is generated from the rules and kept fresh; rules are consistent with the metric names."""

import ast
import os
import re
import string
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from rlhfkit.health import RULES, SEVERITIES, Thresholds, render_markdown
from rlhfkit.health import rules as rules_module
from rlhfkit.metrics.registry import metrics_for

ROOT = Path(__file__).resolve().parents[2]

# GRPO metric names of the reference docs (seed 004), verbatim; the registry declares them with the GRPO trainer.
SEED_GRPO_NAMES = {
    "num_tokens",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "clip_ratio",
    "clip_ratio/low_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_mean",
    "clip_ratio/high_max",
    "clip_ratio/region_mean",
    "eps",
    "episode",
    "lr",
    "loss",
}


def test_docs_health_md_is_fresh():
    path = ROOT / "docs" / "health.md"
    assert path.read_text(encoding="utf-8") == render_markdown(), (
        "docs/health.md is stale: run `python -m rlhfkit.health > docs/health.md`"
    )


def test_module_entry_point_prints_the_markdown():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "rlhfkit.health"], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout == render_markdown()


def test_docs_show_each_rule_with_its_default_numbers():
    text = render_markdown()
    for rule in RULES:
        assert f"### `{rule.name}`" in text and rule.advice in text
    assert "`val/ratio` outside [0.5, 2] (warning) or outside [0.1, 10] (critical)" in text
    assert "| `value_loss_spike_factor` | 5 |" in text


def test_rules_are_well_formed():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    for rule in RULES:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", rule.name), rule.name
        assert rule.severities and set(rule.severities) <= set(SEVERITIES), rule.name
        assert rule.advice.strip() and rule.condition.strip(), rule.name


def test_rules_read_only_metric_names_that_trainers_log():
    known = {m.name for m in metrics_for("ppo", None)} | SEED_GRPO_NAMES
    assert [m for rule in RULES for m in rule.metrics if m not in known] == []


def test_every_threshold_is_used_and_documented():
    used = {name for rule in RULES for _, name, _, _ in string.Formatter().parse(rule.condition) if name}
    used.add("quiet_observations")  # the monitor's, documented in "How it works"
    assert {f.name for f in fields(Thresholds)} == used
    assert all(f.metadata["help"].strip() for f in fields(Thresholds))


def test_rules_module_imports_only_the_standard_library():
    tree = ast.parse(Path(rules_module.__file__).read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m.split(".")[0] for m in modules} <= set(sys.stdlib_module_names) | {"__future__"}
