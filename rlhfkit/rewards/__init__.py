"""Scores from reward models and reward functions: the reward sources both trainers score completions with.

sources.py: RewardSources (names, weights, metrics; what the functions log) and its metric window; calling.py: calling
reward functions as TRL does and checking their values; reward_models.py: a reward model's score at the last real
token; references.py: --reward_funcs names to callables. The public names are imported from here. The EOS trick
(apply_eos_trick) is a sequence op (rlhfkit/ops/sequences.py), imported here too for the trainers."""

from rlhfkit.ops.sequences import apply_eos_trick
from rlhfkit.rewards.calling import (
    TRAINER_KWARGS,
    RewardOutput,
    check_reward_values,
    run_awaitables,
    score_completions,
    takes_trainer_kwargs,
    weighted_total,
)
from rlhfkit.rewards.references import (
    REFERENCE_FORMS,
    import_reward_function,
    resolve_reward_funcs,
)
from rlhfkit.rewards.reward_models import (
    RewardModelFunction,
    reward_model_scores,
)
from rlhfkit.rewards.sources import (
    LoggedMetricsWindow,
    RewardSources,
    check_unique_names,
    reward_name,
    reward_sources,
    reward_weights,
)

__all__ = [
    "LoggedMetricsWindow",
    "REFERENCE_FORMS",
    "RewardModelFunction",
    "RewardOutput",
    "RewardSources",
    "TRAINER_KWARGS",
    "apply_eos_trick",
    "check_reward_values",
    "check_unique_names",
    "import_reward_function",
    "resolve_reward_funcs",
    "reward_model_scores",
    "reward_name",
    "reward_sources",
    "reward_weights",
    "run_awaitables",
    "score_completions",
    "takes_trainer_kwargs",
    "weighted_total",
]
