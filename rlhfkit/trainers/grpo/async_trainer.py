"""AsyncGRPOTrainer: TRL 1.16's ``trl.experimental.async_grpo.AsyncGRPOTrainer`` with its arguments, run as rlhfkit's
GRPO with asynchronous generation (config/async_grpo.py says how its config maps and what differs; docs/async.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from datasets import Dataset, IterableDataset
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlhfkit.config.async_grpo import AsyncGRPOConfig
from rlhfkit.errors import ConfigError
from rlhfkit.trainers.api import refuse_arguments
from rlhfkit.trainers.grpo import GRPOTrainer


class AsyncGRPOTrainer(GRPOTrainer):
    """GRPOTrainer under TRL's asynchronous trainer's signature: args is an AsyncGRPOConfig (default: one whose
    output_dir is ``<model name>-AsyncGRPO``, as TRL's), there is no eval_dataset, and TRL's vLLM plumbing
    (rollout_worker, weight_transfer) is not taken: rlhfkit's generation worker samples, and runs the tools and
    environments of multi-turn episodes (generation_worker.py)."""

    def __init__(
        self,
        model: str | nn.Module,
        reward_funcs: Callable | str | nn.Module | Sequence[Callable | str | nn.Module] | None = None,
        args: AsyncGRPOConfig | None = None,
        train_dataset: Dataset | IterableDataset | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        callbacks: Sequence | None = None,
        optimizers=(None, None),
        peft_config=None,
        tools: Sequence[Callable] | None = None,
        environment_factory=None,
        rollout_worker=None,
        weight_transfer=None,
    ):
        refuse_arguments(
            "AsyncGRPOTrainer",
            "these drive TRL's vLLM server; rlhfkit generates in its own worker process (async_generation), which "
            "takes no replacement. Pass None.",
            rollout_worker=rollout_worker,
            weight_transfer=weight_transfer,
        )
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = AsyncGRPOConfig(output_dir=f"{name.rstrip('/').split('/')[-1]}-AsyncGRPO")
        elif not isinstance(args, AsyncGRPOConfig):
            raise ConfigError(
                f"AsyncGRPOTrainer(args={type(args).__name__}(...)): pass an AsyncGRPOConfig (TRL's asynchronous "
                "defaults), or train a GRPOConfig with GRPOTrainer (async_generation=True generates asynchronously)."
            )
        super().__init__(
            model,
            reward_funcs,
            args,
            train_dataset=train_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
            tools=tools,
            environment_factory=environment_factory,
        )
