"""Failures injected into a built trainer, for the labelled run set: each changes one thing, from a given step.

An injection is a function (trainer, **settings) -> None that patches the trainer before ``train()``. "From step k"
means k and later (steps are 1-based; during step k the run's progress.step is k - 1).
"""

from __future__ import annotations

import functools

import torch

from bench.health.agents import INJECTIONS as AGENT_INJECTIONS
from rlhfkit.rewards import RewardModelFunction


def _current_step(trainer) -> int:
    return trainer.run.progress.step + 1


def learning_rate_from(trainer, step: int, learning_rate: float) -> None:
    """The learning rate becomes `learning_rate` from `step` on (a schedule mistake, a resumed run with a typo)."""
    scheduled = trainer.run.lr_at
    trainer.run.lr_at = lambda s: learning_rate if s >= step else scheduled(s)


class _WrappedRewardModel(RewardModelFunction):
    """A reward model whose scores pass through a wrapper: still a RewardModelFunction, so the trainer keeps giving it
    the policy's token ids (a plain function in its place would re-tokenise the text and score something else)."""

    def __init__(self, source: RewardModelFunction, call):
        self.__dict__.update(source.__dict__)
        self._call = call

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)


def _wrap_rewards(trainer, wrap) -> None:
    """Replace every reward source of the trainer (functions and reward models) by wrap(source)."""
    for i, source in enumerate(trainer.rewards.funcs):
        if isinstance(source, RewardModelFunction):
            trainer.rewards.funcs[i] = _WrappedRewardModel(source, wrap(source))
        else:
            trainer.rewards.funcs[i] = functools.wraps(source)(wrap(source))


def scale_rewards_from(trainer, step: int, factor: float) -> None:
    """Every reward is multiplied by `factor` from `step` on (a unit change in a grader, a reward model's new head)."""

    def wrap(source):
        def scaled(*args, **kwargs):
            values = source(*args, **kwargs)
            if _current_step(trainer) < step:
                return values
            return [None if v is None else v * factor for v in values]

        return scaled

    _wrap_rewards(trainer, wrap)


def reward_value_from(trainer, step: int, value: float) -> None:
    """Every reward source returns `value` from `step` on (inf: a division by zero in a grader; 1e308: an overflow)."""

    def wrap(source):
        def broken(*args, **kwargs):
            values = source(*args, **kwargs)
            return values if _current_step(trainer) < step else [value] * len(values)

        return broken

    _wrap_rewards(trainer, wrap)


def sample_at_temperature(trainer, temperature: float) -> None:
    """The sampler draws at `temperature` while the losses score the tokens at --temperature (a generation config
    that disagrees with the trainer's)."""
    import rlhfkit.trainers.ppo as ppo
    from rlhfkit.trainers.grpo import GRPOTrainer

    if isinstance(trainer, GRPOTrainer):
        own = trainer.sampling_config

        def sampling_config(max_new_tokens):
            config = own(max_new_tokens)
            config.temperature = temperature
            return config

        trainer.sampling_config = sampling_config
        return
    original = ppo.sampling_config

    def drifted(max_new_tokens, sampled_temperature, *args, **kwargs):
        if sampled_temperature is not None:
            sampled_temperature = temperature
        return original(max_new_tokens, sampled_temperature, *args, **kwargs)

    ppo.sampling_config = drifted


@torch.no_grad()
def noisy_reference(trainer, std: float, seed: int = 0) -> None:
    """The reference model is not the starting policy: Gaussian noise of `std` times each weight's own std (a
    reference loaded from another checkpoint)."""
    generator = torch.Generator().manual_seed(seed)
    for parameter in trainer.ref_model.parameters():
        noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float32).to(parameter)
        parameter.add_(noise * std * parameter.float().std().clamp(min=1e-3))


def stop_token(trainer, token_id: int) -> None:
    """Completions end only at `token_id`, a token the model never writes (EOS missing from the tokenizer's
    settings): they run to the length limit."""
    trainer.stop_ids = [token_id]


@torch.no_grad()
def value_learning_rate_from(trainer, step: int, factor: float) -> None:
    """PPO's value model takes `factor` times its optimizer update from `step` on: its learning rate is that many times
    the policy's (a critic given its own, far too high, learning rate). Scaling vf_coef would not do it: Adam's update
    does not depend on the scale of the gradient."""
    value_model = trainer.accelerator.unwrap_model(trainer.model).value_model
    parameters = [p for p in value_model.parameters() if p.requires_grad]
    optimizer_step = trainer.run.optimizer_step

    def scaled(*args, **kwargs):
        if _current_step(trainer) < step:
            return optimizer_step(*args, **kwargs)
        before = [p.detach().clone() for p in parameters]
        optimizer_step(*args, **kwargs)
        with torch.no_grad():
            for p, old in zip(parameters, before):
                p.add_(p - old, alpha=factor - 1)

    trainer.run.optimizer_step = scaled


def value_frozen_from(trainer, step: int) -> None:
    """PPO's value model stops learning from `step` on: every optimizer step puts its weights back (a critic whose
    learning rate is scheduled to 0, or whose parameters fell out of the optimizer). The policy trains on."""
    value_model = trainer.accelerator.unwrap_model(trainer.model).value_model
    parameters = [p for p in value_model.parameters() if p.requires_grad]
    optimizer_step = trainer.run.optimizer_step

    def frozen(*args, **kwargs):
        if _current_step(trainer) < step:
            return optimizer_step(*args, **kwargs)
        before = [p.detach().clone() for p in parameters]
        optimizer_step(*args, **kwargs)
        with torch.no_grad():
            for p, old in zip(parameters, before):
                p.copy_(old)

    trainer.run.optimizer_step = frozen


INJECTIONS = {
    function.__name__: function
    for function in (
        learning_rate_from,
        scale_rewards_from,
        reward_value_from,
        sample_at_temperature,
        noisy_reference,
        stop_token,
        value_learning_rate_from,
        value_frozen_from,
    )
}
INJECTIONS.update(AGENT_INJECTIONS)  # the agent task's (bench/health/agents.py)
