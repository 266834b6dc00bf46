"""ModelConfig's LoRA flags and peft's LoraConfig (rlhfkit/models/adapters.py): one mapping, read both ways."""

import pytest

from rlhfkit.config import ConfigError, ModelConfig
from rlhfkit.models.adapters import LORA_FLAGS, lora_config, lora_flags

peft = pytest.importorskip("peft")


def test_the_flags_come_back_from_their_lora_config():
    model = ModelConfig(
        use_peft=True,
        lora_r=4,
        lora_alpha=8,
        lora_dropout=0.1,
        lora_target_modules=["q_proj", "v_proj"],
        lora_modules_to_save=["lm_head"],
        use_rslora=True,
        use_dora=True,
    )
    config = model.lora_config()
    assert isinstance(config, peft.LoraConfig) and config.task_type == "CAUSAL_LM"
    flags = lora_flags(config)
    assert flags == {"use_peft": True, **{flag: getattr(model, flag) for flag in LORA_FLAGS.values()}}


def test_all_linear_is_peft_s_shorthand_both_ways():
    config = ModelConfig(use_peft=True, lora_target_modules=["all-linear"]).lora_config()
    assert config.target_modules == "all-linear"
    assert lora_flags(config)["lora_target_modules"] == ["all-linear"]


def test_other_fields_replace_the_flags_values():
    flags = {flag: getattr(ModelConfig(lora_dropout=0.1), flag) for flag in LORA_FLAGS.values()}
    config = lora_config("SEQ_CLS", flags, lora_dropout=0.0, revision="v1")
    assert (config.task_type, config.lora_dropout, config.revision) == ("SEQ_CLS", 0.0, "v1")
    assert ModelConfig().lora_config() is None  # without --use_peft


def test_a_lora_config_setting_no_flag_carries_is_refused():
    with pytest.raises(ConfigError, match="peft_config sets bias, which rlhfkit's LoRA does not take"):
        lora_flags(peft.LoraConfig(bias="all"))
    with pytest.raises(ConfigError, match="LoRA adapters only"):
        lora_flags(peft.PrefixTuningConfig(num_virtual_tokens=2))
