"""LoRA adapters (peft, imported only with --use_peft) and quantised base weights (--load_in_4bit / --load_in_8bit),
and TRL's LoRA flags and peft's ``LoraConfig``, both ways, from one mapping.

The flags are those of TRL's ``ModelConfig`` (config/script.py): ``--use_peft`` and the ``--lora_*`` settings.
:func:`lora_config` builds peft's LoraConfig from them (``ModelConfig.lora_config()``, a script's ``peft_config``;
:func:`with_lora`, the adapter a trainer trains); :func:`lora_flags` reads them back from a LoraConfig a TRL script
gives a trainer as ``peft_config``. peft is imported only when one of them is called.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

from rlhfkit.errors import ConfigError, ModelLoadError

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


def lora_config(task_type: str, flags: Mapping[str, Any], **fields: Any):
    """peft's LoraConfig of the LoRA flags `flags` (each flag of LORA_FLAGS by its name, as lora_flags gives them) for
    an adapter of `task_type`; `fields`: LoraConfig fields set otherwise (they replace the flags' values)."""
    LoraConfig = _lora_config_class("use_peft")
    values = {name: flags[flag] for name, flag in LORA_FLAGS.items()}
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


def no_split_modules(model: nn.Module) -> list[str]:
    """The class names of `model`'s transformer layers (transformers' _no_split_modules, through a peft wrapper):
    the units FSDP shards and a device map keeps whole."""
    if is_peft_model(model):
        model = model.get_base_model()
    return list(getattr(model, "_no_split_modules", None) or [])


def is_peft_model(model: nn.Module) -> bool:
    """Whether `model` is a peft PeftModel (peft is not imported for it: a model can only be one once it was)."""
    import sys

    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def with_lora(
    model: nn.Module, flags: Mapping[str, Any], *, disable_dropout: bool, revision: str, task_type: str = "CAUSAL_LM"
) -> nn.Module:
    """`model` wrapped in a peft PeftModel with a fresh LoRA adapter built from TRL's LoRA flags (`flags`: each flag
    of LORA_FLAGS by its name). revision: --model_revision, recorded in adapter_config.json.

    peft freezes the base weights in place and adds the adapter's small matrices beside them, so the model with its
    adapter disabled *is* the base model: the reference of PPO and GRPO, without a second copy. The adapter starts
    as a no-op (lora_B = 0): training starts from the base model exactly. task_type SEQ_CLS (PPO's value model):
    peft also trains the score head in full (its modules_to_save). The adapters' dropout is off while
    --disable_dropout is on (the default), like every other dropout, so PPO's first ratio stays exactly 1.
    """
    try:
        from peft import get_peft_model
    except ImportError as e:
        raise ModelLoadError("--use_peft needs peft: pip install 'rlhfkit[peft]' (or pip install peft).") from e
    config = lora_config(
        task_type,
        flags,
        lora_dropout=0.0 if disable_dropout else flags["lora_dropout"],
        modules_to_save=flags["lora_modules_to_save"] if task_type == "CAUSAL_LM" else None,
        revision=revision,  # recorded in adapter_config.json, so loaders fetch the same base
    )
    try:
        with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing: not ours
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return get_peft_model(model, config)
    except ValueError as e:  # no module matches lora_target_modules, or peft knows no default for the architecture
        raise ModelLoadError(
            f"--use_peft cannot put a LoRA adapter on {type(model).__name__}: {e} Pass --lora_target_modules with "
            "the names of its linear layers (or all-linear)."
        ) from e


class adapter_disabled:  # a context manager: `with adapter_disabled(model):`
    """The base model of a PeftModel for the block: adapters (and modules_to_save copies) off, eval mode (as a frozen
    reference copy is); the mode is restored afterwards."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self) -> nn.Module:
        self.was_training = self.model.training
        self.model.eval()
        self.context = self.model.disable_adapter()
        self.context.__enter__()
        return self.model

    def __exit__(self, *exc) -> None:
        self.context.__exit__(*exc)
        self.model.train(self.was_training)


def write_merged(model: nn.Module, tokenizer, directory: str) -> None:
    """A plain transformers model in `directory`: a copy of the PeftModel `model` with its adapter merged into the
    base weights, and the tokenizer. `model` keeps its adapter; the copy costs one more set of weights meanwhile.
    Written into `directory`.tmp and renamed once complete, replacing an earlier `directory`."""
    import shutil

    tmp = directory.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    del merged
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)


class Quantization(NamedTuple):
    """How the trained policy's base weights are quantised: TRL's --load_in_4bit / --load_in_8bit and the 4-bit
    settings (ModelConfig's fields of the same names). The default: not quantised."""

    load_in_4bit: bool = False
    load_in_8bit: bool = False
    bnb_4bit_quant_type: str = "nf4"
    use_bnb_nested_quant: bool = False  # quantise the 4-bit quantisation constants too
    bnb_4bit_quant_storage: str | None = None  # the dtype the 4-bit weights are stored in (None: uint8)


NOT_QUANTIZED = Quantization()


def check_lora_setup(use_peft: bool, quantization: Quantization) -> None:
    """What --use_peft and --load_in_4bit / --load_in_8bit need from this machine (peft; bitsandbytes and a CUDA
    GPU), checked before anything loads: a ModelLoadError (exit 2) that says what is missing."""
    import importlib.util

    if use_peft and importlib.util.find_spec("peft") is None:
        raise ModelLoadError("--use_peft needs peft: pip install 'rlhfkit[peft]' (or pip install peft).")
    quantization_config(quantization)


def quantization_config(quantization: Quantization, dtype: torch.dtype | str | None = None):
    """transformers' BitsAndBytesConfig for --load_in_4bit / --load_in_8bit, as TRL's get_quantization_config builds
    it, or None. Where bitsandbytes or a CUDA GPU is missing: a ModelLoadError (exit 2), raised before any model
    loads (the builders call this first)."""
    q = quantization
    flag = "load_in_4bit" if q.load_in_4bit else "load_in_8bit" if q.load_in_8bit else None
    if flag is None:
        return None
    import importlib.util

    missing = [
        what
        for what, present in (
            ("no CUDA GPU", torch.cuda.is_available()),
            ("no bitsandbytes", importlib.util.find_spec("bitsandbytes") is not None),
        )
        if not present
    ]
    if missing:
        raise ModelLoadError(
            f"--{flag} needs bitsandbytes and a CUDA GPU (pip install bitsandbytes); this machine has "
            f"{' and '.join(missing)}. Leave --{flag} out to train the LoRA adapter on unquantised weights."
        )
    from transformers import BitsAndBytesConfig

    if q.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_compute_dtype=dtype if isinstance(dtype, torch.dtype) else None,
        bnb_4bit_quant_type=q.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=q.use_bnb_nested_quant,
        bnb_4bit_quant_storage=q.bnb_4bit_quant_storage,
    )
