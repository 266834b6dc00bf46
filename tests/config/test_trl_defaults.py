"""docs/migrating-from-trl.md's table of the defaults that differ from TRL's is regenerated from the live classes
(rlhfkit's configs; TRL 1.16's installed GRPOConfig; TRL 1.12's recorded PPOConfig defaults), and each row says why."""

from pathlib import Path

import trl

from rlhfkit.config import trl_defaults
from rlhfkit.docs import PAGES, expected

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_in_the_page_is_the_live_comparison():
    page = next(p for p in PAGES if p.section == "trl-defaults")
    text = (ROOT / page.path).read_text(encoding="utf-8")
    assert expected(page, text) == text, "docs/migrating-from-trl.md is stale: run `make docs`"
    assert trl_defaults.render_table() in text


def test_every_differing_default_says_why_and_no_reason_is_stale():
    differing = {(command, name) for command, name, _, _ in trl_defaults.differing_defaults()}
    assert differing == set(trl_defaults.WHY)
    assert "| ? |" not in trl_defaults.render_table()


def test_the_comparison_is_against_trls_classes():
    assert trl.__version__.startswith("1.16.")  # GRPO's column is TRL 1.16's
    rows = {(c, n): (theirs, ours) for c, n, theirs, ours in trl_defaults.differing_defaults()}
    assert rows["ppo", "gradient_checkpointing"] == (True, False)  # TRL 1.12's _BaseConfig
    assert rows["grpo", "max_completion_length"] == (512, 256)  # trl.GRPOConfig, installed
    assert rows["ppo", "per_device_train_batch_size"] == (8, 64)  # transformers' TrainingArguments
    assert ("ppo", "kl_coef") not in rows and trl_defaults.trl_defaults("ppo")["kl_coef"] == 0.05  # same default


def test_a_new_difference_shows_up_without_a_reason(monkeypatch):
    monkeypatch.setitem(trl_defaults.TRL_1_12_PPO_DEFAULTS, "kl_coef", 0.1)
    assert ("ppo", "kl_coef", 0.1, 0.05) in trl_defaults.differing_defaults()
    assert "| ppo | `kl_coef` | `0.1` (TRL 1.12) | `0.05` | ? |" in trl_defaults.render_table()
