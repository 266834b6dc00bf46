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
    import rlhfkit.trainers.ppo.trainer as ppo
    from rlhfkit.trainers.grpo import GRPOTrainer

    if isinstance(trainer, GRPOTrainer):  # the generation's sampler (evaluations keep the trainer's own)
        sampler = trainer.generation.sampler
        own = sampler.config

        def sampling_config(max_new_tokens):
            config = own(max_new_tokens)
            config.temperature = temperature
            return config

        trainer.generation.sampler = sampler._replace(config=sampling_config)
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


def entropy_bonus_from(trainer, step: int, coef: float, learning_rate: float | None = None) -> None:
    """An entropy bonus far too large from `step` on: the loss minus `coef` x the mean token entropy of the policy
    (coef 10: a thousand times verl's usual 0.001-0.01; its users report the entropy exploding at far less): the bonus
    outweighs the reward's advantage (the gradient norm goes from ~2 to ~30), the policy spreads its probability over
    the vocabulary and goes random, and the reward falls to 0.

    GRPO: the trainer's own entropy term switched on at `step` (GRPOTrainer.optimize reads args.entropy_coef to decide
    whether the loss has one, and applies trainer.entropy_coef; the run then logs entropy_coef and policy_loss, as
    such a run does). PPO, which has no entropy term: its policy loss minus `coef` x the masked mean entropy of the
    micro-batch's completion tokens (the entropy of the training forward, kept with its gradient).

    learning_rate: also learning_rate_from(step, learning_rate). How fast the policy goes random is set by the
    learning rate, not by `coef`: Adam (after clipping to max_grad_norm) moves each weight by about the learning rate
    per step whatever the gradient's size, so past coef ~10 the bonus is the whole update and a larger coef changes
    nothing (10 and 100 gave the same run). PPO's two epochs a step at 1e-4 take the sort task's entropy from 0.34 to
    1.7 nats/token in 10 steps; GRPO's one optimizer step at the 100-step schedule's 7.8e-5 and falling only to 0.53
    (0.84 in 20), and the reward falls long before. At 2.5e-4 from step 30 GRPO goes 0.34 -> 1.3 in 10 steps and 3.5
    (ln 49 is the most) in 15, as runs that go random do; the same learning rate without the bonus keeps the run
    healthy (entropy ~0.3, reward ~1.1 through step 80, seed 0)."""
    from rlhfkit.trainers.grpo import GRPOTrainer

    if learning_rate is not None:
        learning_rate_from(trainer, step, learning_rate)
    if isinstance(trainer, GRPOTrainer):
        optimize = trainer.optimize

        def boosted(*args, **kwargs):
            if _current_step(trainer) >= step:
                trainer.args.entropy_coef = coef
                trainer.entropy_coef = coef
            return optimize(*args, **kwargs)

        trainer.optimize = boosted
        return
    import rlhfkit.trainers.ppo.model as ppo_model
    import rlhfkit.trainers.ppo.trainer as ppo

    token_stats, policy_loss = ppo_model.completion_token_stats, ppo.ops.clipped_policy_loss
    entropies = []  # the entropy of the micro-batch's training forward, with its gradient

    def stats_with_entropy_grad(*args, **kwargs):
        on = _current_step(trainer) >= step and torch.is_grad_enabled()  # the training forward, not sampling's
        stats = token_stats(*args, **({**kwargs, "entropy_grad": True} if on else kwargs))
        entropies[:] = [stats[1]] if on and stats[1] is not None else []
        return stats

    def with_bonus(logprobs, old_logprobs, advantages, mask, cliprange):
        out = policy_loss(logprobs, old_logprobs, advantages, mask, cliprange)
        if not entropies:
            return out
        bonus = ppo.ops.masked_mean(entropies.pop(), mask)
        return out._replace(loss=out.loss - coef * bonus)

    ppo_model.completion_token_stats = stats_with_entropy_grad  # the policy's forward (PolicyAndValue)
    ppo.ops = _Patched(ppo.ops, clipped_policy_loss=with_bonus)


class _Patched:
    """A module seen through: `overrides` in place of its attributes of the same names (for one trainer module's
    view of rlhfkit.ops, leaving the module itself alone)."""

    def __init__(self, module, **overrides):
        self._module, self._overrides = module, overrides

    def __getattr__(self, name):
        return self._overrides[name] if name in self._overrides else getattr(self._module, name)


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
        entropy_bonus_from,
    )
}
INJECTIONS.update(AGENT_INJECTIONS)  # the agent task's (bench/health/agents.py)
