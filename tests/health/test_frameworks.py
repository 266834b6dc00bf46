"""frameworks.py: each framework's table maps onto names the rules read and is detected from a few of its keys;
renaming never overwrites a name the run already logs; rlhfkit's and TRL's runs are left alone; the docs page is the
table's rendering."""

import math
from pathlib import Path

import pytest

from rlhfkit.health import rules as R
from rlhfkit.health.frameworks import FRAMEWORKS, OPENRLHF, VERL, detect, map_names, render_markdown, spellings

ROOT = Path(__file__).resolve().parents[2]

# Every name a rule reads: its declared metrics, and the completion lengths that put entropy and KL per completion.
READ_BY_RULES = {m for rule in R.RULES for m in rule.metrics} | {R.RESPONSE_LENGTH}
READ_BY_RULES |= {length for _, length in R.TOKEN_ENTROPIES}

# A few keys of one step of each framework, as its source logs them (the values are made up).
SAMPLES = {
    "verl": {"critic/score/mean": 0.4, "actor/entropy": 0.5, "actor/reward_kl_penalty": 0.01, "actor/ppo_kl": 1e-4},
    "OpenRLHF": {"reward": 0.4, "kl": 0.01, "response_length": 200.0, "ppo_clip_ratio": 0.02, "entropy_loss": 0.6},
    "prime-rl": {"reward/mean": 0.4, "seq_len/mean": 900.0, "completion_len/mean": 700.0, "is_truncated/mean": 0.1},
    "NeMo-RL": {"train/reward": 0.4, "train/kl_penalty": 0.01, "train/approx_entropy": 0.5, "train/probs_ratio": 1.0},
    "SkyRL": {"reward/avg_raw_reward": 0.4, "policy/policy_entropy": 0.5, "policy/policy_kl": 0.01},
}
TRL_GRPO = {"reward": 0.4, "reward_std": 0.2, "kl": 0.01, "entropy": 0.5, "completions/mean_length": 200.0}
TRL_PPO = {"objective/scores": 0.4, "objective/kl": 3.0, "policy/approxkl_avg": 1e-3, "val/ratio": 1.0}


def test_every_table_maps_onto_names_the_rules_read_each_key_once():
    for framework in FRAMEWORKS:
        keys = [name.key for name in framework.names]
        assert len(keys) == len(set(keys)), framework.name
        assert {name.rule for name in framework.names} <= READ_BY_RULES, framework.name
        assert all(name.source and not name.source.startswith("/") for name in framework.names), framework.name


def test_prime_rl_has_no_kl_to_a_reference():
    prime = next(f for f in FRAMEWORKS if f.name == "prime-rl")
    assert "kl" not in {name.rule for name in prime.names} and "No KL to a reference" in prime.note


@pytest.mark.parametrize("framework", sorted(SAMPLES))
def test_each_framework_is_detected_from_a_few_of_its_keys(framework):
    rows = [{"step": step, **SAMPLES[framework]} for step in (1, 2)]
    renamed, sources, found = map_names(rows)
    assert found == framework
    assert sources and all(renamed[0][rule] == rows[0][key] for rule, key in sources.items())
    assert all(key not in renamed[0] for key in sources.values())


def test_the_samples_rename_to_the_expected_names():
    expected = {
        "verl": {"reward": "critic/score/mean", "entropy": "actor/entropy", "kl": "actor/reward_kl_penalty"},
        "OpenRLHF": {"completions/mean_length": "response_length", "policy/clipfrac_avg": "ppo_clip_ratio"},
        "prime-rl": {"reward": "reward/mean", "completions/clipped_ratio": "is_truncated/mean"},
        "NeMo-RL": {"reward": "train/reward", "kl": "train/kl_penalty", "val/ratio": "train/probs_ratio"},
        "SkyRL": {"reward": "reward/avg_raw_reward", "entropy": "policy/policy_entropy", "kl": "policy/policy_kl"},
    }
    for framework, names in expected.items():
        _, sources, _ = map_names([{"step": 1, **SAMPLES[framework]}])
        assert names.items() <= sources.items(), framework
    assert "policy/approxkl_avg" in map_names([{"step": 1, **SAMPLES["verl"]}])[1]
    assert "entropy" in map_names([{"step": 1, **SAMPLES["OpenRLHF"]}])[1]


def test_rlhfkit_and_trl_runs_are_left_alone():
    for row in (TRL_GRPO, TRL_PPO, {"loss": 0.1, "learning_rate": 1e-6}):
        rows = [{"step": 1, **row}]
        assert map_names(rows) == (rows, {}, None)
    assert map_names([]) == ([], {}, None)
    # A stray framework key in a TRL run does not make it that framework's.
    assert map_names([{"step": 1, **TRL_GRPO, "values": 0.3}])[2] is None


def test_a_name_the_run_already_logs_is_never_overwritten():
    rows = [{"step": 1, "critic/score/mean": 0.4, "reward": 9.0, "actor/entropy": 0.5, "actor/ppo_kl": 1e-4}]
    renamed, sources, framework = map_names(rows)
    assert framework == "verl" and "reward" not in sources
    assert renamed == [
        {"step": 1, "critic/score/mean": 0.4, "reward": 9.0, "entropy": 0.5, "policy/approxkl_avg": 1e-4}
    ]
    # Logged in one row only, the name is the run's own: no other row gets it from the framework's key either.
    rows = [{"step": 1, "actor/entropy": 0.5, "entropy": 0.7}, {"step": 2, "actor/entropy": 0.4, "actor/ppo_kl": 0.1}]
    renamed, sources, _ = map_names(rows)
    assert "entropy" not in sources and renamed[1] == {"step": 2, "actor/entropy": 0.4, "policy/approxkl_avg": 0.1}


def test_of_two_keys_for_one_name_the_first_in_the_table_wins():
    row = {"step": 1, "actor/reward_kl_penalty": 0.02, "actor/kl_loss": 0.0, "critic/score/mean": 0.4}
    renamed, sources, _ = map_names([row])
    assert sources["kl"] == "actor/reward_kl_penalty" and renamed[0]["kl"] == 0.02
    assert renamed[0]["actor/kl_loss"] == 0.0  # kept under its own key


def test_renaming_keeps_the_values_nan_included_and_the_other_keys():
    rows = [{"step": 7, "critic/vf_loss": math.nan, "actor/pg_clipfrac": 0.1, "timing/gen": 3.0}]
    renamed, _, framework = map_names(rows)
    assert framework == "verl" and math.isnan(renamed[0]["loss/value_avg"])
    assert renamed[0]["policy/clipfrac_avg"] == 0.1 and renamed[0]["timing/gen"] == 3.0 and renamed[0]["step"] == 7
    assert list(renamed[0]) == ["step", "loss/value_avg", "policy/clipfrac_avg", "timing/gen"]  # order kept
    assert "critic/vf_loss" in rows[0]  # the input is not modified


def test_tracker_prefixes_are_recognised_with_and_without():
    assert spellings(OPENRLHF, "kl") == ("kl", "train/kl")
    assert spellings(VERL, "critic/kl") == ("critic/kl",)
    prime = next(f for f in FRAMEWORKS if f.name == "prime-rl")
    assert spellings(prime, "train/agg/effective/reward/mean") == (
        "agg/effective/reward/mean",
        "train/agg/effective/reward/mean",
    )
    _, sources, framework = map_names(
        [{"step": 1, "train/reward": 0.4, "train/response_length": 80.0, "train/kl": 0.1}]
    )
    assert framework == "OpenRLHF" and sources["kl"] == "train/kl" and sources["reward"] == "train/reward"
    rows = [{"step": 1, "agg/effective/reward/mean": 0.3, "agg/effective/is_truncated/mean": 0.2}]
    expected = {"reward": "agg/effective/reward/mean", "completions/clipped_ratio": "agg/effective/is_truncated/mean"}
    assert map_names(rows)[1] == expected


def test_detect_takes_the_framework_knowing_most_keys():
    keys = {"critic/vf_clipfrac", "critic/score/mean"}  # critic/vf_clipfrac is NeMo-RL's too
    assert detect(keys) is VERL
    assert detect(set()) is None


def test_the_docs_page_is_the_tables_rendering():
    text = render_markdown()
    for framework in FRAMEWORKS:
        assert f"## {framework.name}" in text
        assert all(f"| `{name.key}` | `{name.rule}` |" in text for name in framework.names)
    assert (ROOT / "docs" / "doctor-frameworks.md").read_text(encoding="utf-8") == text, "run `make docs`"
