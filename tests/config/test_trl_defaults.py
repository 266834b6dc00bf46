"""docs/migrating-from-trl.md's table of the defaults that differ from TRL's is regenerated from the live classes
(rlhfkit's configs; TRL 1.16's installed GRPOConfig; TRL 1.12's recorded PPOConfig defaults), and each row says why;
the TRL 1.16 defaults rlhfkit records for run time (config/trl_recorded.py) are the installed TRL's."""

import dataclasses
from pathlib import Path

import trl

from docs import trl_defaults
from docs.generate import PAGES, expected
from rlhfkit.config import trl_recorded

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


def _installed_defaults(cls) -> dict:
    return {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(cls)
        if f.init
    }


def _typed(table: dict) -> dict:
    return {name: (type(value), value) for name, value in table.items()}  # 1 is not 1.0, nor False 0


def test_the_recorded_trl_1_16_defaults_are_the_installed_trls():
    """rlhfkit judges a TRL field's default without importing TRL (config/trl_recorded.py): the recorded GRPOConfig
    holds every field of the installed one that is its own or whose default is not TrainingArguments', with its
    default, and the script groups hold theirs."""
    from transformers import TrainingArguments
    from trl import ModelConfig
    from trl.scripts.grpo import GRPOScriptArguments
    from trl.scripts.utils import DatasetMixtureConfig

    base = _installed_defaults(TrainingArguments)
    installed = {
        name: value
        for name, value in _installed_defaults(trl.GRPOConfig).items()
        if name not in base or _typed({name: base[name]}) != _typed({name: value})
    }
    assert _typed(trl_recorded.TRL_1_16_GRPO_DEFAULTS) == _typed(installed)
    assert tuple(name for name in installed if name not in base) == trl_recorded.TRL_GRPO_CONFIG_FIELDS
    scripts = {}
    for cls in (GRPOScriptArguments, ModelConfig, DatasetMixtureConfig):
        scripts.update(_installed_defaults(cls))
    assert _typed(trl_recorded.TRL_SCRIPT_DEFAULTS) == _typed(scripts)


def test_every_trl_flag_has_a_recorded_or_transformers_default():
    for command in ("ppo", "grpo"):
        for name in trl_recorded.TRL_FLAGS[command]:
            assert name in trl_recorded.TRL_DEFAULTS[command] or name in trl_recorded.TRL_SCRIPT_DEFAULTS, name
    assert set(trl_recorded.TRL_1_12_PPO_DEFAULTS) <= set(trl_recorded.TRL_PPO_FLAGS) | {
        "logging_steps", "gradient_checkpointing", "bf16", "lr_scheduler_kwargs", "learning_rate"  # _BaseConfig's
    }  # fmt: skip
