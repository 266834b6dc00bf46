"""From a config to a ready trainer: resolve paths (the built-in task when no model is given), load models and data."""

from __future__ import annotations

import os
import warnings

from rlhfkit.config import PPOConfig
from rlhfkit.data import load_prompt_splits
from rlhfkit.models import choose_dtype, load_policy, load_scalar_model, load_tokenizer

MODEL_FLAGS = ("model_name_or_path", "sft_model_path", "reward_model_path", "value_model_path", "model_name")

# Settings that make PPO on the built-in task learn within ~2 minutes on 2 CPU cores. They apply only to
# flags the user did not set, and only when no model flag is given (see docs/builtin_task.md).
BUILTIN_PPO_DEFAULTS = {
    "learning_rate": 6e-5,
    "per_device_train_batch_size": 64,
    "gradient_accumulation_steps": 1,
    "num_mini_batches": 1,
    "num_ppo_epochs": 4,
    "total_episodes": 10240,
    "local_rollout_forward_batch_size": 64,
    "per_device_eval_batch_size": 128,
    "stop_token": "eos",
    "kl_coef": 0.05,
    "temperature": 0.7,
    "num_sample_generations": 10,
    "save_steps": 0,
}


def uses_builtin_task(args: PPOConfig) -> bool:
    return not any(getattr(args, flag, None) for flag in MODEL_FLAGS)


def apply_builtin_task(
    args: PPOConfig, explicit: set[str] | frozenset[str] = frozenset(), preset: str = "default"
) -> None:
    """Point the model/data paths at the built-in task's assets (built on first use) and apply its defaults."""
    from rlhfkit.tasks import builtin_assets, load_task

    root = str(builtin_assets(preset))
    task = load_task(root)
    args.model_name_or_path = os.path.join(root, "tokenizer")
    args.sft_model_path = os.path.join(root, "sft")
    args.reward_model_path = os.path.join(root, "reward")
    if not args.dataset_name:
        args.dataset_name = os.path.join(root, "prompts")
    if not args.task:
        args.task = root
    defaults = dict(BUILTIN_PPO_DEFAULTS, response_length=task.max_new_tokens)
    for name, value in defaults.items():
        if name not in explicit:
            setattr(args, name, value)


def build_ppo_trainer(args: PPOConfig, explicit: set[str] | frozenset[str] = frozenset()):
    """A PPOTrainer from paths in ``args``. Without model flags, the built-in task is used."""
    from rlhfkit.trainers.ppo import PPOTrainer

    if uses_builtin_task(args):
        apply_builtin_task(args, explicit)
    sft_path = args.sft_model_path or args.model_name_or_path
    sft_flag = "sft_model_path" if args.sft_model_path else "model_name_or_path"
    tokenizer = load_tokenizer(args.model_name_or_path or sft_path, trust_remote_code=args.trust_remote_code)
    dtype = choose_dtype(args.bf16, args.fp16)
    policy = load_policy(sft_path, dtype, sft_flag, args.trust_remote_code)
    if args.reward_model_path is None:
        warnings.warn(
            "No --reward_model_path: scoring with a randomly initialised head on the SFT model. This only checks that "
            "training runs (like TRL's example with a dummy reward model); pass a trained reward model for real use.",
            stacklevel=2,
        )
    reward_path = args.reward_model_path or sft_path
    reward_flag = "reward_model_path" if args.reward_model_path else sft_flag
    reward_model = load_scalar_model(reward_path, dtype, reward_flag, args.trust_remote_code)
    value_model = None
    if args.value_model_path:
        value_model = load_scalar_model(args.value_model_path, dtype, "value_model_path", args.trust_remote_code)
    if reward_model.config.pad_token_id is None:
        reward_model.config.pad_token_id = tokenizer.pad_token_id
    if args.dataset_name is None:
        from rlhfkit.tasks import builtin_assets

        args.dataset_name = os.path.join(str(builtin_assets()), "prompts")
    train, test = load_prompt_splits(args.dataset_name, args.dataset_train_split, args.dataset_test_split)
    task = None
    if args.task:
        from rlhfkit.tasks import load_task

        task = load_task(args.task)
    return PPOTrainer(
        args=args,
        processing_class=tokenizer,
        model=policy,
        ref_model=None,
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=train,
        eval_dataset=test,
        task=task,
    )
