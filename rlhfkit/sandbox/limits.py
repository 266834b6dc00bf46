"""What one sandboxed program may use: its limits, their defaults and their valid ranges, checked once.

The defaults fit unit-test programs (a function and a few asserts): a few seconds, a few hundred MB, a handful of
processes. Every field is checked when the record is made, so a bad value fails in the caller's frame with the field,
the value, the valid range and the fix, not as an obscure failure inside the sandbox.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from rlhfkit.errors import ConfigError

MIB = 1 << 20


@dataclass(frozen=True)
class Bound:
    """The valid range of one numeric limit, and what its unit means (for the error message)."""

    low: float
    high: float
    unit: str
    low_inclusive: bool = True
    integer: bool = True

    def describe(self) -> str:
        low = f">= {self.low:g}" if self.low_inclusive else f"> {self.low:g}"
        kind = "an integer" if self.integer else "a number"
        return f"{kind} {low} and <= {self.high:g} ({self.unit})"

    def holds(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not float(value).is_integer():
            return False
        if not math.isfinite(value):
            return False
        above = value >= self.low if self.low_inclusive else value > self.low
        return above and value <= self.high


@dataclass(frozen=True)
class SandboxLimits:
    """The limits of one run (run_code, the pool, code_reward and the python tool take these fields as keywords).

    timeout_s: wall-clock seconds before the whole sandbox is killed (status "timeout"); CPU time is capped at the
        next whole second above it, so a busy loop and a sleeping program are both stopped.
    memory_mb: address space of each process (RLIMIT_AS), in MiB; past it allocations fail (status "memory").
    max_processes: processes and threads the program may have at once, itself included (RLIMIT_NPROC); a fork bomb
        gets EAGAIN past it.
    max_output_bytes: bytes kept of stdout and of stderr each; a program that writes more is killed at once
        (status "output_limit"), so printing a gigabyte costs the time to read max_output_bytes.
    disk_mb: size of the program's only writable directory (a tmpfs, its home and working directory) and the largest
        file it may write (RLIMIT_FSIZE); past it writes fail (status "disk").
    max_open_files: open file descriptors per process (RLIMIT_NOFILE).
    """

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 16
    max_output_bytes: int = 64 * 1024
    disk_mb: int = 16
    max_open_files: int = 64

    def __post_init__(self) -> None:
        for field in fields(self):
            check_limit(field.name, getattr(self, field.name))

    @property
    def cpu_seconds(self) -> int:
        """RLIMIT_CPU's soft limit: the whole second at or above timeout_s (the hard limit is one second more)."""
        return max(1, math.ceil(self.timeout_s))


BOUNDS: dict[str, Bound] = {
    "timeout_s": Bound(0, 3600, "seconds of wall-clock time", low_inclusive=False, integer=False),
    "memory_mb": Bound(32, 1 << 20, "MiB of address space per process"),
    "max_processes": Bound(1, 4096, "processes and threads at once"),
    "max_output_bytes": Bound(1, 64 * MIB, "bytes kept of stdout and of stderr each"),
    "disk_mb": Bound(1, 64 * 1024, "MiB of writable directory and largest file"),
    "max_open_files": Bound(16, 65536, "open file descriptors per process"),
}


def check_limit(name: str, value) -> None:
    """Raise ConfigError naming `name`, `value`, the valid range and the fix when `value` is outside BOUNDS[name]."""
    bound = BOUNDS[name]
    if not bound.holds(value):
        default = getattr(SandboxLimits, name)
        raise ConfigError(
            f"sandbox limit {name}={value!r} is not valid: it must be {bound.describe()}. Pass a value in that range, "
            f"or leave it out for the default ({name}={default!r})."
        )


def limits_from(limits: SandboxLimits | None = None, **overrides) -> SandboxLimits:
    """`limits` (default: SandboxLimits()) with the fields in `overrides` replaced; an unknown name is a ConfigError
    listing the known ones."""
    base = limits if limits is not None else SandboxLimits()
    known = {f.name for f in fields(SandboxLimits)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(
            f"unknown sandbox limit {unknown[0]!r}: the limits are {', '.join(sorted(known))} (rlhfkit.sandbox."
            "SandboxLimits)."
        )
    if not overrides:
        return base
    values = {f.name: getattr(base, f.name) for f in fields(SandboxLimits)}
    return SandboxLimits(**{**values, **overrides})
