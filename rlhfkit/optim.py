"""The optimizer and the learning-rate schedule of a run, built as transformers' Trainer builds them.

``--optim`` and ``--lr_scheduler_type`` take transformers' names; the names rlhfkit implements are listed here
(OPTIMIZERS, LR_SCHEDULER_TYPES), next to the code that implements them, and the configs check their fields against
these lists. The schedule is a pure function of the step, taken from the LambdaLR transformers' ``get_scheduler``
builds, so a resumed run needs no scheduler state.

`args` below is a training config (rlhfkit.config.TrainConfig): this module sits below the configs, which check a
schedule's arguments with :func:`lr_factor` as they are built.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

# transformers' names (TrainingArguments) for what make_optimizer builds and lr_factor computes.
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "sgd", "adafactor")
LR_SCHEDULER_TYPES = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_min_lr")


def other_optimizers() -> dict[str, str]:
    """transformers' optimizers that make_optimizer does not build, each with why (for the config's error)."""
    from transformers.training_args import OptimizerNames

    return {name.value: "a transformers optimizer that rlhfkit does not build" for name in OptimizerNames}


def other_schedules() -> dict[str, str]:
    """transformers' schedules that lr_factor does not offer, each with why (for the config's error)."""
    from transformers.trainer_utils import SchedulerType

    why = {
        "reduce_lr_on_plateau": "it steps on an evaluation loss, which an RL run does not have",
        "greedy": "it steps on an evaluation loss, which an RL run does not have",
    }
    return {
        kind.value: why.get(kind.value, "a transformers schedule that rlhfkit does not offer")
        for kind in SchedulerType
    }


def make_optimizer(params, args, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer --optim names, built as transformers' Trainer builds it (the run sets its lr every step).

    adamw_torch_fused (the default, as in transformers 5): AdamW fused into one kernel where torch has one for the
    device (CPU and CUDA): fewer passes over the parameters and no per-step temporaries the size of the model.
    adamw_torch: the same AdamW, unfused. sgd: plain SGD. adafactor: transformers' Adafactor with an external
    learning rate (no relative step, no parameter scaling, no warm-up init)."""
    lr, decay = args.learning_rate, args.weight_decay
    if args.optim == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=decay)
    if args.optim == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(
            params, lr=lr, weight_decay=decay, scale_parameter=False, relative_step=False, warmup_init=False
        )
    betas = (args.adam_beta1, args.adam_beta2)
    fused = args.optim == "adamw_torch_fused" and torch.device(device).type in ("cpu", "cuda")
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=args.adam_epsilon, weight_decay=decay, fused=fused)


def warmup_steps(args, num_steps: int) -> int:
    """Warm-up steps of a run of `num_steps` steps, as transformers counts them: warmup_steps when >= 1, a share of
    the steps when in (0, 1), else ceil(warmup_ratio x num_steps); at most num_steps - 1 (a one-step run learns)."""
    share = args.warmup_steps if 0 < args.warmup_steps < 1 else args.warmup_ratio
    count = int(args.warmup_steps) if args.warmup_steps >= 1 else math.ceil(share * num_steps)
    return max(0, min(count, num_steps - 1))


def lr_factor(args, num_steps: int) -> Callable[[int], float]:
    """transformers' --lr_scheduler_type schedule for a `num_steps`-step run with warmup_steps(args, num_steps) of
    warm-up: the factor of learning_rate after k scheduler steps (k = 0, 1, ...), taken from the LambdaLR that
    transformers' get_scheduler builds (a pure function of k). Arguments the schedule does not take raise TypeError
    or ValueError."""
    from transformers import get_scheduler

    probe = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)  # the schedule reads nothing else
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        probe,
        num_warmup_steps=warmup_steps(args, num_steps),
        num_training_steps=num_steps,
        scheduler_specific_kwargs=dict(args.lr_scheduler_kwargs or {}),
    )
    (factor,) = scheduler.lr_lambdas
    return factor


def lr_schedule(args, num_steps: int) -> Callable[[int], float]:
    """The learning rate of each 1-based step of a `num_steps`-step run: learning_rate x the factor of transformers'
    --lr_scheduler_type schedule after step - 1 scheduler steps, with warmup_steps(args, num_steps) of warm-up.

    This is how TRL steps transformers' scheduler (once per PPO update; once per GRPO optimizer step, which is one
    rlhfkit step), so a warm-up's first step has lr 0 and linear decay ends at learning_rate / num_steps."""
    factor = lr_factor(args, num_steps)
    learning_rate = args.learning_rate
    return lambda step: learning_rate * factor(step - 1)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
