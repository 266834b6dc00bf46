"""What a test checks on the host after a hostile program: no process of any sandbox left, nothing written."""

from __future__ import annotations

import os
import time

from rlhfkit.sandbox.bwrap import PROGRAM_PATH


def processes_with(marker: bytes) -> list[int]:
    """Host pids whose command line contains `marker` (this process excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker in f.read():
                    found.append(int(entry))
        except OSError:  # it ended while we looked
            continue
    return found


def sandbox_processes() -> list[int]:
    """Processes running a sandboxed program: the bootstrap's command line names the program's path."""
    return processes_with(PROGRAM_PATH.encode())


def wait_until_gone(pids_of, seconds: float = 3.0) -> list[int]:
    """pids_of() once it is empty, or what is left after `seconds` (the kernel tears a PID namespace down
    asynchronously, in a few milliseconds)."""
    deadline = time.monotonic() + seconds
    left = pids_of()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = pids_of()
    return left


def sandbox_uid_processes(lowest_uid: int) -> list[int]:
    """Host pids whose real user id is `lowest_uid` or above (bubblewrap started as root runs programs there)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as f:
                uid_line = next(line for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if int(uid_line.split()[1]) >= lowest_uid:
            found.append(int(entry))
    return found
