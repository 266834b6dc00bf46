"""TRL's two other groups of flags, as rlhfkit's dataclasses: ScriptArguments (the dataset), GRPOScriptArguments
(and `trl grpo`'s reward sources) and ModelConfig (the policy's checkpoint, dtype, LoRA and quantised loading), with
TRL's field names and defaults.

A TRL script parses its command line with one dataclass per group, ``HfArgumentParser((ScriptArguments, PPOConfig,
ModelConfig))``; argparse refuses a flag declared twice, so rlhfkit's PPOConfig and GRPOConfig hold training
arguments only, as TRL's do. rlhfkit's own command line and YAML files take every group at once: PPOArguments and
GRPOArguments (config/ppo.py, config/grpo.py) are dataclasses made of the three groups.
"""

from __future__ import annotations

from dataclasses import field

from rlhfkit.config.rules import (
    FLAG,
    PATH,
    TEXT,
    ListOf,
    OneOf,
    OrNone,
    check_field,
    integer,
    meta,
    number,
)
from rlhfkit.config.train import CheckedConfig, config_dataclass
from rlhfkit.errors import ConfigError
from rlhfkit.logs import note


def _other_task_types() -> dict[str, str]:
    why = "the policy is a causal LM (PPO's value model gets its own SEQ_CLS adapter)"
    return {kind: why for kind in ("SEQ_CLS", "SEQ_2_SEQ_LM", "TOKEN_CLS", "QUESTION_ANS", "FEATURE_EXTRACTION")}


# What --reward_funcs takes (both trainers: GRPOScriptArguments, PPOConfig).
REWARD_FUNCS_HELP = (
    "Reward functions f(prompts, completions, **columns) -> list[float | None] (sync or async): the task's built-in "
    "rewards (e.g. correctness), TRL's built-in names (think_format_reward, get_soft_overlong_punishment, "
    "accuracy_reward with math-verify), or references 'module:function', 'module.function' (TRL's form) or "
    "'path/to/file.py:function'."
)


@config_dataclass
class ScriptArguments(CheckedConfig):
    """The prompt dataset (TRL's ``ScriptArguments`` names and defaults)."""

    dataset_name: str | None = field(
        default=None,
        metadata=meta(
            "Prompt dataset: a hub id, a directory (saved with save_to_disk, or holding data files) or a "
            ".json/.jsonl/.csv/.parquet file. Required with model flags; without them, the built-in task's prompts.",
            OrNone(PATH),
        ),
    )
    dataset_config: str | None = field(
        default=None, metadata=meta("Configuration (subset) of the dataset, as load_dataset's name.", OrNone(TEXT))
    )
    dataset_train_split: str = field(default="train", metadata=meta("Split used for training.", TEXT))
    dataset_test_split: str = field(
        default="test", metadata=meta("Split used for sample generations and evaluation.", TEXT)
    )


@config_dataclass
class GRPOScriptArguments(ScriptArguments):
    """The prompt dataset and the reward sources of `trl grpo` (TRL's ``GRPOScriptArguments``)."""

    reward_model_name_or_path: str | None = field(
        default=None,
        metadata=meta(
            "TRL's grpo script's name for one reward model: added to reward_model_path (after its entries).",
            OrNone(PATH),
        ),
    )
    reward_funcs: list[str] | None = field(
        default=None, metadata=meta(f"{REWARD_FUNCS_HELP} Default: the task's rewards.", OrNone(ListOf(TEXT)))
    )


@config_dataclass
class ModelConfig(CheckedConfig):
    """The policy's checkpoint, dtype, LoRA adapter and quantised loading (TRL's ``ModelConfig`` names and
    defaults)."""

    model_name_or_path: str | None = field(
        default=None,
        metadata=meta(
            "Policy (and tokenizer): a hub id or a local directory. Without any model flag, the built-in task is used.",
            OrNone(PATH),
        ),
    )
    model_revision: str = field(
        default="main", metadata=meta("Revision (branch, tag or commit) of the hub ids of every model flag.", TEXT)
    )
    dtype: str | None = field(
        default=None,
        metadata=meta(
            "Weight dtype of the loaded models : bfloat16 or float16 trains pure low-precision "
            "weights (no fp32 master copy), auto keeps the checkpoint's. Default: float32 weights (with --bf16 / "
            "--fp16 mixed precision on top).",
            OrNone(OneOf(("auto", "float32", "bfloat16", "float16"))),
        ),
    )
    torch_dtype: str | None = field(
        default=None,
        metadata=meta(
            "Old name of dtype (transformers 5 renamed it): sets dtype, with a note.",
            OrNone(OneOf(("auto", "float32", "bfloat16", "float16"))),
        ),
    )
    attn_implementation: str | None = field(
        default=None,
        metadata=meta(
            "Attention implementation of the loaded models , e.g. sdpa, eager or "
            "flash_attention_2; default: transformers' choice.",
            OrNone(TEXT),
        ),
    )

    # --- LoRA adapters (peft) and quantised loading -------------------------------------------------
    use_peft: bool = field(
        default=False,
        metadata=meta(
            "Train a LoRA adapter on the policy (peft) instead of all its weights. The reference is the same model "
            "with the adapter disabled (no second copy); PPO's value model gets its own adapter, its score head "
            "trained in full. Checkpoints and output_dir hold the adapters (docs/algorithms/ppo.md, LoRA).",
            FLAG,
        ),
    )
    lora_r: int = field(default=16, metadata=meta("LoRA rank (with use_peft).", integer(ge=1)))
    lora_alpha: int = field(
        default=32, metadata=meta("LoRA alpha: the adapter's output is scaled by alpha / r.", integer(ge=1))
    )
    lora_dropout: float = field(
        default=0.05,
        metadata=meta(
            "Dropout on the adapters' inputs. Like all dropout it is off while disable_dropout is on (the default, "
            "so that PPO's first ratio is exactly 1): pass --disable_dropout false to use it.",
            number(ge=0, lt=1),
        ),
    )
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata=meta(
            "Modules that get adapters: names (e.g. q_proj v_proj; a module matches when its name ends with one) "
            "or all-linear (every linear layer but the output head). Default: peft's choice for the architecture "
            "(q_proj and v_proj for Llama).",
            OrNone(ListOf(TEXT)),
        ),
    )
    lora_modules_to_save: list[str] | None = field(
        default=None,
        metadata=meta(
            "Policy modules trained in full beside the adapter and saved with it (e.g. lm_head).",
            OrNone(ListOf(TEXT)),
        ),
    )
    lora_task_type: str = field(
        default="CAUSAL_LM",
        metadata=meta(
            "peft task type of the policy's adapter (the policy is a causal LM; PPO's value adapter is SEQ_CLS).",
            OneOf(("CAUSAL_LM",), unsupported=_other_task_types),
        ),
    )
    use_rslora: bool = field(
        default=False, metadata=meta("Rank-stabilised LoRA: scale by alpha / sqrt(r) instead of alpha / r.", FLAG)
    )
    use_dora: bool = field(
        default=False, metadata=meta("DoRA: weight-decomposed LoRA (a magnitude vector per adapted layer).", FLAG)
    )
    load_in_4bit: bool = field(
        default=False,
        metadata=meta(
            "Load the policy's base weights in 4 bits (bitsandbytes; QLoRA: needs use_peft and a CUDA GPU). "
            "Untested in rlhfkit's CI, which has no GPU.",
            FLAG,
        ),
    )
    load_in_8bit: bool = field(
        default=False,
        metadata=meta(
            "Load the policy's base weights in 8 bits (bitsandbytes; needs use_peft and a CUDA GPU). Untested in "
            "rlhfkit's CI, which has no GPU.",
            FLAG,
        ),
    )
    bnb_4bit_quant_type: str = field(
        default="nf4", metadata=meta("4-bit quantisation type (load_in_4bit).", OneOf(("nf4", "fp4")))
    )
    use_bnb_nested_quant: bool = field(
        default=False, metadata=meta("Quantise the 4-bit quantisation constants too (load_in_4bit).", FLAG)
    )
    bnb_4bit_quant_storage: str | None = field(
        default=None,
        metadata=meta(
            "dtype the 4-bit weights are stored in (load_in_4bit; e.g. bfloat16 to shard them with FSDP). Default: "
            "uint8.",
            OrNone(OneOf(("uint8", "float16", "bfloat16", "float32"))),
        ),
    )

    def _apply_aliases(self) -> None:
        if self.torch_dtype is not None:
            check_field(self.__dataclass_fields__["torch_dtype"], self.torch_dtype)
            if self.dtype is not None and self.dtype != self.torch_dtype:
                raise ConfigError(
                    f"torch_dtype={self.torch_dtype!r} and dtype={self.dtype!r}: torch_dtype is the old name of dtype "
                    "(transformers 5 renamed it). Pass only --dtype."
                )
            note(f"torch_dtype is the old name of dtype (transformers 5 renamed it): using dtype={self.torch_dtype}.")
            self.dtype, self.torch_dtype = self.torch_dtype, None  # moved: to_dict() then rebuilds without a note
        super()._apply_aliases()

    def _check_combinations(self) -> None:
        """LoRA and quantisation flags that only make sense together. (Whether bitsandbytes and a CUDA GPU exist is
        checked before the models load: models.quantization_config.)"""
        if self.load_in_4bit and self.load_in_8bit:
            raise ConfigError("load_in_4bit=True and load_in_8bit=True: choose one. Pass only one of them.")
        quantised = self.quantised()
        if quantised and not self.use_peft:
            raise ConfigError(
                f"{quantised}=True without use_peft: quantised weights cannot be trained directly. Add --use_peft to "
                f"train a LoRA adapter on them (QLoRA), or leave --{quantised} out."
            )
        if self.lora_target_modules is not None and "all-linear" in self.lora_target_modules:
            if len(self.lora_target_modules) > 1:
                raise ConfigError(
                    f"lora_target_modules={self.lora_target_modules!r}: all-linear stands alone. Pass "
                    "--lora_target_modules all-linear, or module names only."
                )
        super()._check_combinations()

    def lora_config(self):
        """The peft ``LoraConfig`` of --use_peft and the --lora_* flags, for a trainer's ``peft_config`` (TRL's
        ``get_peft_config(model_args)``); None without --use_peft."""
        if not self.use_peft:
            return None
        from rlhfkit.models.adapters import LORA_FLAGS, lora_config  # torch and transformers only when asked

        return lora_config(self.lora_task_type, {flag: getattr(self, flag) for flag in LORA_FLAGS.values()})

    def quantization(self):
        """The models' Quantization of --load_in_4bit / --load_in_8bit and the 4-bit settings."""
        from rlhfkit.models.adapters import Quantization  # torch and transformers only when asked

        return Quantization(
            self.load_in_4bit,
            self.load_in_8bit,
            self.bnb_4bit_quant_type,
            self.use_bnb_nested_quant,
            self.bnb_4bit_quant_storage,
        )

    def quantised(self) -> str | None:
        """The flag that loads quantised weights, if any."""
        return "load_in_4bit" if self.load_in_4bit else "load_in_8bit" if self.load_in_8bit else None


def check_adapter_merge(args) -> None:
    """--merge_adapter (a training flag) against the model group's LoRA flags, for PPOArguments and GRPOArguments."""
    if args.merge_adapter and not args.use_peft:
        raise ConfigError("merge_adapter=True without use_peft: there is no adapter to merge. Add --use_peft.")
    if args.merge_adapter and args.quantised():
        raise ConfigError(
            f"merge_adapter=True with {args.quantised()}=True: merging into quantised weights loses precision. Train "
            "with --merge_adapter false, then merge the saved adapter into the unquantised base model with peft "
            "(PeftModel.from_pretrained(base, output_dir).merge_and_unload())."
        )
