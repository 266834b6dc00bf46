"""Small pieces of a training run that the run lifecycle (run.py) composes: the optimizer, the learning-rate and
sample-generation schedules, saving models atomically, interrupts and skipped non-finite steps.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable

import torch
from accelerate import Accelerator

from rlhfkit.config import TrainConfig


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
        """Steps skipped since the previous call (the logging window's count), and start counting afresh."""
        skipped, self.skipped = self.skipped, 0
        return skipped

    def state_dict(self) -> dict[str, int]:
        return {"streak": self.streak, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.streak, self.skipped = int(state["streak"]), int(state["skipped"])
