"""Training configurations with TRL's field names, so a TRL command line (or script) works unchanged.

- rules.py: the values each field accepts (declared next to the field, checked as a config is built, shown in --help);
- train.py: TrainConfig, what every trainer shares; ppo.py, grpo.py: PPOConfig and GRPOConfig (training arguments,
  as TRL's), and PPOArguments and GRPOArguments (every flag of `rlhfkit ppo` / `rlhfkit grpo`);
- asynchronous.py: AsyncGenerationConfig, the asynchronous generation settings PPOConfig and GRPOConfig share;
- async_grpo.py: AsyncGRPOConfig, TRL's asynchronous GRPO config mapped onto GRPO with async_generation;
- script.py: TRL's other groups of flags, ScriptArguments (GRPOScriptArguments) and ModelConfig;
- batch_sizes.py: the sizes that follow from the flags, the number of processes and the dataset (exact divisions);
- parse.py: from a command line and a --config YAML file to a checked config;
- trl_flags.py: TRL's flags that rlhfkit takes at TRL's default only, and why; trl_flags_docs.py: their page
  (docs/trl-flags.md); trl_recorded.py: TRL's flag names and defaults, recorded from its wheels (rlhfkit never
  imports TRL; the table of defaults that differ from TRL's is rendered by docs/trl_defaults.py).
"""

from rlhfkit.config.async_grpo import AsyncGRPOArguments, AsyncGRPOConfig
from rlhfkit.config.batch_sizes import (
    GRPOBatchSizes,
    PPOBatchSizes,
    exact_div,
    grpo_batch_sizes,
    grpo_generation_shape,
    ppo_batch_sizes,
)
from rlhfkit.config.grpo import GRPOArguments, GRPOConfig
from rlhfkit.config.ppo import PPO_KL_ESTIMATORS, PPOArguments, PPOConfig
from rlhfkit.config.script import GRPOScriptArguments, ModelConfig, ScriptArguments
from rlhfkit.config.train import (
    EVAL_STRATEGIES,
    LOGGING_STRATEGIES,
    SAVE_STRATEGIES,
    TrainConfig,
    config_field_names,
)
from rlhfkit.errors import ConfigError

__all__ = [
    "AsyncGRPOArguments",
    "AsyncGRPOConfig",
    "EVAL_STRATEGIES",
    "LOGGING_STRATEGIES",
    "PPO_KL_ESTIMATORS",
    "SAVE_STRATEGIES",
    "ConfigError",
    "GRPOArguments",
    "GRPOBatchSizes",
    "GRPOConfig",
    "GRPOScriptArguments",
    "ModelConfig",
    "PPOArguments",
    "PPOBatchSizes",
    "PPOConfig",
    "ScriptArguments",
    "TrainConfig",
    "config_field_names",
    "exact_div",
    "grpo_batch_sizes",
    "grpo_generation_shape",
    "ppo_batch_sizes",
]
