"""What keeps a run's steps safe: a signal becomes a clean stop after the step, and a NaN/inf gradient is skipped
instead of written into the weights."""

from __future__ import annotations

import math
import signal
import sys
import threading

import torch


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

    def step(self, accelerator, model, optimizer, max_grad_norm: float | None) -> float:
        """Clip (when max_grad_norm is set) and apply the gradients if they are finite (the step is skipped and
        counted otherwise). Returns the gradient norm before clipping.

        Under fp16 loss scaling (a GradScaler, accelerate's with --fp16) the scaler decides: it skips a step whose
        gradients overflowed and lowers the scale, which is routine while the scale settles. Such a skip is counted
        (nonfinite_steps), but only a skip at a scale already below 1, where overflow is no longer the scale's
        doing, moves the streak that stops training."""
        limit = max_grad_norm if max_grad_norm is not None else float("inf")
        norm = float(accelerator.clip_grad_norm_(model.parameters(), limit))  # unscales first under a GradScaler
        scaler = getattr(accelerator, "scaler", None)
        if scaler is not None:
            scale = scaler.get_scale()
            optimizer.step()  # the scaler's step: applied, or skipped when the gradients are not finite
            skipped = accelerator.optimizer_step_was_skipped
            broken = skipped and scale < 1
        else:
            skipped = broken = not math.isfinite(norm)
            if not skipped:
                optimizer.step()
        self.skipped += skipped
        self.streak = self.streak + 1 if broken else 0
        optimizer.zero_grad(set_to_none=True)
        return norm

    def record(self, norm: float, applied: bool, loss_scale: float | None = None) -> float:
        """Count a step an engine took itself (DeepSpeed, inside accelerator.backward): skipped when it did not
        change the weights (its overflow check). As with a GradScaler, under fp16 loss scaling (`loss_scale`) only a
        skip at a scale already below 1 moves the streak that stops training. Returns `norm`."""
        skipped = not applied
        broken = skipped and (loss_scale is None or loss_scale < 1)
        self.skipped += skipped
        self.streak = self.streak + 1 if broken else 0
        return norm

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
