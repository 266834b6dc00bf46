"""AsyncGRPOConfig: TRL 1.16's ``trl.experimental.async_grpo.AsyncGRPOConfig`` mapped onto GRPO with
``async_generation`` (docs/async.md), so a TRL asynchronous GRPO script runs with the import changed.

TRL's asynchronous trainer samples on a vLLM server while the trainer optimises, drops samples more than
``max_staleness`` weight updates old, trains a clipped surrogate without a KL term, normalised by the tokens of each
micro-batch. rlhfkit's closest run: GRPO with ``async_generation=True`` (a worker process beside the trainer, holding a
copy of the policy that gets the new weights after every update), ``beta=0`` (no reference model), ``loss_type="bnpo"``
(the token mean of each micro-batch) and TRL's asynchronous defaults below. What differs: rlhfkit corrects a stale batch
by importance sampling (the ``vllm_importance_sampling_*`` settings) instead of only discarding beyond max_staleness,
and its group advantages divide by the unbiased standard deviation (TRL's asynchronous worker: the population's).

TRL's fields of the vLLM server and of its rollout queue are taken at their defaults, which ask for nothing rlhfkit does
differently; another value exits with the reason (:data:`SERVER_FIELDS`).
"""

from __future__ import annotations

from dataclasses import field

from rlhfkit.config.grpo import GRPOArguments, GRPOConfig
from rlhfkit.config.rules import FLAG, TEXT, OrNone, inherited, integer, meta, number
from rlhfkit.config.train import TrainConfig, config_dataclass
from rlhfkit.errors import ConfigError

# TRL's asynchronous fields rlhfkit takes at their default only: field -> why another value cannot be honoured.
NO_SERVER = "rlhfkit samples in its own worker process, with no vLLM server"
SERVER_FIELDS = {
    "vllm_server_base_url": NO_SERVER,
    "vllm_server_timeout": NO_SERVER,
    "request_timeout": NO_SERVER,
    "weight_sync_timeout": f"{NO_SERVER}; the weights reach the worker by a torch.distributed broadcast",
    "weight_sync_steps": "the worker gets the new weights after every update (max_staleness bounds how old a batch "
    "may be)",
    "max_inflight_tasks": "the worker generates one batch ahead at a time, of the trainer's batch size",
    "queue_maxsize": "the worker hands over whole batches, max_staleness at most waiting",
    "heartbeat_stale_after_s": "a worker that dies ends the run with a checkpoint at once, and one that hangs is not "
    "timed out",
    "token_budget": "rlhfkit's training forwards take fixed micro-batches of per_device_train_batch_size completions "
    "(no token-budgeted packing)",
    "fork_threshold_tokens": "rlhfkit's episodes never re-tokenize a conversation: each turn's tokens are appended as "
    "sampled and the tool results as the chat template renders them after a turn, so there is no drift to fork on",
}


@config_dataclass
class AsyncGRPOConfig(GRPOConfig):
    """TRL 1.16's AsyncGRPOConfig: GRPO with ``async_generation`` and TRL's asynchronous defaults (module
    docstring). Every GRPOConfig field is taken too."""

    exp_name: str = inherited(TrainConfig, "exp_name", "async_grpo")
    async_generation: bool = inherited(GRPOConfig, "async_generation", True)
    max_staleness: int = inherited(GRPOConfig, "max_staleness", 4)
    beta: float = inherited(GRPOConfig, "beta", 0.0)
    loss_type: str = inherited(GRPOConfig, "loss_type", "bnpo")
    max_completion_length: int = inherited(GRPOConfig, "max_completion_length", 2048)
    logging_steps: float = inherited(TrainConfig, "logging_steps", 1)
    lr_scheduler_type: str = inherited(TrainConfig, "lr_scheduler_type", "constant")
    ignore_data_skip: bool = field(
        default=True,
        metadata=meta(
            "TRL's asynchronous default (its data-skipping replay does not apply to a rollout queue). Either value "
            "changes nothing: a resumed rlhfkit run continues the prompt order exactly.",
            FLAG,
        ),
    )
    # TRL's vLLM server and rollout queue: their defaults only (SERVER_FIELDS says why).
    vllm_server_base_url: str = field(
        default="http://localhost:8000", metadata=meta("TRL's vLLM server: " + NO_SERVER + ".", TEXT)
    )
    vllm_server_timeout: float = field(default=240.0, metadata=meta("TRL's vLLM server's start-up wait.", number()))
    request_timeout: int = field(default=600, metadata=meta("TRL's timeout of a request to vLLM.", integer()))
    weight_sync_timeout: int = field(default=1800, metadata=meta("TRL's weight transfer timeout.", integer()))
    weight_sync_steps: int = field(default=1, metadata=meta("Updates between weight syncs: 1 only.", integer()))
    max_inflight_tasks: int = field(default=-1, metadata=meta("TRL's concurrent vLLM requests.", integer()))
    queue_maxsize: int = field(default=1024, metadata=meta("TRL's rollout queue size.", integer()))
    heartbeat_stale_after_s: float = field(default=300.0, metadata=meta("TRL's worker heartbeat.", number()))
    token_budget: int | None = field(
        default=None, metadata=meta("TRL's token-budgeted micro-batches: unset only.", OrNone(integer()))
    )
    fork_threshold_tokens: int = field(default=1024, metadata=meta("TRL's multi-turn row forking.", integer()))

    def _check_combinations(self) -> None:
        super()._check_combinations()
        defaults = type(self).__dataclass_fields__
        for name, why in SERVER_FIELDS.items():
            value, default = getattr(self, name), defaults[name].default
            if value != default:
                raise ConfigError(
                    f"AsyncGRPOConfig({name}={value!r}): rlhfkit takes TRL's {name} at its default ({default!r}) "
                    f"only: {why}. Leave it out."
                )
        if not self.async_generation:
            raise ConfigError(
                "AsyncGRPOConfig(async_generation=False): the asynchronous trainer generates in a worker process. Use "
                "GRPOConfig for synchronous GRPO."
            )


@config_dataclass
class AsyncGRPOArguments(AsyncGRPOConfig, GRPOArguments):
    """AsyncGRPOConfig with the script and model groups (GRPOArguments'): what the trainer completes it into."""


AsyncGRPOConfig.full_arguments = AsyncGRPOArguments
