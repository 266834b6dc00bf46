"""TRL's LoRA flags and peft's ``LoraConfig``, both ways, from one mapping.

The flags are those of TRL's ``ModelConfig`` (config/script.py): ``--use_peft`` and the ``--lora_*`` settings.
:func:`lora_config` builds peft's LoraConfig from them (``ModelConfig.lora_config()``, a script's ``peft_config``;
``models.with_lora``, the adapter a trainer trains); :func:`lora_flags` reads them back from a LoraConfig a TRL script
gives a trainer as ``peft_config``. peft is imported only when one of them is called.
"""

from __future__ import annotations

from typing import Any

from rlhfkit.errors import ConfigError

# LoraConfig field -> the flag that carries it. The task type is not a setting of the flags' adapter but of its model
# (ModelConfig's lora_task_type for the policy, SEQ_CLS for PPO's value model): a peft_config's is not read.
LORA_FLAGS = {
    "r": "lora_r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "target_modules": "lora_target_modules",
    "modules_to_save": "lora_modules_to_save",
    "use_rslora": "use_rslora",
    "use_dora": "use_dora",
}
# LoraConfig fields that no flag carries and a peft_config may set anyway: they say what the adapter is for or where
# it was loaded from, not how it is built.
_NOT_SETTINGS = {"task_type", "peft_type", "base_model_name_or_path", "revision", "inference_mode", "auto_mapping"}


def lora_config(args, task_type: str, **fields: Any):
    """peft's LoraConfig of the LoRA flags of `args` (a ModelConfig, or a config holding its fields) for an adapter
    of `task_type`; `fields`: LoraConfig fields set otherwise (they replace the flags' values)."""
    LoraConfig = _lora_config_class("use_peft")
    values = {name: getattr(args, flag) for name, flag in LORA_FLAGS.items()}
    if values["target_modules"] == ["all-linear"]:
        values["target_modules"] = "all-linear"  # peft's shorthand is a string; a list holds module names
    return LoraConfig(task_type=task_type, **(values | fields))


def lora_flags(peft_config) -> dict[str, Any]:
    """The flags of a peft LoraConfig (a TRL trainer's ``peft_config``): use_peft and the lora_* values. A
    ConfigError for another PEFT method, or for a LoraConfig setting that no flag carries."""
    LoraConfig = _lora_config_class("peft_config")
    if not isinstance(peft_config, LoraConfig):
        raise ConfigError(
            f"peft_config is a {type(peft_config).__name__}: rlhfkit trains LoRA adapters only (its reference "
            "model is the policy with the adapter disabled). Pass a peft LoraConfig or use --use_peft."
        )
    default = LoraConfig()
    carried = set(LORA_FLAGS)
    other = sorted(
        name
        for name in vars(default)
        if name not in carried | _NOT_SETTINGS and getattr(peft_config, name, None) != getattr(default, name)
    )
    if other:
        raise ConfigError(
            f"peft_config sets {', '.join(other)}, which rlhfkit's LoRA does not take (it carries "
            f"{', '.join(sorted(carried))}). Leave them at peft's defaults, or use --use_peft with --lora_* flags."
        )
    values = {flag: getattr(peft_config, name) for name, flag in LORA_FLAGS.items()}
    targets = values["lora_target_modules"]
    if isinstance(targets, str):
        values["lora_target_modules"] = [targets]
    elif targets is not None:
        values["lora_target_modules"] = sorted(targets)
    if values["lora_modules_to_save"] is not None:
        values["lora_modules_to_save"] = list(values["lora_modules_to_save"])
    return {"use_peft": True, **values}


def _lora_config_class(needed_by: str) -> type:
    """peft's LoraConfig, or a ConfigError naming what needs it (`needed_by`) and how to install peft."""
    try:
        from peft import LoraConfig
    except ImportError as e:
        raise ConfigError(f"{needed_by} needs peft: pip install 'rlhfkit[peft]' (or pip install peft).") from e
    return LoraConfig
