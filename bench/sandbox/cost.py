"""What the sandbox costs: one program's time in it against a bare ``subprocess.run`` of the same interpreter, and the
pool's throughput on a batch of unit-test programs (code_reward's, 64 completions) by number of workers.

    python bench/sandbox/cost.py            # 3 rounds, medians; prints markdown tables (docs/sandbox.md holds them)
    python bench/sandbox/cost.py --rounds 5 --batch 128

Run it with rlhfkit's interpreter on an otherwise quiet machine, and compare ratios rather than absolute times: the
machines are shared. Each round alternates the ways of running, so a burst of other work hits them alike.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):  # run as a script: rlhfkit from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlhfkit.sandbox import make_code_reward, run_code  # noqa: E402
from rlhfkit.sandbox.bwrap import default_python  # noqa: E402
from rlhfkit.tasks import code as code_task  # noqa: E402

PROGRAM = "def f(x):\n    return x * 3 + 1\nassert f(2) == 7\nprint('ok')"


def cpu_name() -> str:
    """The CPU's model name as lscpu reports it, and the CPUs this process may use."""
    name = platform.processor() or "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        pass
    return f"{name}, {len(os.sched_getaffinity(0))} CPUs"


def per_program_seconds(runs: int) -> dict[str, float]:
    """Median seconds of one program: bare subprocess.run, the sandbox, and the limits-only mode (serial calls)."""
    python = default_python()
    ways = {
        "bare subprocess.run": lambda: subprocess.run([python, "-I", "-c", PROGRAM], capture_output=True, check=True),
        "run_code (bubblewrap)": lambda: run_code(PROGRAM),
        "run_code (limits only)": _unsandboxed,
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(runs):
        for name, way in ways.items():
            start = time.perf_counter()
            way()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _unsandboxed() -> None:
    """The limits-only mode, forced even where bubblewrap exists (what a machine without it would pay)."""
    from rlhfkit.errors import UnsandboxedCodeWarning
    from rlhfkit.sandbox import SandboxLimits
    from rlhfkit.sandbox.run import _run_unsandboxed

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsandboxedCodeWarning)
        _run_unsandboxed(PROGRAM, "", default_python(), SandboxLimits())


def batch_throughput(batch: int, workers: int, rounds: int) -> tuple[float, float]:
    """(median programs/s, median seconds) of code_reward's programs for `batch` completions of the code task."""
    import random

    rng = random.Random(0)
    prompts = [code_task.make_example(rng)[0] for _ in range(batch)]
    completions = [code_task.answer(p) for p in prompts]
    tests = [code_task.tests(p) for p in prompts]
    reward = make_code_reward(workers=workers)
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        scores = reward(completions, tests=tests)
        seconds.append(time.perf_counter() - start)
        assert scores == [1.0] * batch, scores
    median = statistics.median(seconds)
    return batch / median, median


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--programs", type=int, default=30, help="serial programs per way, per-program table")
    args = parser.parse_args(argv)
    run_code("pass")  # warm: the interpreter's prefixes are asked once

    print(f"CPU: {cpu_name()}; Python {platform.python_version()}; interpreter {default_python()}\n")
    single = per_program_seconds(args.programs)
    bare = single["bare subprocess.run"]
    print(f"| one program, serial (median of {args.programs}) | ms | x bare |")
    print("|---|---|---|")
    for name, seconds in single.items():
        print(f"| {name} | {seconds * 1000:.1f} | {seconds / bare:.2f} |")

    print(f"\n| code_reward on {args.batch} completions (median of {args.rounds}) | programs/s | s per batch |")
    print("|---|---|---|")
    for workers in sorted({1, 2, 4, len(os.sched_getaffinity(0))}):
        rate, seconds = batch_throughput(args.batch, workers, args.rounds)
        print(f"| {workers} worker{'s' if workers > 1 else ''} | {rate:.1f} | {seconds:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
