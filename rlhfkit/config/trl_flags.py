"""TRL's fields that rlhfkit takes only at TRL's default value, and why.

``rlhfkit ppo`` and ``rlhfkit grpo`` take TRL's flag names, so a TRL command line runs unchanged where the concept is
the same. The flags of TRL's commands are those of its dataclasses: for ``trl ppo`` (TRL 1.12's PPO example script)
``PPOConfig``, ``ScriptArguments`` and ``ModelConfig``; for ``trl grpo`` (TRL 1.16) ``GRPOScriptArguments``,
``GRPOConfig``, ``ModelConfig`` and ``DatasetMixtureConfig``; both configs extend transformers' ``TrainingArguments``.

Every one of those fields is accepted at TRL's default value for that command (a Python keyword, a --config key or a
flag) and dropped without a word: it asks for nothing rlhfkit does differently, so a TRL config, YAML file or command
line that spells out TRL's defaults runs. A field that no config of rlhfkit takes, at another value, exits with status
2 and its reason, never as an unknown flag:

    --use_vllm is a TRL/transformers flag that rlhfkit does not support: <why>. TRL's default (--use_vllm false) is
    accepted. See docs/trl-flags.md.

The names and defaults TRL adds are recorded in config/trl_recorded.py (rlhfkit does not import TRL at run time);
transformers' are read from the installed ``TrainingArguments``. Every name is in one of the GROUPS below: not
supported (with the reason), not supported yet (planned), or accepted and ignored at any value (where ignoring is
harmless and honest: the flag asks for nothing rlhfkit would do differently; a value other than the default prints
one note). ``make docs`` generates ``docs/trl-flags.md`` and the table of TRL's GRPOConfig fields in
``docs/algorithms/grpo.md`` from these facts (config/trl_flags_docs.py).

The configs import this module to explain a keyword they do not take (:func:`screen_keyword`), so it imports no
config: a config names its command with its ``trl_command`` attribute.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
from collections.abc import Collection
from dataclasses import MISSING, dataclass
from functools import cache
from typing import Any

from rlhfkit.config.trl_recorded import TRL_DEFAULTS, TRL_FLAGS, TRL_GRPO_FLAGS, TRL_SCRIPT_DEFAULTS
from rlhfkit.errors import FieldNotTakenError

SUPPORTED_NOT, NOT_YET, IGNORED = "not supported", "not supported yet", "accepted and ignored"
DOC = "docs/trl-flags.md"
COMMANDS = ("ppo", "grpo")


@dataclass(frozen=True)
class Group:
    """Flags refused (or ignored) for one reason. `reason` completes "rlhfkit does not support: ..."."""

    status: str  # SUPPORTED_NOT, NOT_YET or IGNORED
    reason: str
    names: tuple[str, ...]


# TRL's LoRA flags that rlhfkit's --use_peft does not take (it takes use_peft, lora_r, lora_alpha, lora_dropout,
# lora_target_modules, lora_modules_to_save, lora_task_type, use_rslora, use_dora, load_in_4bit/8bit and bnb_*).
_OTHER_ADAPTERS = ("lora_target_parameters", "model_adapter_name", "ref_adapter_name")
# The vllm_importance_sampling_* settings are TRL's names for the correction of a stale or foreign sampler; rlhfkit
# applies them to async_generation's stale batches.
_VLLM = tuple(
    name
    for name in TRL_GRPO_FLAGS
    if name.startswith("vllm_") and not name.startswith("vllm_importance_sampling_") or name.endswith("_cap")
)

GROUPS: tuple[Group, ...] = (
    # --- accepted and ignored ----------------------------------------------------------------------------------------
    Group(
        IGNORED,
        "transformers itself does not read these (they are for scripts); rlhfkit's trainers always train, and "
        "evaluate on their own schedule (--eval_strategy)",
        ("do_train", "do_eval", "do_predict"),
    ),
    Group(
        IGNORED,
        "rlhfkit draws the prompt batches itself, without a DataLoader, so there are no loader workers to set",
        (
            "dataloader_num_workers",
            "dataloader_pin_memory",
            "dataloader_persistent_workers",
            "dataloader_prefetch_factor",
        ),
    ),
    Group(
        IGNORED,
        "rlhfkit does not set the process group's timeout: torch's default applies",
        ("ddp_timeout",),
    ),
    Group(
        IGNORED,
        "transformers' console logging controls; rlhfkit prints its own progress line and messages, and records no "
        "memory metrics",
        ("log_level", "log_level_replica", "disable_tqdm", "log_on_each_node", "skip_memory_metrics"),
    ),
    Group(
        IGNORED,
        "passed by the deprecated torch.distributed.launch; the launcher also sets LOCAL_RANK in the environment, "
        "which accelerate reads",
        ("local_rank",),
    ),
    # --- not supported ---------------------------------------------------------------------------------------------
    Group(
        SUPPORTED_NOT,
        "DeepSpeed ZeRO and FSDP2 come from the accelerate config, not from trainer flags: accelerate launch "
        "--config_file examples/accelerate_configs/deepspeed_zero3.yaml (or deepspeed_zero1/2, fsdp2) -m rlhfkit ...; "
        "a DeepSpeed JSON goes into the accelerate config as deepspeed_config_file (docs/distributed.md)",
        ("deepspeed", "fsdp", "fsdp_config"),
    ),
    Group(
        SUPPORTED_NOT,
        "with --use_peft rlhfkit creates one LoRA adapter on the modules --lora_target_modules names, and the "
        "reference is the policy with that adapter disabled: no adapters on bare parameters (MoE experts), no "
        "choosing among several adapters a model already holds",
        _OTHER_ADAPTERS,
    ),
    Group(
        SUPPORTED_NOT,
        "rlhfkit uploads output_dir once, when training has ended (--push_to_hub, --hub_model_id): no uploads "
        "during training, to another revision or of the completions",
        (
            "hub_strategy",
            "hub_always_push",
            "hub_revision",
            "log_completions_hub_repo",
        ),
    ),  # fmt: skip
    Group(
        SUPPORTED_NOT,
        "an RL run has no evaluation loss to pick a best checkpoint by; rlhfkit keeps the latest checkpoints "
        "(--save_total_limit) and the final model (--metric_for_best_model only tracks state.best_metric for "
        "callbacks; compare runs with rlhfkit report / rlhfkit eval)",
        ("load_best_model_at_end",),
    ),
    Group(
        SUPPORTED_NOT,
        "options of the supervised Trainer's loss and evaluation loop; rlhfkit's evaluation generates greedy "
        "completions of the eval prompts and scores them (eval/* metrics and the completions table)",
        (
            "prediction_loss_only",
            "eval_do_concat_batches",
            "eval_use_gather_object",
            "eval_accumulation_steps",
            "include_for_metrics",
            "batch_eval_metrics",
            "label_names",
            "label_smoothing_factor",
            "bf16_full_eval",
            "fp16_full_eval",
            "eval_delay",
        ),
    ),  # fmt: skip
    Group(
        SUPPORTED_NOT,
        "rlhfkit draws the prompt batches itself, without a DataLoader: the order comes from --seed and "
        "--shuffle_dataset, and a resumed run continues it exactly",
        (
            "dataloader_drop_last",
            "dataloader_multiprocessing_context",
            "dataloader_in_order",
            "remove_unused_columns",
            "train_sampling_strategy",
            "length_column_name",
            "data_seed",
            "ignore_data_skip",
        ),
    ),  # fmt: skip
    Group(
        SUPPORTED_NOT,
        "rlhfkit reads the prompt split into memory (to draw shuffled batches and resume exactly) from one "
        "--dataset_name; mix or stream datasets beforehand (datasets' concatenate_datasets / interleave_datasets)",
        ("dataset_streaming", "datasets", "streaming", "test_split_size"),
    ),
    Group(
        SUPPORTED_NOT,
        "devices, processes and sharding come from accelerate: pass an accelerate config file "
        "(examples/accelerate_configs/) to accelerate launch, or accelerate launch --cpu (accelerator_config is "
        "taken with dispatch_batches false, which is what rlhfkit does: every process reads its own batches)",
        (
            "use_cpu",
            "ddp_find_unused_parameters",
            "ddp_bucket_cap_mb",
            "ddp_broadcast_buffers",
            "ddp_static_graph",
            "ddp_backend",
            "accelerator_config",
            "parallelism_config",
            "ignore_bias_buffers",
        ),
    ),  # fmt: skip
    Group(
        SUPPORTED_NOT,
        "rlhfkit's batch sizes are computed from per_device_train_batch_size, gradient_accumulation_steps, "
        "num_mini_batches and the number of processes (TRL fills these fields in at run time too); see "
        "docs/algorithms/ppo.md",
        (
            "world_size",
            "num_total_batches",
            "micro_batch_size",
            "local_batch_size",
            "batch_size",
            "local_mini_batch_size",
            "mini_batch_size",
        ),
    ),  # fmt: skip
    Group(
        SUPPORTED_NOT,
        "optimizer options of optimizers rlhfkit does not build (GaLore, APOLLO, AnyPrecisionAdamW...): --optim "
        "takes adamw_torch, adamw_torch_fused, sgd or adafactor",
        ("optim_args", "optim_target_modules"),
    ),
    Group(
        SUPPORTED_NOT,
        "rlhfkit always pools token counts across processes before dividing (docs/metrics.md, loss_type dapo); it "
        "cannot be turned off",
        ("average_tokens_across_devices",),
    ),
    Group(
        SUPPORTED_NOT,
        "speed and memory features rlhfkit does not offer for the training forward (compilation, Liger kernels, "
        "TF32, cache emptying, batch-size search, NEFTune noise, the KV cache in training)",
        (
            "torch_compile",
            "torch_compile_backend",
            "torch_compile_mode",
            "use_liger_kernel",
            "liger_kernel_config",
            "tf32",
            "torch_empty_cache_steps",
            "auto_find_batch_size",
            "neftune_noise_alpha",
            "use_cache",
        ),
    ),  # fmt: skip
    Group(
        SUPPORTED_NOT,
        "rlhfkit samples with its own KV-cache decoder (temperature, top_k, top_p, min_p, repetition_penalty), or "
        "with model.generate where --generation_kwargs asks for more; vLLM, transformers' continuous batching and "
        "its cache implementations are not used",
        (
            "use_vllm",
            *_VLLM,
            "use_transformers_continuous_batching",
            "transformers_continuous_batching_config",
            "use_transformers_paged",
        ),
    ),  # fmt: skip
    Group(
        SUPPORTED_NOT,
        "text prompts and conversations only: no multimodal inputs, so no images to log",
        ("log_multimodal",),
    ),
    Group(
        SUPPORTED_NOT,
        "transformers' console and logging controls; rlhfkit prints its own progress line and tables, and "
        "metrics.jsonl keeps every logged value (non-finite steps are skipped and counted in nonfinite_steps)",
        (
            "logging_nan_inf_filter",
            "include_num_input_tokens_seen",
            "log_unique_prompts",
            "debug",
        ),
    ),  # fmt: skip
    Group(
        SUPPORTED_NOT,
        "rlhfkit logs Trackio runs locally (trackio show); sync them to a Space with Trackio's own tools",
        ("trackio_space_id", "trackio_bucket_id", "trackio_static_space_id"),
    ),
    Group(
        SUPPORTED_NOT,
        "a checkpoint always holds the whole training state, written by the main process, so the run resumes "
        "exactly; SIGTERM/SIGINT always end the step with a checkpoint",
        ("save_only_model", "save_on_each_node", "restore_callback_states_from_checkpoint", "enable_jit_checkpoint"),
    ),
    Group(
        SUPPORTED_NOT,
        "options rlhfkit's loaders do not take: pass model options through the checkpoint's config, and FSDP's "
        "activation checkpointing belongs to FSDP (use --gradient_checkpointing)",
        ("activation_checkpointing", "activation_checkpointing_kwargs"),
    ),
    Group(
        SUPPORTED_NOT,
        "rlhfkit seeds every library from --seed (each process differently) but does not force torch's "
        "deterministic algorithms",
        ("full_determinism",),
    ),
)
# transformers' TrainingArguments fields that no group names (added by a newer transformers).
FALLBACK = Group(SUPPORTED_NOT, "a transformers Trainer option that rlhfkit's trainers do not use", ())


@cache
def transformers_flags() -> tuple[str, ...]:
    """The flags of the installed transformers' TrainingArguments (TRL's configs extend it)."""
    return tuple(_transformers_defaults())


@cache
def _transformers_defaults() -> dict[str, Any]:
    from transformers import TrainingArguments

    return {f.name: _field_default(f) for f in dataclasses.fields(TrainingArguments) if f.init}


def _field_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None if f.default is MISSING else f.default


def trl_flags(command: str) -> tuple[str, ...]:
    """Every flag of TRL's `command` ("ppo" or "grpo"): TrainingArguments', then TRL's own."""
    names = transformers_flags()
    return names + tuple(name for name in TRL_FLAGS[command] if name not in names)


def trl_default(command: str, name: str) -> Any:
    """TRL's default of the flag `name` of `command` (TRL 1.12's for "ppo", 1.16's for "grpo"; MISSING for a name
    that is no flag of it)."""
    if name in TRL_DEFAULTS[command]:
        return TRL_DEFAULTS[command][name]
    if name in TRL_FLAGS[command] and name in TRL_SCRIPT_DEFAULTS:
        return TRL_SCRIPT_DEFAULTS[name]
    return _transformers_defaults().get(name, MISSING)


# Entries of TRL's dict fields that ask for what rlhfkit does anyway, taken at these values as at the default:
# accelerator_config's dispatch_batches False, which TRL requires with a streamed train set ("every process reads its
# own batches"): rlhfkit never dispatches batches from the main process, every process draws the same prompt order and
# keeps its share (trainers/datasets.py reads a stream's rows in each process).
HONOURED = {"accelerator_config": {"dispatch_batches": False}}


def is_default(command: str, name: str, value: Any) -> bool:
    """Whether `value` of TRL's flag `name` is TRL's default for `command`, as TRL would read it: an enum as its value
    (HubStrategy.EVERY_SAVE is "every_save"), an empty value (None, "", [], {}) as any other, a number as an equal
    number (not a bool), and for accelerator_config, which transformers fills in from None, a dict (or
    AcceleratorConfig) that sets nothing but its defaults and the HONOURED entries."""
    default = trl_default(command, name)
    if default is MISSING:
        return False
    if _same(value, default):
        return True
    filled, honoured = _filled_defaults().get(name), HONOURED.get(name, {})
    value = _plain(value)
    return (
        filled is not None
        and isinstance(value, dict)
        and value.keys() <= filled.keys()
        and all(_same(v, filled[k]) or (k in honoured and _same(v, honoured[k])) for k, v in value.items())
    )


@cache
def _filled_defaults() -> dict[str, dict[str, Any]]:
    """transformers' values of fields whose default None its TrainingArguments fills in (as a TRL config's to_dict()
    shows them)."""
    from transformers.trainer_pt_utils import AcceleratorConfig

    return {"accelerator_config": {f.name: _field_default(f) for f in dataclasses.fields(AcceleratorConfig)}}


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _same(value: Any, default: Any) -> bool:
    value, default = _plain(value), _plain(default)
    if _is_empty(value) and _is_empty(default):
        return True  # an empty value asks for nothing: debug "" is transformers' [], include_for_metrics None its []
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default  # True is not 1
    if isinstance(value, (int, float)) and isinstance(default, (int, float)):
        return value == default
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return len(value) == len(default) and all(_same(v, d) for v, d in zip(value, default))
    if isinstance(value, dict) and isinstance(default, dict):
        return value.keys() == default.keys() and all(_same(v, default[k]) for k, v in value.items())
    return type(value) is type(default) and value == default


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, (str, list, tuple, dict)) and len(value) == 0)


_TRUE, _FALSE = ("true", "yes", "t", "y", "1"), ("false", "no", "f", "n", "0")  # transformers' string_to_bool


def flag_value(command: str, name: str, text: str | None) -> Any:
    """The value HfArgumentParser (and TRL's parser) reads for TRL's flag `name` from the text after it (None: the
    bare flag; a YAML string is read the same way, as argparse reads a string default): a boolean for an on/off flag
    (bare: True), a number for a numeric one, JSON text as a dict; other text as it is ("None" is the text, not None:
    a default of None is spelled by leaving the flag out)."""
    default = _plain(trl_default(command, name))
    if text is None:
        return True  # a bare on/off flag; a flag that needs a value has no default to spell without one
    if isinstance(default, bool):
        low = text.lower()
        return True if low in _TRUE else False if low in _FALSE else text
    if isinstance(default, (int, float)):
        for number in (int, float):
            try:
                return number(text)
            except ValueError:
                pass
    if text.startswith("{"):
        try:
            return json.loads(text)  # transformers reads a dict field's JSON text
        except ValueError:
            pass
    return text


def is_boolean(command: str, name: str) -> bool:
    """Whether TRL's flag `name` is an on/off flag (its value is optional on the command line)."""
    return isinstance(trl_default(command, name), bool)


@cache
def _by_name() -> dict[str, Group]:
    return {name: group for group in GROUPS for name in group.names}


def group_of(name: str) -> Group:
    """The group of a TRL flag rlhfkit does not take (FALLBACK for a transformers flag no group names)."""
    return _by_name().get(name, FALLBACK)


def not_taken(command: str, rlhfkit_flags: set[str] | frozenset[str]) -> dict[str, Group]:
    """TRL's flags of `command` that rlhfkit's flags (`rlhfkit_flags`: the config's field names) lack, with their
    group."""
    return {name: group_of(name) for name in trl_flags(command) if name not in rlhfkit_flags}


def default_spelling(command: str, name: str, python: bool = False) -> str:
    """TRL's default of flag `name` as a command line (or, `python`, a keyword) gives it: "--use_vllm false",
    "leaving --deepspeed out", "hub_strategy='every_save'"."""
    default = _plain(trl_default(command, name))
    if python:
        return f"{name}={default!r}"
    if _is_empty(default):
        return f"leaving --{name} out"
    if isinstance(default, bool):
        return f"--{name} {str(default).lower()}"
    return f"--{name} {json.dumps(default) if isinstance(default, (dict, list)) else default}"


def message(flag: str, group: Group, python: bool = False, command: str | None = None) -> str:
    """The error for a refused flag, e.g. "--use_vllm is a TRL/transformers flag that rlhfkit does not support: ...
    TRL's default (--use_vllm false) is accepted. See docs/trl-flags.md." (`python`: the same for a keyword of a
    config's constructor; `command`: the TRL command whose default to name)."""
    verb = "does not support yet" if group.status == NOT_YET else "does not support"
    what = f"{flag} is a TRL/transformers field" if python else f"--{flag} is a TRL/transformers flag"
    default = ""
    if command is not None and trl_default(command, flag) is not MISSING:
        default = f" TRL's default ({default_spelling(command, flag, python)}) is accepted."
    return f"{what} that rlhfkit {verb}: {group.reason}.{default} See {DOC}."


def ignored_note(flag: str, group: Group) -> str:
    """The one line printed for an accepted-and-ignored flag (or keyword, or --config key) at another value than
    TRL's default."""
    return f"{flag} has no effect in rlhfkit: {group.reason}."


def screen_keyword(config: str, command: str, name: str, value: Any, taken: Collection[str]) -> str | None:
    """A keyword `name` (= `value`) that the config class named `config` does not take (`taken`: the flags of its
    command line, `command`: "ppo" or "grpo"): None for a TRL field at TRL's default (the config drops it); the note
    for one rlhfkit accepts and ignores at any value (dropped too); FieldNotTakenError with the command line's reason
    for a TRL field rlhfkit refuses, or with Python's message and the closest flag for another name."""
    group = not_taken(command, set(taken)).get(name)
    if group is None:
        close = difflib.get_close_matches(name, sorted(taken), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise FieldNotTakenError(f"{config}.__init__() got an unexpected keyword argument {name!r}.{hint}")
    if is_default(command, name, value):
        return None
    if group.status == IGNORED:
        return ignored_note(name, group)
    raise FieldNotTakenError(f"{config}({name}=...): {message(name, group, python=True, command=command)}")
