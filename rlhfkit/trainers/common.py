"""Pieces every trainer uses the same way: the accelerator and trackers, resuming, the learning-rate and
sample-generation schedules, saving models atomically, interrupts, skipped non-finite steps and early stops.
Helpers, not a base class: each trainer's ``train()`` stays readable on its own.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from rlhfkit.checkpoint import (
    Interrupted,
    NonFiniteStop,
    load_process_state,
    read_state,
    resolve_checkpoint,
)
from rlhfkit.config import ConfigError, TrainConfig
from rlhfkit.health.watch import HealthStop
from rlhfkit.tracking import RunLogger, make_trackers, resolve_report_to


@dataclass
class Progress:
    """The counters a checkpoint carries; a resumed run continues them (eps included, through `elapsed`)."""

    step: int = 0  # steps (PPO updates, GRPO optimizer steps) completed
    episode: int = 0  # episodes (responses / completions) generated, all processes
    elapsed: float = 0.0  # seconds of training so far
    num_tokens: int = 0  # GRPO: prompt + completion tokens processed, all processes
    generations: int = 0  # GRPO: generation batches drawn (data position)


@dataclass
class Resume:
    """A checkpoint to resume from: its path and trainer_state.json (read before anything is written)."""

    path: Path
    state: dict

    @property
    def step(self) -> int:
        return int(self.state["progress"]["step"])

    def load(self, accelerator) -> tuple[dict, dict]:
        """(extra tensors, this process's RNG state)."""
        return load_process_state(self.path, self.state, accelerator.process_index, accelerator.num_processes)


def open_resume(args: TrainConfig) -> Resume | None:
    if not args.resume_from_checkpoint:
        return None
    path = resolve_checkpoint(args.resume_from_checkpoint, args.output_dir)
    return Resume(path, read_state(path))


def resolve_config_report_to(args: TrainConfig) -> list[str]:
    """The trackers of report_to, or a ConfigError naming the field (unknown or not installed)."""
    try:
        return resolve_report_to(args.report_to)
    except (ValueError, ImportError) as e:
        raise ConfigError(f"--report_to: {e}") from None


def make_logger(args: TrainConfig, accelerator: Accelerator, report_to: list[str], resume: Resume | None):
    return RunLogger(
        accelerator,
        output_dir=args.output_dir,
        config=args.to_dict(),
        project=args.project,
        run_name=args.run_name,
        report_to=report_to,
        logging_dir=args.logging_dir,
        resume=resume is not None,
        resume_step=resume.step if resume is not None else None,
    )


def make_accelerator(args: TrainConfig, report_to: list[str], resume: Resume | None = None) -> Accelerator:
    """An Accelerator holding the run's trackers, with every library's RNG seeded (differently per process)."""
    tracker_ids = resume.state.get("tracker_ids", {}) if resume is not None else {}
    trackers = make_trackers(
        report_to,
        project=args.project,
        run_name=args.run_name,
        output_dir=args.output_dir,
        logging_dir=args.logging_dir,
        resume=resume is not None,
        wandb_id=tracker_ids.get("wandb"),
    )
    # Without CUDA, accelerate only forms a process group (gloo) for torchrun-launched processes when told
    # cpu=True; a single process keeps its default device (e.g. MPS).
    multi_cpu = not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    accelerator = Accelerator(log_with=trackers or None, cpu=multi_cpu)
    set_seed(args.seed, device_specific=True)  # each process samples different responses
    return accelerator


def make_optimizer(params, args: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, fused into one kernel where torch has one for the device (CPU and CUDA): fewer passes over the
    parameters and no per-step temporaries the size of the model."""
    fused = torch.device(device).type in ("cpu", "cuda")
    return torch.optim.AdamW(
        params, lr=args.learning_rate, eps=args.adam_epsilon, weight_decay=args.weight_decay, fused=fused
    )


def linear_lr(learning_rate: float, step: int, num_steps: int, warmup: int = 0) -> float:
    """Learning rate of 1-based `step`: linear warm-up over `warmup` steps (learning_rate x step / warmup), then
    linear decay from learning_rate (step warmup + 1) towards 0 (after the last step)."""
    if step <= warmup:
        return learning_rate * step / warmup
    return learning_rate * (num_steps - step + 1) / (num_steps - warmup)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def sample_every(num_steps: int, num_sample_generations: int) -> int:
    """Steps between sample generations so that about `num_sample_generations` happen (0: never)."""
    return max(1, num_steps // num_sample_generations) if num_sample_generations else 0


def is_sample_step(step: int, num_steps: int, every: int) -> bool:
    """Samples are generated every `every` steps and after the last one (step 0 is handled by the caller)."""
    return bool(every) and (step % every == 0 or step == num_steps)


def save_into(accelerator: Accelerator, path: str, write: Callable[[str], None]) -> None:
    """Write files into the directory `path` (the run directory, which already holds logs): `write(tmp_dir)` on the
    main process, then each written file or folder is moved into `path`, replacing one of the same name. A crash
    mid-write leaves only `path`.tmp behind, never a half-written model in `path`."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        tmp = path.rstrip("/") + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp)
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(tmp):
            target = os.path.join(path, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            os.replace(os.path.join(tmp, name), target)
        os.rmdir(tmp)
    accelerator.wait_for_everyone()


class InterruptGuard:
    """Turns SIGINT / SIGTERM into a request to stop after the current step, so the trainer can save a checkpoint
    and close the trackers; a second signal stops at once (the default behaviour)."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # asked twice: give up on the clean stop
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            raise KeyboardInterrupt
        self.signum = signum
        print(
            f"\n[rlhfkit] {signal.Signals(signum).name}: finishing the current step, then saving a checkpoint "
            "(send it again to stop at once).",
            file=sys.stderr,
            flush=True,
        )

    def requested(self, accelerator) -> int | None:
        """The signal any process received (a collective with several processes, so all stop at the same step)."""
        if accelerator.num_processes == 1:
            return self.signum
        flag = torch.tensor([float(self.signum or 0)], device=accelerator.device)
        signum = int(accelerator.reduce(flag, "max").item())
        return signum or None


class StepGuard:
    """Optimizer steps that skip a NaN/inf gradient instead of writing it into the weights.

    A non-finite loss gives non-finite gradients; the (already all-reduced) gradient norm is then non-finite on
    every process alike, so all processes skip the same step without another collective.
    """

    def __init__(self, max_streak: int):
        self.max_streak = max_streak
        self.streak = 0  # consecutive skipped steps
        self.skipped = 0  # skipped steps since the last take_skipped()

    def step(self, accelerator, model, optimizer, max_grad_norm: float | None) -> bool:
        """Clip (when max_grad_norm is set) and apply the gradients if they are finite; True if applied."""
        limit = max_grad_norm if max_grad_norm is not None else float("inf")
        norm = accelerator.clip_grad_norm_(model.parameters(), limit)
        ok = bool(torch.isfinite(torch.as_tensor(norm)))
        if ok:
            optimizer.step()
            self.streak = 0
        else:
            self.streak += 1
            self.skipped += 1
        optimizer.zero_grad(set_to_none=True)
        return ok

    @property
    def exhausted(self) -> bool:
        return self.streak >= self.max_streak

    def take_skipped(self) -> int:
        skipped, self.skipped = self.skipped, 0
        return skipped


def stop_early(trainer, step: int, finding, interrupt: InterruptGuard) -> None:
    """End training cleanly after `step` when a signal arrived, a critical health finding asks for it (--health
    stop) or max_nonfinite_steps optimizer steps in a row were skipped: save a checkpoint, close the trackers and
    raise the TrainingStopped that explains what happened and how to go on. Collective: every process calls it."""
    signum = interrupt.requested(trainer.accelerator)
    if finding is None and signum is None and not trainer.steps.exhausted:
        return
    checkpoint = trainer.save_checkpoint(step)
    trainer.logger.finish()
    output_dir = trainer.args.output_dir
    if finding is not None:
        raise HealthStop(finding, checkpoint, output_dir)
    if trainer.steps.exhausted:
        raise NonFiniteStop(trainer.steps.streak, step, checkpoint)
    raise Interrupted(signum, step, checkpoint, output_dir)
