"""The defaults of rlhfkit's configs that differ from TRL's, and why: the table in docs/migrating-from-trl.md.

Part of the docs generator (docs/generate.py), not of rlhfkit: it imports TRL, which rlhfkit never does.

TRL's defaults are read from the classes themselves where they are installed: TRL 1.16's ``GRPOConfig``,
``ScriptArguments``, ``GRPOScriptArguments`` and ``ModelConfig`` (TRL is a test and docs dependency), and
transformers' ``TrainingArguments``, which TRL's configs extend. TRL 1.12's ``PPOConfig`` (TRL's last PPO, gone from
1.13 on) cannot be installed beside 1.16, so its defaults are recorded (config/trl_recorded.py TRL_1_12_PPO_DEFAULTS).
Its ``ScriptArguments`` and ``ModelConfig`` have the same defaults as 1.16's (compared when they were recorded).
``make docs`` renders the table; tests/config/test_trl_defaults.py keeps it true.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING
from typing import Any

from rlhfkit.config.grpo import GRPOArguments
from rlhfkit.config.ppo import PPOArguments
from rlhfkit.config.trl_recorded import TRL_1_12_PPO_DEFAULTS

# Why each default differs: (command, field) -> one short phrase. A test requires one for every differing default and
# none for a default that no longer differs.
WHY: dict[tuple[str, str], str] = {
    ("ppo", "report_to"): "every run gets a local Trackio dashboard; `--report_to none` logs to no tracker",
    ("grpo", "report_to"): "every run gets a local Trackio dashboard; `--report_to none` logs to no tracker",
    ("ppo", "logging_steps"): "TRL 1.12's PPO logs every update whatever `logging_steps` says; 1 does the same",
    ("ppo", "per_device_train_batch_size"): "the size TRL's ppo.py example command passes",
    ("ppo", "per_device_eval_batch_size"): "evaluation only generates and scores (no backward pass)",
    ("grpo", "per_device_eval_batch_size"): "evaluation only generates and scores (no backward pass)",
    (
        "ppo",
        "max_grad_norm",
    ): "TRL 1.12's PPOTrainer never clips gradients (its 1.0 has no effect); unset does the same",
    ("ppo", "dtype"): "unset loads float32 weights, as TRL's `float32` does",
    ("grpo", "dtype"): "unset loads float32 weights, as TRL's `float32` does",
    ("ppo", "gradient_checkpointing"): "TRL 1.12's PPOTrainer never enables it (its true has no effect); rlhfkit "
    "honours the flag, off unless asked",
    ("grpo", "gradient_checkpointing"): "it costs about a third more compute; `--gradient_checkpointing` turns it on",
    ("ppo", "sft_model_path"): "the policy starts from `--model_name_or_path` rather than a fixed pythia-160m",
    ("ppo", "reward_model_path"): "pythia-160m is a causal LM, so TRL's default scores with a random head: name the "
    "reward with `--reward_model_path` or `--reward_funcs`",
    ("grpo", "disable_dropout"): "a reused batch's old and new log-probs must agree (`num_iterations` > 1)",
    ("grpo", "num_completions_to_print"): "8 rows of each completions table on the console; all rows are logged",
    (
        "grpo",
        "max_completion_length",
    ): "half of TRL 1.16's, for shorter, faster steps; `--max_completion_length 512` matches TRL",
}


def _defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.init:
            out[f.name] = (
                f.default_factory()
                if f.default_factory is not MISSING
                else None
                if f.default is MISSING
                else f.default
            )
    return out


def trl_defaults(command: str) -> dict[str, Any]:
    """TRL's default of every field of `command` ("ppo": TRL 1.12, "grpo": the installed TRL, 1.16)."""
    from transformers import TrainingArguments
    from trl import ModelConfig, ScriptArguments

    shared = {**_defaults(ScriptArguments), **_defaults(ModelConfig)}
    if command == "ppo":
        return {**shared, **_defaults(TrainingArguments), **TRL_1_12_PPO_DEFAULTS}
    from trl import GRPOConfig as TRLGRPOConfig
    from trl.scripts.grpo import GRPOScriptArguments

    return {**shared, **_defaults(GRPOScriptArguments), **_defaults(TRLGRPOConfig)}


def differing_defaults() -> list[tuple[str, str, Any, Any]]:
    """(command, field, TRL's default, rlhfkit's default) for every field both have whose defaults differ."""
    rows = []
    for command, cls in (("ppo", PPOArguments), ("grpo", GRPOArguments)):
        theirs = trl_defaults(command)
        for name, ours in _defaults(cls).items():
            if name in theirs and theirs[name] != ours:
                rows.append((command, name, theirs[name], ours))
    return rows


def render_table() -> str:
    """The markdown table of docs/migrating-from-trl.md's generated section "trl-defaults"."""
    import trl

    lines = [
        "| command | field | TRL's default | rlhfkit's default | why |",
        "|---|---|---|---|---|",
    ]
    for command, name, theirs, ours in differing_defaults():
        version = "1.12" if command == "ppo" else trl.__version__.rsplit(".", 1)[0]
        lines.append(
            f"| {command} | `{name}` | `{theirs!r}` (TRL {version}) | `{ours!r}` | {WHY.get((command, name), '?')} |"
        )
    return "\n".join(lines) + "\n"
