"""Pieces every trainer uses the same way: the accelerator and trackers, the learning-rate schedule, the
sample-generation schedule, and saving models atomically. Helpers, not a base class: each trainer's
``train()`` stays readable on its own.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from rlhfkit.config import TrainConfig
from rlhfkit.tracking import make_trackers


def make_accelerator(args: TrainConfig, report_to: list[str]) -> Accelerator:
    """An Accelerator holding the run's trackers, with every library's RNG seeded (differently per process)."""
    trackers = make_trackers(
        report_to,
        project=args.project,
        run_name=args.run_name,
        output_dir=args.output_dir,
        logging_dir=args.logging_dir,
    )
    # Without CUDA, accelerate only forms a process group (gloo) for torchrun-launched processes when told
    # cpu=True; a single process keeps its default device (e.g. MPS).
    multi_cpu = not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    accelerator = Accelerator(log_with=trackers or None, cpu=multi_cpu)
    set_seed(args.seed, device_specific=True)  # each process samples different responses
    return accelerator


def linear_lr(learning_rate: float, step: int, num_steps: int) -> float:
    """Learning rate of 1-based `step`: linear decay from `learning_rate` (step 1) towards 0 (after the last)."""
    return learning_rate * (1.0 - (step - 1) / num_steps)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def sample_every(num_steps: int, num_sample_generations: int) -> int:
    """Steps between sample generations so that about `num_sample_generations` happen (0: never)."""
    return max(1, num_steps // num_sample_generations) if num_sample_generations else 0


def is_sample_step(step: int, num_steps: int, every: int) -> bool:
    """Samples are generated every `every` steps and after the last one (step 0 is handled by the caller)."""
    return bool(every) and (step % every == 0 or step == num_steps)


def save_atomically(accelerator: Accelerator, path: str, write: Callable[[str], None], merge: bool = False) -> None:
    """Write a directory with `write(tmp_dir)` on the main process, then move it into place.

    merge=False replaces `path` (a checkpoint); merge=True moves the written files into an existing `path`
    (the run directory, which already holds logs). Either way a crash mid-write leaves only a `.tmp` behind.
    """
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        tmp = path.rstrip("/") + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp)
        if merge:
            os.makedirs(path, exist_ok=True)
            for name in os.listdir(tmp):
                target = os.path.join(path, name)
                if os.path.isdir(target):
                    shutil.rmtree(target)
                os.replace(os.path.join(tmp, name), target)
            os.rmdir(tmp)
        else:
            shutil.rmtree(path, ignore_errors=True)
            os.replace(tmp, path)
    accelerator.wait_for_everyone()


def prune_checkpoints(output_dir: str, limit: int | None) -> None:
    """Keep the newest `limit` checkpoint-N directories of `output_dir` (all when limit is None or 0)."""
    if not limit:
        return
    found = sorted(
        (int(d.split("-")[1]), d)
        for d in os.listdir(output_dir)
        if d.startswith("checkpoint-") and d.split("-")[1].isdigit()
    )
    for _, name in found[: max(0, len(found) - limit)]:
        shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
