"""Bad limits fail where they are given, naming the field, the value, the valid range and the fix; statuses and the
seccomp filter's layout are decided by pure functions, tested here without a sandbox."""

from __future__ import annotations

import signal
import struct

import pytest

from rlhfkit.errors import ConfigError
from rlhfkit.sandbox import SandboxLimits, run_code
from rlhfkit.sandbox.limits import BOUNDS, limits_from
from rlhfkit.sandbox.pool import SandboxPool
from rlhfkit.sandbox.result import classify, exit_code_of
from rlhfkit.sandbox.seccomp import ARCHES, no_user_namespaces_filter


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout_s", -1),
        ("timeout_s", 0),
        ("timeout_s", float("nan")),
        ("timeout_s", 10_000),
        ("memory_mb", 8),
        ("memory_mb", 100.5),
        ("max_processes", 0),
        ("max_output_bytes", 0),
        ("disk_mb", "16"),
        ("max_open_files", True),
    ],
)
def test_a_bad_limit_names_field_value_range_and_fix(field, value):
    with pytest.raises(ConfigError) as info:
        SandboxLimits(**{field: value})
    message = str(info.value)
    assert f"{field}={value!r}" in message
    assert BOUNDS[field].describe() in message
    assert f"default ({field}={getattr(SandboxLimits(), field)!r})" in message


def test_run_code_checks_limits_before_anything_runs():
    with pytest.raises(ConfigError, match=r"timeout_s=-1 is not valid: it must be a number > 0 and <= 3600"):
        run_code("print(1)", timeout_s=-1)
    with pytest.raises(ConfigError, match="unknown sandbox limit 'timeout'.*timeout_s"):
        run_code("print(1)", timeout=1)
    with pytest.raises(ConfigError, match="workers=0 is not valid: it must be an integer >= 1"):
        SandboxPool(workers=0)


def test_overrides_keep_the_other_fields():
    base = SandboxLimits(memory_mb=256)
    assert limits_from(base, timeout_s=2) == SandboxLimits(memory_mb=256, timeout_s=2)
    assert limits_from(None) == SandboxLimits()
    assert SandboxLimits(timeout_s=0.5).cpu_seconds == 1 and SandboxLimits(timeout_s=2.5).cpu_seconds == 3


@pytest.mark.parametrize(
    ("exit_code", "killed", "stderr", "status"),
    [
        (0, None, "", "ok"),
        (1, None, "Traceback ...\nValueError: x\n", "error"),
        (None, "timeout", "", "timeout"),
        (None, "output_limit", "", "output_limit"),
        (-signal.SIGXCPU, None, "", "timeout"),
        (1, None, "Traceback ...\nMemoryError\n", "memory"),
        (1, None, "Traceback ...\nOSError: [Errno 28] No space left on device\n", "disk"),
        (1, None, "Traceback ...\nOSError: [Errno 27] File too large\n", "disk"),
        (-signal.SIGXFSZ, None, "", "disk"),
        (-signal.SIGKILL, None, "", "error"),
        (0, None, "MemoryError\n", "ok"),  # caught and recovered: it ended well
    ],
)
def test_classify(exit_code, killed, stderr, status):
    assert classify(exit_code, killed, stderr) == status


def test_exit_codes_through_bubblewrap_read_signals():
    assert exit_code_of(3 << 8, through_bwrap=True) == 3
    assert exit_code_of((128 + 9) << 8, through_bwrap=True) == -9
    assert exit_code_of((128 + 9) << 8, through_bwrap=False) == 137
    assert exit_code_of(signal.SIGKILL, through_bwrap=False) == -9  # a raw wait status: killed by signal 9


@pytest.mark.parametrize("machine", sorted(ARCHES))
def test_seccomp_filter_layout(machine):
    program = no_user_namespaces_filter(machine)
    assert len(program) % 8 == 0
    instructions = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    for index, (code, jt, jf, _) in enumerate(instructions):  # every jump lands inside the program
        if code & 0x07 == 0x05:  # BPF_JMP
            assert index + 1 + max(jt, jf) < len(instructions)
    assert instructions[-1][0] == 0x06  # ends with a return
    assert no_user_namespaces_filter("riscv64") is None
