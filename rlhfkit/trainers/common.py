"""Small pieces of a training run that the run lifecycle (run.py) composes: the optimizer, the learning-rate and
sample-generation schedules, where the epochs end, saving models atomically, interrupts and skipped non-finite steps.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from fractions import Fraction

import torch
from accelerate import Accelerator

from rlhfkit.config import TrainConfig, lr_factor


def make_optimizer(params, args: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
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


def lr_schedule(args: TrainConfig, num_steps: int) -> Callable[[int], float]:
    """The learning rate of each 1-based step of a `num_steps`-step run: learning_rate x the factor of transformers'
    --lr_scheduler_type schedule after step - 1 scheduler steps, with warmup_steps(args, num_steps) of warm-up.

    This is how TRL steps transformers' scheduler (once per PPO update; once per GRPO optimizer step, which is one
    rlhfkit step), so a warm-up's first step has lr 0 and linear decay ends at learning_rate / num_steps. The factor
    is a pure function of the step (rlhfkit.config.lr_factor, from the LambdaLR transformers builds): a resumed run
    needs no scheduler state."""
    factor = lr_factor(args, num_steps)
    learning_rate = args.learning_rate
    return lambda step: learning_rate * factor(step - 1)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


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
