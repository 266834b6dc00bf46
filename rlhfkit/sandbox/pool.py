"""Many programs at once on a bounded number of workers: each worker is a thread that drives one sandbox (a bwrap
process) at a time, so a batch of 64 completions costs about 64 / workers program times, not 64."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from rlhfkit.errors import ConfigError

from .limits import SandboxLimits, limits_from
from .result import SandboxResult
from .run import run_code

MAX_WORKERS = 1024


def default_workers() -> int:
    """One worker per CPU this process may run on: a sandboxed program is mostly CPU (the interpreter's start-up)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def check_workers(workers: int) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(
            f"sandbox pool workers={workers!r} is not valid: it must be an integer >= 1 and <= {MAX_WORKERS} (programs "
            f"run at once). Pass a count such as workers={default_workers()} (one per CPU, the default)."
        )
    return workers


class SandboxPool:
    """At most `workers` sandboxes at once (default: one per CPU), every program with the same limits, interpreter
    and mode (run_code's keywords).

    Thread-safe; its threads start on first use and end with close() (or at interpreter exit)."""

    def __init__(
        self,
        workers: int | None = None,
        *,
        python: str | None = None,
        allow_unsandboxed: bool = False,
        limits: SandboxLimits | None = None,
        **limit_overrides,
    ):
        self.workers = check_workers(default_workers() if workers is None else workers)
        self.limits = limits_from(limits, **limit_overrides)
        self.python, self.allow_unsandboxed = python, allow_unsandboxed
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run_many(self, programs: Sequence[str], stdins: Sequence[str] | None = None) -> list[SandboxResult]:
        """One SandboxResult per program, in order; stdins: one stdin text per program (default: empty)."""
        programs = list(programs)
        stdins = [""] * len(programs) if stdins is None else list(stdins)
        if len(stdins) != len(programs):
            raise ConfigError(f"run_many got {len(stdins)} stdins for {len(programs)} programs: give one per program.")
        if not programs:
            return []
        executor = self._ensure_executor()
        futures = [executor.submit(self._run, code, stdin) for code, stdin in zip(programs, stdins)]
        return [future.result() for future in futures]

    def _run(self, code: str, stdin: str) -> SandboxResult:
        return run_code(
            code, stdin=stdin, python=self.python, allow_unsandboxed=self.allow_unsandboxed, limits=self.limits
        )

    def _ensure_executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="rlhfkit-sandbox")
            return self._executor

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_many(
    programs: Sequence[str], *, stdins: Sequence[str] | None = None, workers: int | None = None, **run_kwargs
) -> list[SandboxResult]:
    """run_code over `programs` on a pool of `workers` (default: one per CPU) made for this call; run_kwargs: run_code's
    keywords (python, allow_unsandboxed, limits and the limit fields)."""
    with SandboxPool(workers, **run_kwargs) as pool:
        return pool.run_many(programs, stdins)
