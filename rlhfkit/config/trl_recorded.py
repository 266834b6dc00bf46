"""What rlhfkit knows of TRL without importing it: the flags of TRL's commands and the defaults of TRL's fields.

rlhfkit does not import TRL at run time (TRL is a test and docs dependency), and TRL 1.12, TRL's last PPO, cannot be
installed beside 1.16; so these facts are recorded here, from the TRL wheels' sources. transformers' TrainingArguments,
which both TRL configs extend, is installed with rlhfkit: its names and defaults are read from it (config/trl_flags.py).
tests/config/test_trl_defaults.py compares the TRL 1.16 tables with the installed TRL, so they cannot drift.

A leaf (standard library only): config/trl_flags.py, which the configs import, reads it, and so does the docs
generator's table of the defaults that differ from TRL's (docs/trl_defaults.py, outside the package: it imports TRL).
"""

from __future__ import annotations

from typing import Any

# Flags of TRL's own dataclasses (not TrainingArguments'), in their order, from the TRL wheels' sources.
TRL_PPO_FLAGS = (  # TRL 1.12: experimental/ppo/ppo_config.py PPOConfig, scripts/utils.py ScriptArguments, ModelConfig
    "dataset_num_proc", "num_mini_batches", "total_episodes", "local_rollout_forward_batch_size",
    "num_sample_generations", "response_length", "stop_token", "stop_token_id", "temperature", "missing_eos_penalty",
    "sft_model_path", "world_size", "num_total_batches", "micro_batch_size", "local_batch_size", "batch_size",
    "local_mini_batch_size", "mini_batch_size", "reward_model_path", "model_adapter_name", "ref_adapter_name",
    "num_ppo_epochs", "whiten_rewards", "kl_coef", "kl_estimator", "cliprange", "vf_coef", "cliprange_value", "gamma",
    "lam", "ds3_gather_for_generation",
    "dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split", "dataset_streaming",
    "ignore_bias_buffers",
    "model_name_or_path", "model_revision", "dtype", "attn_implementation", "use_peft", "lora_r", "lora_alpha",
    "lora_dropout", "lora_target_modules", "lora_target_parameters", "lora_modules_to_save", "lora_task_type",
    "use_rslora", "use_dora", "load_in_8bit", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant",
    "bnb_4bit_quant_storage",
)  # fmt: skip
TRL_GRPO_CONFIG_FIELDS = (  # TRL 1.16: trainer/grpo_config.py GRPOConfig's own fields, in its order
    "model_init_kwargs", "trust_remote_code", "router_aux_loss_coef", "disable_dropout", "cast_lm_head_to_fp32",
    "num_generations", "num_generations_eval", "max_completion_length", "ds3_gather_for_generation",
    "shuffle_dataset", "pad_to_multiple_of", "generation_batch_size", "steps_per_generation", "temperature", "top_p",
    "top_k", "min_p", "generation_kwargs", "chat_template_kwargs", "repetition_penalty", "cache_implementation",
    "use_vllm", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_structured_outputs_regex",
    "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
    "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size", "beta", "num_iterations",
    "epsilon", "delta", "epsilon_high", "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos",
    "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "importance_sampling_level", "reward_weights",
    "multi_objective_aggregation", "scale_rewards", "loss_type", "mask_truncated_completions", "sync_ref_model",
    "ref_model_mixup_alpha", "ref_model_sync_steps", "top_entropy_quantile", "entropy_coef", "use_adaptive_entropy",
    "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target", "max_tool_calling_iterations",
    "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min", "off_policy_mask_threshold", "use_bias_correction_kl", "log_completions",
    "log_multimodal", "num_completions_to_print", "log_unique_prompts", "log_completions_hub_repo",
    "use_transformers_continuous_batching", "transformers_continuous_batching_config", "use_transformers_paged",
    "vllm_importance_sampling_cap",
)  # fmt: skip
TRL_GRPO_FLAGS = (  # TRL 1.16: scripts/grpo.py GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig
    "dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split", "dataset_streaming", "ignore_bias_buffers",
    "reward_model_name_or_path", "reward_funcs",
    *TRL_GRPO_CONFIG_FIELDS,
    "model_name_or_path", "model_revision", "dtype", "attn_implementation", "use_peft", "lora_r", "lora_alpha",
    "lora_dropout", "lora_target_modules", "lora_target_parameters", "lora_modules_to_save", "lora_task_type",
    "use_rslora", "use_dora", "load_in_8bit", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant",
    "bnb_4bit_quant_storage", "datasets", "streaming", "test_split_size",
)  # fmt: skip
TRL_FLAGS = {"ppo": TRL_PPO_FLAGS, "grpo": TRL_GRPO_FLAGS}

# TRL 1.12.0 (trl-1.12.0-py3-none-any.whl): the defaults of trl/experimental/ppo/ppo_config.py PPOConfig's own fields
# and of the TrainingArguments fields trl/trainer/base_config.py _BaseConfig (its parent) overrides; every other
# TrainingArguments field keeps transformers' default.
TRL_1_12_PPO_DEFAULTS: dict[str, Any] = {
    # _BaseConfig (all TRL trainers' configs)
    "logging_steps": 10,
    "gradient_checkpointing": True,
    "bf16": None,
    "lr_scheduler_kwargs": None,
    # PPOConfig
    "learning_rate": 3e-6,
    "dataset_num_proc": None,
    "num_mini_batches": 1,
    "total_episodes": None,
    "local_rollout_forward_batch_size": 64,
    "num_sample_generations": 10,
    "response_length": 53,
    "stop_token": None,
    "stop_token_id": None,
    "temperature": 0.7,
    "missing_eos_penalty": None,
    "sft_model_path": "EleutherAI/pythia-160m",
    "world_size": None,  # world_size to mini_batch_size: TRL fills them in at run time
    "num_total_batches": None,
    "micro_batch_size": None,
    "local_batch_size": None,
    "batch_size": None,
    "local_mini_batch_size": None,
    "mini_batch_size": None,
    "reward_model_path": "EleutherAI/pythia-160m",
    "model_adapter_name": None,
    "ref_adapter_name": None,
    "num_ppo_epochs": 4,
    "whiten_rewards": False,
    "kl_coef": 0.05,
    "kl_estimator": "k1",
    "cliprange": 0.2,
    "vf_coef": 0.1,
    "cliprange_value": 0.2,
    "gamma": 1.0,
    "lam": 0.95,
    "ds3_gather_for_generation": True,
}

# TRL 1.16: trl/trainer/grpo_config.py GRPOConfig, the TrainingArguments fields it (or _BaseConfig) overrides, then its
# own fields in its order; every other TrainingArguments field keeps transformers' default.
TRL_1_16_GRPO_DEFAULTS: dict[str, Any] = {
    "learning_rate": 1e-06, "bf16": None, "gradient_checkpointing": True, "logging_steps": 10,
    "remove_unused_columns": False,
    "model_init_kwargs": None, "trust_remote_code": False, "router_aux_loss_coef": None, "disable_dropout": False,
    "cast_lm_head_to_fp32": False, "num_generations": 8, "num_generations_eval": None, "max_completion_length": 512,
    "ds3_gather_for_generation": True, "shuffle_dataset": True, "pad_to_multiple_of": "auto",
    "generation_batch_size": None, "steps_per_generation": None, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
    "min_p": None, "generation_kwargs": None, "chat_template_kwargs": None, "repetition_penalty": 1.0,
    "cache_implementation": None, "use_vllm": False, "vllm_mode": "colocate", "vllm_model_impl": "vllm",
    "vllm_enable_sleep_mode": False, "vllm_structured_outputs_regex": None, "vllm_server_base_url": None,
    "vllm_server_host": "0.0.0.0", "vllm_server_port": 8000, "vllm_server_timeout": 240.0, "vllm_group_port": 51216,
    "vllm_gpu_memory_utilization": 0.3, "vllm_max_model_length": None, "vllm_tensor_parallel_size": 1, "beta": 0.0,
    "num_iterations": 1, "epsilon": 0.2, "delta": None, "epsilon_high": None, "sapo_temperature_neg": 1.05,
    "sapo_temperature_pos": 1.0, "vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0,
    "vespo_lambda_neg": 2.0, "importance_sampling_level": "token", "reward_weights": None,
    "multi_objective_aggregation": "sum_then_normalize", "scale_rewards": "group", "loss_type": "dapo",
    "mask_truncated_completions": False, "sync_ref_model": False, "ref_model_mixup_alpha": 0.6,
    "ref_model_sync_steps": 512, "top_entropy_quantile": 1.0, "entropy_coef": 0.0, "use_adaptive_entropy": False,
    "entropy_coef_min": 0.0, "entropy_coef_max": 1.0, "entropy_coef_delta": 0.005, "entropy_target": 0.2,
    "max_tool_calling_iterations": None, "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_max": 3.0,
    "vllm_importance_sampling_clip_min": None, "off_policy_mask_threshold": None, "use_bias_correction_kl": True,
    "log_completions": False, "log_multimodal": True, "num_completions_to_print": None, "log_unique_prompts": False,
    "log_completions_hub_repo": None, "use_transformers_continuous_batching": False,
    "transformers_continuous_batching_config": None, "use_transformers_paged": False,
    "vllm_importance_sampling_cap": None,
}  # fmt: skip

# TRL 1.16"s other groups of flags: scripts/grpo.py GRPOScriptArguments (scripts/utils.py ScriptArguments and two
# more), ModelConfig and DatasetMixtureConfig. TRL 1.12"s ScriptArguments and ModelConfig have the same defaults.
TRL_SCRIPT_DEFAULTS: dict[str, Any] = {
    "dataset_name": None, "dataset_config": None, "dataset_train_split": "train", "dataset_test_split": "test",
    "dataset_streaming": False, "ignore_bias_buffers": False, "reward_model_name_or_path": None, "reward_funcs": None,
    "model_name_or_path": None, "model_revision": "main", "dtype": "float32", "attn_implementation": None,
    "use_peft": False, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target_modules": None,
    "lora_target_parameters": None, "lora_modules_to_save": None, "lora_task_type": "CAUSAL_LM", "use_rslora": False,
    "use_dora": False, "load_in_8bit": False, "load_in_4bit": False, "bnb_4bit_quant_type": "nf4",
    "use_bnb_nested_quant": False, "bnb_4bit_quant_storage": None, "datasets": [], "streaming": False,
    "test_split_size": None,
}  # fmt: skip

# The defaults of TRL's training config of each command (TrainingArguments' others are read from transformers).
TRL_DEFAULTS = {"ppo": TRL_1_12_PPO_DEFAULTS, "grpo": TRL_1_16_GRPO_DEFAULTS}
