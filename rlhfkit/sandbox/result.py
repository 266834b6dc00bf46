"""What one sandboxed run gives back, and how its status is decided from what was observed (pure functions).

Statuses, first match wins:

- ``output_limit``: the program wrote more than max_output_bytes to stdout or to stderr, and was killed at once;
- ``timeout``: it ran past timeout_s of wall-clock time and was killed, or past its CPU-time limit (killed by
  SIGXCPU; one that catches SIGXCPU is killed a second later by SIGKILL, and reads as ``error`` with exit code -9);
- ``memory``: it died of MemoryError, an allocation past memory_mb (a C extension that crashes on a failed
  allocation instead ends as ``error`` with its signal);
- ``disk``: it died of "No space left on device" or "File too large" (past disk_mb), or of SIGXFSZ;
- ``ok``: it exited with status 0;
- ``error``: anything else: an exception, a non-zero exit status, a signal.

A program that catches its own MemoryError or OSError and exits 0 is "ok": the status says how the program ended,
and the limits held either way.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "disk"]
STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "memory", "output_limit", "disk")
Killed = Literal["timeout", "output_limit"]

# The last line of a Python traceback: "MemoryError", "builtins.MemoryError: ...", "OSError: [Errno 28] ...".
_MEMORY_LINE = re.compile(r"^(?:[\w.]+\.)?MemoryError\b")
_DISK_LINE = re.compile(r"^(?:[\w.]+\.)?(?:OSError|IOError|FileTooLargeError)\b.*\[Errno (?:27|28)\]")


@dataclass(frozen=True)
class SandboxResult:
    """One program's run.

    status: one of STATUSES (module docstring).
    exit_code: the program's exit status; minus the signal number when a signal ended it (as subprocess reports it);
        None when it was killed by the sandbox (timeout, output_limit) before it could exit.
    stdout, stderr: what it wrote, decoded as UTF-8 (invalid bytes replaced), each cut to max_output_bytes.
    truncated: True when stdout or stderr was cut.
    seconds: wall-clock seconds from the start of the sandbox to its end, setup included.
    sandboxed: False in the weaker limits-only mode (allow_unsandboxed=True without bubblewrap).
    """

    status: Status
    exit_code: int | None
    stdout: str
    stderr: str
    truncated: bool
    seconds: float
    sandboxed: bool = True

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def exit_code_of(wait_status: int, through_bwrap: bool) -> int:
    """The program's exit code from a wait status: minus the signal number when a signal ended it.

    bubblewrap reports a child ended by signal N as exit status 128 + N; through it, an exit status above 128 is read as
    that signal (a program that itself exits with 128 + N reads the same)."""
    if os.WIFSIGNALED(wait_status):
        return -os.WTERMSIG(wait_status)
    code = os.WEXITSTATUS(wait_status)
    if through_bwrap and code > 128 and (code - 128) in SIGNAL_NUMBERS:
        return -(code - 128)
    return code


SIGNAL_NUMBERS = frozenset(int(s) for s in signal.Signals)


def last_line(text: str) -> str:
    """The last non-empty line of `text`, stripped ("" when there is none)."""
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return ""


def classify(exit_code: int | None, killed: Killed | None, stderr: str) -> Status:
    """The run's status (module docstring) from its exit code (None: killed by the sandbox), why the sandbox killed it,
    and its stderr."""
    if killed is not None:
        return killed
    if exit_code == -signal.SIGXCPU:
        return "timeout"
    final = last_line(stderr)
    if exit_code != 0 and _MEMORY_LINE.match(final):
        return "memory"
    if exit_code == -signal.SIGXFSZ or (exit_code != 0 and _DISK_LINE.match(final)):
        return "disk"
    if exit_code == 0:
        return "ok"
    return "error"
