"""The parts of a training run that hold no lifecycle (run.py holds that): what the run needs from its trainer
(`Trainee`), the counters a checkpoint carries (`Progress`), the losses of a train() call's steps (`StepLosses`) and
the FLOPs of the training forwards (`TrainingFlops`, perf/mfu), and the run's logger, which releases the run directory's
lock when the run ends (`LockReleasingLogger`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from accelerate import Accelerator

from rlhfkit import perf
from rlhfkit.metrics import registry as M
from rlhfkit.tracking.logger import RunLogger
from rlhfkit.tracking.rundir import RunLock


class Trainee(Protocol):
    """What a trainer gives its run."""

    model: torch.nn.Module  # prepared by the accelerator: what the optimizer trains
    optimizer: torch.optim.Optimizer  # prepared
    tokenizer: Any  # saved with the models
    eval_prompts: Any  # the eval_dataset tokenized (a dict of named sets, or None): evaluate() runs only with one

    @property
    def policy(self) -> torch.nn.Module:
        """The unwrapped policy (merged into output_dir/merged with --merge_adapter)."""

    def write_models(self, directory: str, state_dict: dict | None = None) -> None:
        """Save the models into `directory`; state_dict: the full weights gathered from a sharding engine, else
        None (the models' own weights are whole)."""

    def load_models(self, directory: Path, trained: bool = True) -> None:
        """Load a checkpoint's models (the trained ones unless `trained` is False: the engine restored them)."""

    def state_dict(self) -> dict[str, Any]:
        """The trainer's own state (PPO's KL controller, GRPO's batch in use)."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def evaluation(self, step: int, dataset) -> Mapping[str, float]:
        """Evaluate on `dataset` (tokenized prompts: eval_prompts, or the one given to trainer.evaluate()) at `step`:
        log its tables and return its scalars (registry names, eval/*), which the run logs (on the --eval_strategy
        schedule and on trainer.evaluate())."""


@dataclass
class Progress:
    """The counters a checkpoint carries; a resumed run continues them (eps included, through `elapsed`)."""

    step: int = 0  # steps (PPO updates, GRPO optimizer steps) completed
    episode: int = 0  # episodes (responses / completions) generated, all processes
    elapsed: float = 0.0  # seconds of training so far
    num_tokens: int = 0  # GRPO: prompt + completion tokens processed, all processes
    generations: int = 0  # GRPO: generation batches drawn (data position)


class StepLosses:
    """The training loss of each step of one train() call, for its train_loss (TrainOutput.training_loss): the sums
    and counts a trainer adds during a step (TrainingRun.add_loss), one entry per step (end_step), pooled over the
    processes once, at the end. A resumed run's call counts only its own steps, as transformers' does."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, float]] = []  # this process's (sum, count) of each step
        self._total: Any = 0.0
        self._count: Any = 0.0

    def add(self, total, count) -> None:
        self._total, self._count = self._total + total, self._count + count  # tensors stay on their device

    def end_step(self) -> None:
        self.steps.append((float(self._total), float(self._count)))
        self._total = self._count = 0.0

    def mean(self, accelerator: Accelerator) -> float:
        """The mean over the steps of each step's loss, pooled over the processes (a collective; every process has
        the same steps); a step whose loss is not finite is left out (transformers' logging_nan_inf_filter). 0.0
        without steps, as transformers gives."""
        if not self.steps:
            return 0.0
        pairs = torch.tensor(self.steps, dtype=torch.float64, device=accelerator.device)
        losses = [total / count for total, count in accelerator.reduce(pairs, "sum").tolist() if count > 0]
        finite = [loss for loss in losses if math.isfinite(loss)]
        return sum(finite) / len(finite) if finite else 0.0


# A step's two phases: the metric of their seconds and the one of their peak memory.
PHASES = {
    "rollout": (M.TIME_ROLLOUT, M.PERF_PEAK_MEMORY_ROLLOUT),
    "optimization": (M.TIME_OPTIMIZATION, M.PERF_PEAK_MEMORY_OPTIMIZATION),
}


class TrainingFlops:
    """The model FLOPs of the training forwards and backwards of an optimization phase (perf/mfu), from the tokens
    the trainer counts in it.

    A sequence of n real tokens costs n x F((n + 1) / 2) in its forward, F(c) = perf.forward_flops_per_token(model,
    c) = F0 + F1 x c (linear in the context c), so a phase's forwards cost F0 x sum n + F1 x sum n (n + 1) / 2, and
    the backward twice that. Recomputation is not counted (model FLOPs, as PaLM's MFU)."""

    def __init__(self, model: torch.nn.Module):
        self.at_no_context = perf.forward_flops_per_token(model, 0.0)
        self.per_context = perf.forward_flops_per_token(model, 1.0) - self.at_no_context
        self.tokens: torch.Tensor | float = 0.0  # sum n, on the device until the phase ends (no sync per micro-batch)
        self.pairs: torch.Tensor | float = 0.0  # sum n (n + 1) / 2: the attention's query-key pairs

    def count(self, attention_mask: torch.Tensor) -> None:
        """Add one training forward over (B, L) `attention_mask` (True on real prompt and completion tokens)."""
        n = attention_mask.sum(-1, dtype=torch.float64)
        self.tokens = self.tokens + n.sum()
        self.pairs = self.pairs + (n * (n + 1) / 2).sum()

    def take(self) -> tuple[float, float]:
        """The tokens and the FLOPs (forward and backward) counted since the last take."""
        tokens, pairs = float(self.tokens), float(self.pairs)
        self.tokens = self.pairs = 0.0
        return tokens, 3.0 * (self.at_no_context * tokens + self.per_context * pairs)


class LockReleasingLogger(RunLogger):
    """The run's logger, whose finish() ends the run: every end of a run finishes it (the last step's saves, a clean
    stop, the trainer's end()), and then releases the run directory's lock (None: not the main process), unless
    `release` is False (the run still writes into output_dir and releases the lock itself)."""

    def __init__(self, lock: RunLock | None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = lock

    def finish(self, release: bool = True) -> None:
        super().finish()
        if release and self._lock is not None:
            self._lock.release()
