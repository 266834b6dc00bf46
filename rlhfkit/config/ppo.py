"""PPOConfig: the hyper-parameters of PPOTrainer, with the names, meanings and defaults of TRL's PPOConfig."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field

from rlhfkit.config.asynchronous import AsyncGenerationConfig, check_async_adapter
from rlhfkit.config.rules import (
    FLAG,
    JSON_OBJECT,
    PATH,
    TEXT,
    ListOf,
    OneOf,
    OrNone,
    inherited,
    integer,
    meta,
    number,
)
from rlhfkit.config.script import REWARD_FUNCS_HELP, ModelConfig, ScriptArguments, check_adapter_merge
from rlhfkit.config.train import TrainConfig, config_dataclass
from rlhfkit.errors import ConfigError
from rlhfkit.ops.kl import KL_ESTIMATORS

# The KL penalty in PPO's reward offers what TRL's PPOConfig offers: every estimator of ops but k2 (biased).
PPO_KL_ESTIMATORS = tuple(e for e in KL_ESTIMATORS if e != "k2")


@config_dataclass
class PPOConfig(AsyncGenerationConfig, TrainConfig):
    """Hyper-parameters of :class:`rlhfkit.PPOTrainer` (names and meanings as in TRL's ``PPOConfig``)."""

    trl_command = "ppo"  # the keywords it does not take are explained as `trl ppo`'s flags (config/trl_flags.py)
    exp_name: str = inherited(TrainConfig, "exp_name", "ppo")
    sft_model_path: str | None = field(
        default=None,
        metadata=meta(
            "Policy and reference initialisation (hub id or local directory). Default: model_name_or_path.",
            OrNone(PATH),
        ),
    )
    reward_model_path: str | None = field(
        default=None,
        metadata=meta(
            "Reward model (sequence classification, 1 label, the policy's vocabulary; hub id or local directory); "
            "the value model starts from it. Optional with reward_funcs; one of the two is required (outside the "
            "built-in task).",
            OrNone(PATH),
        ),
    )
    value_model_path: str | None = field(
        default=None,
        metadata=meta(
            "Value model initialisation. Default: reward_model_path; with reward_funcs alone, the policy's weights "
            "with a fresh score head that starts at 0.",
            OrNone(PATH),
        ),
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata=meta(
            f"{REWARD_FUNCS_HELP} Scored beside reward_model_path, which becomes optional.", OrNone(ListOf(TEXT))
        ),
    )

    # --- batch sizes and length of training ------------------------------------------------------
    gradient_accumulation_steps: int = inherited(
        TrainConfig,
        "gradient_accumulation_steps",
        help="Each device collects per_device_train_batch_size x gradient_accumulation_steps rollouts per update; "
        "a multiple of num_mini_batches.",
    )
    num_mini_batches: int = field(
        default=1, metadata=meta("Mini-batches (optimizer steps) per PPO epoch.", integer(ge=1))
    )
    num_ppo_epochs: int = field(default=4, metadata=meta("Passes over each rollout batch.", integer(ge=1)))
    total_episodes: int | None = field(
        default=None,
        metadata=meta(
            "Total prompts to train on (the run has ceil(total_episodes / rollouts per update) PPO updates). "
            "Default: num_train_epochs x dataset size. Set at most one of this and max_steps.",
            OrNone(integer(ge=1, example=10000)),
        ),
    )
    max_steps: int = field(
        default=-1,
        metadata=meta(
            "PPO updates to train for (each: one rollout batch, num_ppo_epochs x num_mini_batches optimizer steps); "
            "total_episodes then follows from it. -1: total_episodes decides. TRL 1.12's PPO ignores max_steps, so "
            "rlhfkit refuses it together with total_episodes.",
            integer(ge=1, also=(-1,)),
        ),
    )
    local_rollout_forward_batch_size: int = field(
        default=64, metadata=meta("Per-device batch size of generation and scoring forwards.", integer(ge=1))
    )

    # --- generation --------------------------------------------------------------------------------
    response_length: int = field(default=53, metadata=meta("Maximum new tokens per response.", integer(ge=1)))
    stop_token: str | None = field(
        default=None,
        metadata=meta("'eos': truncate responses after the EOS token.", OrNone(OneOf(("eos",), example="eos"))),
    )
    stop_token_id: int | None = field(
        default=None,
        metadata=meta("Truncate responses after this token id.", OrNone(integer(ge=0, why="a token id"))),
    )
    missing_eos_penalty: float | None = field(
        default=None,
        metadata=meta(
            "Subtract this from the score of responses without the stop token (TRL: a positive value).",
            OrNone(number(ge=0, example=1.0)),
        ),
    )
    non_eos_penalty: bool = field(
        default=False,
        metadata=meta("Replace the score of responses without the stop token by penalty_reward_value.", FLAG),
    )
    penalty_reward_value: float = field(default=-1.0, metadata=meta("Score given by non_eos_penalty.", number()))
    max_tool_calling_iterations: int | None = field(
        default=None,
        metadata=meta(
            "With PPOTrainer(tools=[...]): rounds of tool results an episode gets at most; unset: no cap (an episode "
            "ends when a turn calls no tool or the completion reaches response_length). GRPOConfig's field, which "
            "TRL's PPO does not have. docs/agents.md.",
            OrNone(integer(ge=0)),
        ),
    )

    # --- PPO ---------------------------------------------------------------------------------------
    kl_coef: float = field(
        default=0.05, metadata=meta("KL penalty coefficient (initial value when adaptive).", number(ge=0))
    )
    kl_estimator: str = field(
        default="k1",
        metadata=meta("Per-token KL estimator in the reward: k1 (log-ratio) or k3.", OneOf(PPO_KL_ESTIMATORS)),
    )
    kl_target: float | None = field(
        default=None,
        metadata=meta("Adaptive KL: target of objective/kl (off when unset).", OrNone(number(gt=0, example=6.0))),
    )
    kl_horizon: int = field(default=10000, metadata=meta("Adaptive KL: horizon in episodes.", integer(ge=1)))
    cliprange: float = field(default=0.2, metadata=meta("Policy ratio clip range.", number(gt=0)))
    cliprange_value: float = field(default=0.2, metadata=meta("Value clip range.", number(gt=0)))
    vf_coef: float = field(default=0.1, metadata=meta("Value loss coefficient.", number(ge=0)))
    gamma: float = field(default=1.0, metadata=meta("Discount factor.", number(ge=0, le=1)))
    lam: float = field(default=0.95, metadata=meta("GAE lambda.", number(ge=0, le=1)))
    whiten_rewards: bool = field(
        default=False, metadata=meta("Whiten the per-token rewards (keeping their mean) before GAE.", FLAG)
    )

    # --- older TRL API (accepted as aliases) -------------------------------------------------------
    log_with: str | None = field(default=None, metadata=meta("Alias of report_to (older TRL API).", OrNone(TEXT)))
    project_kwargs: dict | str | None = field(
        default=None,
        metadata=meta(
            "Older TRL API: {'logging_dir': PATH} sets logging_dir (JSON on the command line).", OrNone(JSON_OBJECT)
        ),
    )

    def _apply_aliases(self) -> None:
        if self.log_with:
            self.report_to = [self.log_with]
        if (
            isinstance(self.project_kwargs, Mapping)
            and self.project_kwargs.get("logging_dir")
            and not self.logging_dir
        ):
            self.logging_dir = str(self.project_kwargs["logging_dir"])
        super()._apply_aliases()

    def weighted_rewards(self) -> list[str] | None:
        if not self.reward_funcs:
            return None
        return [*self.reward_funcs, *([self.reward_model_path] if self.reward_model_path else [])]

    def _check_combinations(self) -> None:
        super()._check_combinations()
        if self.max_steps > 0 and self.total_episodes is not None:
            raise ConfigError(
                f"max_steps={self.max_steps} and total_episodes={self.total_episodes}: both set the length of a PPO "
                "run (max_steps counts PPO updates, total_episodes prompts) and TRL's PPO has no rule for which wins. "
                "Pass only one of --max_steps and --total_episodes."
            )
        # A mini-batch, per_device x GA / num_mini_batches rollouts, must be a whole number of per_device
        # micro-batches: GA a multiple of num_mini_batches (ppo_batch_sizes relies on it).
        accumulation, mini_batches = self.gradient_accumulation_steps, self.num_mini_batches
        if accumulation % mini_batches:
            fewer = max(d for d in range(1, mini_batches) if accumulation % d == 0)
            raise ConfigError(
                f"gradient_accumulation_steps={accumulation}, num_mini_batches={mini_batches}: "
                "gradient_accumulation_steps must be a multiple of num_mini_batches, so that each mini-batch is a "
                f"whole number of per_device_train_batch_size ({self.per_device_train_batch_size}) micro-batches. "
                f"Pass e.g. --gradient_accumulation_steps {mini_batches}, or --num_mini_batches {fewer}."
            )


@config_dataclass
class PPOArguments(PPOConfig, ScriptArguments, ModelConfig):
    """Every flag of ``rlhfkit ppo`` in one dataclass: PPOConfig's training arguments with TRL's ScriptArguments and
    ModelConfig groups (config/script.py). ``PPOConfig(model_name_or_path=...)`` builds one; a trainer given a plain
    PPOConfig (a TRL script's, which loaded its models and data itself) completes it with the groups' defaults."""

    model_name: str | None = field(
        default=None, metadata=meta("Alias of model_name_or_path (older TRL API's PPOConfig).", OrNone(PATH))
    )

    def _apply_aliases(self) -> None:
        if self.model_name and not self.model_name_or_path:
            self.model_name_or_path = self.model_name
        super()._apply_aliases()

    def _check_combinations(self) -> None:
        super()._check_combinations()
        check_adapter_merge(self)
        check_async_adapter(self)


PPOConfig.full_arguments = PPOArguments
