"""Batch arithmetic of PPO and GRPO: the sizes that follow from the flags, the number of processes and the dataset.

Every division is exact (:func:`exact_div`), and a size that does not divide fails with a ConfigError naming the
flags. `args` is a PPOConfig or GRPOConfig (these functions sit below them: GRPOConfig checks its generation shape
with :func:`grpo_generation_shape` as it is built).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from rlhfkit.errors import ConfigError


class PPOBatchSizes(NamedTuple):
    """Batch arithmetic of one PPO update (see docs/algorithms/ppo.md)."""

    local_batch_size: int  # rollouts per device per update = per_device_train_batch_size x gradient_accumulation_steps
    batch_size: int  # rollouts per update, all devices
    local_mini_batch_size: int  # rollouts per device per optimizer step
    micro_batches_per_mini_batch: int  # forward/backward passes accumulated into one optimizer step
    num_total_batches: int  # PPO updates in the run


def exact_div(a: int, b: int, message: str) -> int:
    if b == 0 or a % b:
        raise ConfigError(f"{message} (got {a} / {b}).")
    return a // b


def ppo_batch_sizes(args, world_size: int, dataset_size: int) -> PPOBatchSizes:
    local_batch_size = args.per_device_train_batch_size * args.gradient_accumulation_steps
    local_mini = exact_div(
        local_batch_size,
        args.num_mini_batches,
        "per_device_train_batch_size x gradient_accumulation_steps must be divisible by num_mini_batches",
    )
    micro = exact_div(
        local_mini,
        args.per_device_train_batch_size,
        "gradient_accumulation_steps must be divisible by num_mini_batches "
        "(each mini-batch is a whole number of per_device_train_batch_size micro-batches)",
    )
    batch_size = local_batch_size * world_size
    if getattr(args, "max_steps", -1) > 0:  # PPO updates; it wins over a total_episodes set after the checks
        return PPOBatchSizes(local_batch_size, batch_size, local_mini, micro, args.max_steps)
    total = args.total_episodes
    if total is None:
        total = int(args.num_train_epochs * dataset_size)
    if total < 1:
        raise ConfigError("total_episodes must be >= 1 (or set num_train_epochs with a non-empty dataset).")
    return PPOBatchSizes(local_batch_size, batch_size, local_mini, micro, math.ceil(total / batch_size))


def grpo_generation_shape(args, world_size: int) -> tuple[int, int]:
    """(steps_per_generation, global completions per generation) as TRL derives them; ConfigError when the
    generation batch does not hold whole groups or whole micro-batches (with dynamic_sampling, when a process's share
    of it does not hold whole groups)."""
    micro = args.per_device_train_batch_size * world_size  # completions of one micro-step, all processes
    if args.generation_batch_size is not None:
        steps = exact_div(
            args.generation_batch_size,
            micro,
            f"generation_batch_size must be a multiple of per_device_train_batch_size x processes ({micro})",
        )
    else:
        steps = args.steps_per_generation or args.gradient_accumulation_steps
    completions = micro * steps
    if completions % args.num_generations:
        g = args.num_generations
        fits = g // math.gcd(g, micro)  # the smallest steps_per_generation that holds whole groups
        raise ConfigError(
            f"a generation of {completions} completions (per_device_train_batch_size {args.per_device_train_batch_size}"
            f" x {world_size} process(es) x steps_per_generation {steps}) does not hold whole groups of "
            f"num_generations {g}. Make it a multiple of {g}: e.g. --steps_per_generation "
            f"{fits * max(1, math.ceil(steps / fits))}, or --per_device_train_batch_size {g}."
        )
    local = args.per_device_train_batch_size * steps  # one process's completions of a generation
    if getattr(args, "dynamic_sampling", False) and local % args.num_generations:
        g = args.num_generations
        fits = g // math.gcd(g, args.per_device_train_batch_size)
        raise ConfigError(
            f"dynamic_sampling with {world_size} processes: each process's share of a generation, "
            f"per_device_train_batch_size {args.per_device_train_batch_size} x steps_per_generation {steps} = {local} "
            f"completions, is not a multiple of num_generations {g}, so a group would span two processes. Dynamic "
            "sampling keeps or drops whole groups on the process that generated them (no completion moves between "
            f"processes). Make it a multiple of {g}: e.g. --steps_per_generation "
            f"{fits * max(1, math.ceil(steps / fits))}, or --per_device_train_batch_size {g}."
        )
    return steps, completions


class GRPOBatchSizes(NamedTuple):
    """Batch arithmetic of GRPO as TRL's (see docs/algorithms/grpo.md)."""

    local_completions: (
        int  # completions per device per generation = per_device_train_batch_size x steps_per_generation
    )
    prompts: int  # prompts per generation, all devices
    completions: int  # completions per generation, all devices
    steps_per_generation: int  # micro-batches one generation is split into
    micro_steps_per_generation: int  # micro-batches a generation serves: steps_per_generation x num_iterations
    num_steps: int  # optimizer steps in the run (gradient_accumulation_steps micro-batches each)


def grpo_batch_sizes(args, world_size: int, dataset_size: int) -> GRPOBatchSizes:
    steps, completions = grpo_generation_shape(args, world_size)
    prompts = completions // args.num_generations
    served = steps * args.num_iterations
    if args.max_steps > 0:
        num_steps = args.max_steps
    else:
        generations = math.ceil(args.num_train_epochs * dataset_size / prompts)
        num_steps = math.ceil(generations * served / args.gradient_accumulation_steps)
    if num_steps < 1:
        raise ConfigError("max_steps must be >= 1 (or set num_train_epochs with a non-empty dataset).")
    local = args.per_device_train_batch_size * steps
    return GRPOBatchSizes(local, prompts, completions, steps, served, num_steps)
