"""AsyncGenerationConfig: the settings of asynchronous generation, which PPOConfig and GRPOConfig share
(trainers/generation_worker.py, docs/async.md). The importance-sampling settings keep TRL 1.16's names."""

from __future__ import annotations

from dataclasses import field

from rlhfkit.config.rules import FLAG, OneOf, OrNone, integer, meta, number
from rlhfkit.config.train import CheckedConfig, config_dataclass
from rlhfkit.errors import ConfigError
from rlhfkit.ops.importance import IS_CORRECTION_MODES


@config_dataclass
class AsyncGenerationConfig(CheckedConfig):
    """Generation in a worker process beside the trainer, and the correction of the stale batches it makes."""

    async_generation: bool = field(
        default=False,
        metadata=meta(
            "Generate in a worker process beside the trainer, with a copy of the policy that receives the new weights "
            "over torch.distributed (gloo) after each update, so generation overlaps optimisation; a batch is at most "
            "max_staleness updates older than the weights it trains, and the loss corrects stale ones with the "
            "vllm_importance_sampling_* settings (docs/async.md). An update is a GRPO optimizer step (which must take "
            "one generation: steps_per_generation x num_iterations = gradient_accumulation_steps) or a PPO batch.",
            FLAG,
        ),
    )
    max_staleness: int = field(
        default=1,
        metadata=meta(
            "async_generation: how many updates older than the trainer's weights a generation may be (TRL's async "
            "trainers' name; they default to 4). 0 generates every batch on the current weights, which reproduces "
            "the synchronous run exactly (no overlap); 1 overlaps each update's optimisation with the next batch's "
            "generation.",
            integer(ge=0),
        ),
    )
    generation_threads: int = field(
        default=0,
        metadata=meta(
            "async_generation on a CPU: torch threads of the generation worker. 0: half of the trainer's threads (at "
            "least 1), and the trainer keeps the rest; a value > 0 gives the worker that many and leaves the "
            "trainer's as they are.",
            integer(ge=0),
        ),
    )
    vllm_importance_sampling_correction: bool = field(
        default=True,
        metadata=meta(
            "async_generation: weight the loss of a batch generated on older weights by pi_old / pi_behaviour (TRL "
            "1.16's correction, named after vLLM, its only sampler that needed it); batches generated on the "
            "current weights are not reweighted, as in the synchronous trainer.",
            FLAG,
        ),
    )
    vllm_importance_sampling_mode: str = field(
        default="sequence_mask",
        metadata=meta(
            "The correction's weight: per token or per sequence (the product over its tokens), truncated into "
            "[clip_min, clip_max] or set to 0 outside it (masked). TRL's default: sequence_mask.",
            OneOf(IS_CORRECTION_MODES),
        ),
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=3.0,
        metadata=meta("The correction's upper bound (None: unbounded).", OrNone(number(gt=0))),
    )
    vllm_importance_sampling_clip_min: float | None = field(
        default=None,
        metadata=meta("The correction's lower bound (None: unbounded).", OrNone(number(ge=0))),
    )

    def _check_combinations(self) -> None:
        super()._check_combinations()
        # The bounds only act with async_generation (as TRL's only with vLLM): checked when they will be used.
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if self.async_generation and low is not None and high is not None and low > high:
            raise ConfigError(
                f"vllm_importance_sampling_clip_min ({low}) is greater than vllm_importance_sampling_clip_max "
                f"({high}): the correction keeps its weight between them. Swap them, or unset one."
            )


def check_async_adapter(args) -> None:
    """async_generation (a training flag) against the model group's --use_peft, for PPOArguments and GRPOArguments."""
    if args.async_generation and args.use_peft:
        raise ConfigError(
            "async_generation with --use_peft is not supported yet: the generation worker holds a plain copy of the "
            "policy and receives whole weights, not an adapter. Leave --use_peft out, or leave async_generation off."
        )
