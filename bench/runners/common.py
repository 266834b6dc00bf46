"""What every runner does around its library's trainer (standard library, torch and transformers only).

A runner is started by bench/run.py as ``PYTHON runners/<runner>.py SPEC.json`` in its library's environment.
SPEC.json holds the trainer's settings (the same field names on both sides), the asset paths, the thread count,
the seed and where to write RESULT.json.
"""

from __future__ import annotations

import json
import sys
import time

PROCESS_START = time.time()


def load_spec() -> dict:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    import torch

    torch.set_num_threads(int(spec["threads"]))
    return spec


def install_probe():
    from probe import Probe

    return Probe().install()


def run_timed(probe, train) -> float:
    """Call ``train()`` with the probe enabled; returns its wall time in seconds."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    from probe import peak_rss_mb

    probe.peak_rss_before_train_mb = peak_rss_mb()  # imports, models and data loaded
    probe.enabled = True
    t0, c0 = time.perf_counter(), time.process_time()
    train()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    probe.train_cpu_seconds = time.process_time() - c0  # CPU time of all the process's threads
    probe.enabled = False
    return seconds


def finish(
    spec: dict,
    probe,
    library: str,
    version: str,
    train_seconds: float,
    model_dir: str,
    setup_seconds: float,
    extra: dict | None = None,
) -> None:
    """Peak RSS (before evaluation), task success of the saved policy, then RESULT.json."""
    import torch
    from evaluate import task_success
    from probe import peak_rss_mb

    peak = peak_rss_mb()
    gpu_peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    t0 = time.perf_counter()
    success = task_success(
        model_dir, spec["paths"]["eval_tokenizer"], spec["paths"]["prompts"], spec["eval_max_new_tokens"]
    )
    result = {
        "library": library,
        "version": version,
        "trainer": spec["trainer"],
        "run": spec["run"],
        "seed": spec["seed"],
        "threads": torch.get_num_threads(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "train_seconds": round(train_seconds, 4),
        "train_cpu_seconds": round(probe.train_cpu_seconds, 4),
        "setup_seconds": round(setup_seconds, 4),
        "episodes": spec["episodes"],
        "peak_rss_mb": round(peak, 1),
        "peak_rss_before_train_mb": round(getattr(probe, "peak_rss_before_train_mb", float("nan")), 1),
        "peak_gpu_mb": round(gpu_peak, 1) if gpu_peak is not None else None,
        **probe.summary(train_seconds, probe.train_cpu_seconds),
        **success,
        "eval_seconds": round(time.perf_counter() - t0, 3),
        "process_peak_rss_mb": round(peak_rss_mb(), 1),  # the whole process, the success check included
        "modules": sorted(m for m in ("trl", "rlhfkit") if m in sys.modules),
        **(extra or {}),
    }
    with open(spec["result"], "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))
