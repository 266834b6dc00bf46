"""The benchmark's settings: one table per trainer, with the field names rlhfkit and TRL share.

``SHARED`` values are given to both libraries under the same name (rlhfkit as ``--name value`` flags of
``rlhfkit ppo|grpo``, TRL as ``PPOConfig(...)`` / ``GRPOConfig(...)`` keyword arguments). ``RLHFKIT`` and ``TRL`` hold
what only one side has a name for; each entry says why. Everything that changes the work is set explicitly, even
where both defaults agree, so a change of defaults in either library cannot skew the comparison.
"""

from __future__ import annotations

TRL_PINS = {"ppo": "trl==1.12.0", "grpo": "trl==1.16.0"}

PPO_SHARED = {
    # batch arithmetic (issue 7: batch 16, 512 episodes, 4 PPO epochs): 32 updates x 4 optimizer steps
    "per_device_train_batch_size": 16,
    "gradient_accumulation_steps": 1,
    "num_mini_batches": 1,
    "num_ppo_epochs": 4,
    "total_episodes": 512,
    "local_rollout_forward_batch_size": 16,  # generation and scoring chunk = the whole rollout batch
    # generation: 48 new tokens, always (the fixed-length view has no reachable EOS, see assets.py)
    "response_length": 48,
    "temperature": 0.7,
    "stop_token": None,  # no truncation (there is nothing to truncate at)
    "stop_token_id": None,
    "missing_eos_penalty": None,
    # PPO objective
    "learning_rate": 3e-5,
    "kl_coef": 0.05,
    "kl_estimator": "k1",
    "cliprange": 0.2,
    "cliprange_value": 0.2,
    "vf_coef": 0.1,
    "gamma": 1.0,
    "lam": 0.95,
    "whiten_rewards": False,
    "weight_decay": 0.0,
    "adam_epsilon": 1e-8,
    # precision and side work
    "bf16": False,  # fp32 on both sides (TRL's default is bf16, ~9x slower on a CPU without bf16 units)
    "fp16": False,
    "num_sample_generations": 0,  # no sample generations / evaluation during training
    "logging_steps": 1,  # TRL's PPO logs every update whatever this says; rlhfkit does the same with 1
    "report_to": "none",
}
PPO_RLHFKIT = {
    "save_steps": 0,  # no intermediate checkpoints (the final save is part of rlhfkit's train())
}
PPO_TRL = {
    "gradient_checkpointing": False,  # TRL's default is True
    "save_strategy": "no",
    # max_grad_norm: TRL's PPO loop never clips; rlhfkit's PPO default (None) does not either.
}

GRPO_SHARED = {
    # batch arithmetic (issue 7: batch 16 = 2 prompts x 8 generations, 512 completions): 32 steps
    "per_device_train_batch_size": 16,
    "gradient_accumulation_steps": 1,
    "num_generations": 8,
    "max_steps": 32,
    "num_iterations": 1,
    # generation: 48 new tokens, always
    "max_completion_length": 48,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    # GRPO objective
    "learning_rate": 3e-5,
    "beta": 0.04,  # k3 KL to a reference model
    "use_bias_correction_kl": True,  # both defaults (TRL 1.16, rlhfkit): the k3 term times the importance ratio
    "epsilon": 0.2,
    "epsilon_high": 0.2,
    "loss_type": "dapo",
    "scale_rewards": "group",
    "mask_truncated_completions": False,  # every completion is cut at 48 tokens: masking them would empty the loss
    "max_grad_norm": 1.0,
    "weight_decay": 0.0,
    "adam_epsilon": 1e-8,
    # precision and side work
    "bf16": False,
    "fp16": False,
    "logging_steps": 1,
    "log_completions": False,
    "report_to": "none",
}
GRPO_RLHFKIT = {
    "save_steps": 0,
    "num_sample_generations": 0,  # rlhfkit's periodic completions table + greedy evaluation: off (TRL has none)
}
GRPO_TRL = {
    "gradient_checkpointing": False,  # TRL's default is True
    "use_vllm": False,
    "disable_dropout": True,  # rlhfkit always disables dropout (the Llama here has none anyway)
    "save_strategy": "no",
    "lr_scheduler_type": "linear",  # TrainingArguments' default, as rlhfkit's linear decay to 0
}

# --quick: the same code paths at toy size (a minute or two per library).
QUICK = {
    "ppo": {"total_episodes": 32, "response_length": 16},
    "grpo": {"max_steps": 2, "max_completion_length": 16},
}

EVAL_MAX_NEW_TOKENS = 16  # greedy success check: answers are at most 6 digits + <eos>


def trainer_settings(trainer: str, quick: bool = False) -> dict:
    """{'shared', 'rlhfkit', 'trl', 'episodes', 'new_tokens'} for one trainer."""
    if trainer == "ppo":
        shared, rk, trl = dict(PPO_SHARED), dict(PPO_RLHFKIT), dict(PPO_TRL)
    else:
        shared, rk, trl = dict(GRPO_SHARED), dict(GRPO_RLHFKIT), dict(GRPO_TRL)
    if quick:
        shared.update(QUICK[trainer])
    if trainer == "ppo":
        batch = shared["per_device_train_batch_size"] * shared["gradient_accumulation_steps"]
        episodes = -(-shared["total_episodes"] // batch) * batch
        new_tokens = shared["response_length"]
    else:
        per_generation = shared["per_device_train_batch_size"] * shared["gradient_accumulation_steps"]
        episodes = -(-shared["max_steps"] // shared["num_iterations"]) * per_generation
        new_tokens = shared["max_completion_length"]
    return {"shared": shared, "rlhfkit": rk, "trl": trl, "episodes": episodes, "new_tokens": new_tokens}
