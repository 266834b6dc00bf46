"""When a run logs a row, evaluates and saves a checkpoint: --logging_strategy, --eval_strategy (by default the
num_sample_generations schedule) and --save_strategy, over the steps of a run and the steps that end an epoch."""

from __future__ import annotations

import math
from collections.abc import Collection
from fractions import Fraction


class Schedule:
    """The steps (1-based) of a `num_steps`-step run at which something happens besides training.

    epoch_ends: the steps that end a pass over the prompts (:func:`epoch_end_steps`), for the epoch strategies; the
    last step always counts."""

    def __init__(self, args, num_steps: int, epoch_ends: Collection[int] = ()):
        self.args, self.num_steps = args, num_steps
        self.epoch_ends = frozenset(epoch_ends) | {num_steps}
        self.sample_interval = sample_every(num_steps, args.num_sample_generations)
        # --logging_steps, --eval_steps, --save_steps as counts of steps (a share in (0, 1) of this run's steps)
        self.logging_steps = interval(args.logging_steps, num_steps)
        self.eval_steps = interval(args.eval_steps or args.logging_steps, num_steps)  # transformers' fallback
        self.save_steps = interval(args.save_steps, num_steps)

    def evaluates_first(self) -> bool:
        """Whether the run evaluates before its first step (--eval_on_start; always with the num_sample_generations
        schedule, as TRL's PPO does)."""
        return bool(self.args.eval_strategy == "no" and self.sample_interval) or self.args.eval_on_start

    def is_log_step(self, step: int) -> bool:
        """Whether `step` ends a logging window with a row of its own (--logging_strategy, --logging_first_step), as
        transformers' DefaultFlowCallback decides. A window still open after the last step is not one: the run's
        summary row takes it (run.py, _end_of_training), as TRL's log() merges what is pending into that row."""
        args = self.args
        if args.logging_first_step and step == 1:
            return True
        if args.logging_strategy == "steps":
            return step % self.logging_steps == 0
        return args.logging_strategy == "epoch" and step in self.epoch_ends

    def is_eval_step(self, step: int) -> bool:
        """Whether the trainer evaluates and logs its completions table after `step` (--eval_strategy; with "no",
        the num_sample_generations schedule)."""
        args = self.args
        if args.eval_strategy == "steps":
            return step % self.eval_steps == 0 or step == self.num_steps
        if args.eval_strategy == "epoch":
            return step in self.epoch_ends
        return is_sample_step(step, self.num_steps, self.sample_interval)

    def is_save_step(self, step: int) -> bool:
        """Whether a checkpoint is saved after `step` during training (--save_strategy); the last step's is saved
        when training ends, whatever the strategy."""
        args = self.args
        if step >= self.num_steps:
            return False
        if args.save_strategy == "steps":
            return bool(self.save_steps) and step % self.save_steps == 0
        return args.save_strategy == "epoch" and step in self.epoch_ends


def interval(steps: float, num_steps: int) -> int:
    """A --logging_steps / --eval_steps / --save_steps value as a number of steps, as transformers reads it: a value
    in (0, 1) is that share of the run's `num_steps`, rounded up; otherwise the count itself (0: never)."""
    return math.ceil(steps * num_steps) if 0 < steps < 1 else int(steps)


def sample_every(num_steps: int, num_sample_generations: int) -> int:
    """Steps between sample generations so that about `num_sample_generations` happen (0: never)."""
    return max(1, num_steps // num_sample_generations) if num_sample_generations else 0


def is_sample_step(step: int, num_steps: int, every: int) -> bool:
    """Samples are generated every `every` steps and after the last one (step 0 is handled by the caller)."""
    return bool(every) and (step % every == 0 or step == num_steps)


def epoch_end_steps(
    num_steps: int, dataset_size: int, prompts_per_draw: int, steps_per_draw: int | Fraction = 1
) -> frozenset[int]:
    """The 1-based steps that end a pass over the prompts, and the last step (which ends the run's last, possibly
    partial, epoch, as in transformers' Trainer).

    Each draw takes `prompts_per_draw` prompts (all processes: PPO's rollout batch, GRPO's generation batch) and
    serves `steps_per_draw` steps (GRPO: steps_per_generation x num_iterations / gradient_accumulation_steps, a
    Fraction when a step draws on several generations or a generation ends mid-step). Pass k ends with the draw holding its last prompt, the
    (k x dataset_size)-th drawn (rlhfkit.data.endless_batches draws passes back to back), after that draw's last step.
    """
    draws = math.ceil(num_steps / steps_per_draw)
    passes = draws * prompts_per_draw // dataset_size
    last_draws = (-(-k * dataset_size // prompts_per_draw) for k in range(1, passes + 1))  # ceil, in integers
    return frozenset({min(math.ceil(draw * steps_per_draw), num_steps) for draw in last_draws} | {num_steps})
