"""run_code: one program in a fresh sandbox, its output read as it comes and cut at the limit, its status decided.

The program and its stdin reach the sandbox through anonymous in-memory files (memfd), so nothing is written to the
host's disk. stdout and stderr are read incrementally from pipes, alongside a pidfd that says when bubblewrap exited;
the first of these ends the run: both pipes closed and the process gone, the wall-clock deadline, or either stream
past max_output_bytes. Killing means SIGKILL to bubblewrap's process group: with --die-with-parent its PID 1 dies
with it, and the kernel then kills every process left in the sandbox's PID namespace, daemons included.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rlhfkit.errors import SandboxUnavailableError, UnsandboxedCodeWarning

from .bootstrap import BOOTSTRAP, bootstrap_args
from .bwrap import ENV, bwrap_command, default_python, interpreter_prefixes, require_bwrap, resolved_python
from .limits import SandboxLimits, limits_from
from .result import Killed, SandboxResult, classify, exit_code_of
from .seccomp import no_user_namespaces_filter

READ_CHUNK = 1 << 16
# Bytes a pipe takes without a reader on Linux (its default capacity).
PIPE_BYTES = 1 << 16
# Seconds to wait for the output pipes to close once bubblewrap (or the unsandboxed program) has exited.
EXIT_GRACE_S = 1.0
# bubblewrap started as root runs each program as a user id of its own, from 2^30 up: above any real account, offset
# by the training process's pid so that two training processes on one machine do not share ids (RLIMIT_NPROC counts
# the processes of a user id across the machine; a fork bomb in one sandbox must not starve another).
UID_BASE = 1 << 30
UID_SLOTS = 256


class UidSlots:
    """User ids for sandboxes started as root, one per running sandbox, handed back when it ends."""

    def __init__(self, base: int, size: int):
        self._free = list(range(base + size - 1, base - 1, -1))
        self._ready = threading.Condition()

    @contextmanager
    def taken(self) -> Iterator[int]:
        with self._ready:
            self._ready.wait_for(lambda: self._free)
            uid = self._free.pop()
        try:
            yield uid
        finally:
            with self._ready:
                self._free.append(uid)
                self._ready.notify()


_UIDS = UidSlots(UID_BASE + (os.getpid() % 4096) * UID_SLOTS, UID_SLOTS)
_warned_unsandboxed = threading.Event()


def run_code(
    code: str,
    *,
    stdin: str = "",
    python: str | None = None,
    allow_unsandboxed: bool = False,
    limits: SandboxLimits | None = None,
    **limit_overrides,
) -> SandboxResult:
    """Run Python source `code` in a fresh sandbox and return how it ended (SandboxResult).

    stdin: the text the program reads from its standard input. python: the interpreter that runs it (default: the
    training interpreter's base installation; its standard library is visible, a virtual environment's packages are
    not). limits: a SandboxLimits; any of its fields may also be given as keywords (timeout_s=2, memory_mb=256, ...),
    checked with a ConfigError naming the field, the value and the valid range.

    Without bubblewrap this raises SandboxUnavailableError with the install line, unless allow_unsandboxed=True: then
    the program runs with the same resource limits but no isolation (docs/sandbox.md), with one warning per process.
    Nothing the program does raises here; its failures are its status."""
    limits = limits_from(limits, **limit_overrides)
    if not isinstance(code, str) or not isinstance(stdin, str):
        raise TypeError(f"run_code takes code and stdin as str, got {type(code).__name__} and {type(stdin).__name__}")
    python = resolved_python(python) if python else default_python()
    if allow_unsandboxed and not _bwrap_available():
        return _run_unsandboxed(code, stdin, python, limits)
    return _run_sandboxed(code, stdin, python, limits)


def _bwrap_available() -> bool:
    try:
        require_bwrap()
    except SandboxUnavailableError:
        return False
    return True


def _memfd(name: str, data: bytes) -> int:
    """A read-only descriptor of an anonymous in-memory file holding `data`, positioned at its start."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        _write_all(fd, data)
        readonly = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(fd)
    return readonly


def _stdin_fd(data: bytes) -> int:
    """The read end of a pipe holding `data`, its write end closed: what is read from it is gone (a harness may hand the
    program a secret on stdin that the program cannot read again). Data larger than a pipe holds goes in a memfd."""
    if len(data) > PIPE_BYTES:
        return _memfd("stdin", data)
    read, write = os.pipe2(os.O_CLOEXEC)
    try:
        _write_all(write, data)
    finally:
        os.close(write)
    return read


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _run_sandboxed(code: str, stdin: str, python: str, limits: SandboxLimits) -> SandboxResult:
    bwrap = require_bwrap()
    prefixes = interpreter_prefixes(python)
    flt = no_user_namespaces_filter()
    root = os.geteuid() == 0
    with _UIDS.taken() if root else _no_uid() as uid:
        fds = [_memfd("program", code.encode("utf-8")), _stdin_fd(stdin.encode("utf-8"))]
        if flt is not None:
            fds.append(_memfd("seccomp", flt))
        status_r, status_w = os.pipe()
        fds.append(status_w)
        program_fd, stdin_fd = fds[0], fds[1]
        seccomp_fd = fds[2] if flt is not None else None
        command = bwrap_command(bwrap, python, prefixes, limits, program_fd, status_w, seccomp_fd, uid)
        try:
            passed = [fd for fd in (program_fd, status_w, seccomp_fd) if fd is not None]
            outcome = _supervise(command, stdin_fd, passed, None, limits, through_bwrap=True)
        finally:
            for fd in fds:
                os.close(fd)
            status = _read_all(status_r)
    if outcome.killed is None and b'"exit-code"' not in status:
        raise SandboxUnavailableError(
            f"the sandbox could not start (bubblewrap exit status {outcome.wait_status >> 8}): "
            f"{outcome.stderr.decode('utf-8', 'replace').strip()[:500]}. Check that bubblewrap works here "
            "(user namespaces enabled, or run as root), and that the interpreter "
            f"{python!r} is readable by the sandbox."
        )
    return outcome.result(sandboxed=True)


@contextmanager
def _no_uid() -> Iterator[None]:
    yield None


def _read_all(fd: int) -> bytes:
    """Everything left in pipe `fd` (its writers closed), then close it."""
    chunks = []
    try:
        while chunk := os.read(fd, READ_CHUNK):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _run_unsandboxed(code: str, stdin: str, python: str, limits: SandboxLimits) -> SandboxResult:
    """The weaker mode: the same bootstrap and limits in a fresh temporary directory, as the calling user, in a session
    of its own (killed as a process group), with the fixed environment. No namespaces: see docs/sandbox.md."""
    if not _warned_unsandboxed.is_set():
        _warned_unsandboxed.set()
        warnings.warn(
            "rlhfkit.sandbox: bubblewrap is missing and allow_unsandboxed=True was given, so model-written code runs "
            "with resource limits only: it can read your files and tokens, use the network and outlive the call. "
            "Install bubblewrap (apt-get install -y bubblewrap) to isolate it.",
            UnsandboxedCodeWarning,
            stacklevel=3,
        )
    with tempfile.TemporaryDirectory(prefix="rlhfkit-unsandboxed-") as work:
        program = os.path.join(work, "main.py")
        with open(program, "w", encoding="utf-8") as f:
            f.write(code)
        stdin_fd = _stdin_fd(stdin.encode("utf-8"))
        command = [python, "-I", "-c", BOOTSTRAP, *bootstrap_args(program, -1, limits)]
        try:
            outcome = _supervise(command, stdin_fd, [], {**ENV, "HOME": work}, limits, through_bwrap=False, cwd=work)
        finally:
            os.close(stdin_fd)
    return outcome.result(sandboxed=False)


@dataclass
class _Outcome:
    """What the supervisor saw of one run."""

    stdout: bytes
    stderr: bytes
    truncated: bool
    killed: Killed | None
    wait_status: int
    seconds: float
    through_bwrap: bool

    def result(self, sandboxed: bool) -> SandboxResult:
        exit_code = None if self.killed else exit_code_of(self.wait_status, self.through_bwrap)
        stderr = self.stderr.decode("utf-8", "replace")
        status = classify(exit_code, self.killed, stderr)
        return SandboxResult(
            status=status,
            exit_code=exit_code,
            stdout=self.stdout.decode("utf-8", "replace"),
            stderr=stderr,
            truncated=self.truncated,
            seconds=self.seconds,
            sandboxed=sandboxed,
        )


def _supervise(
    command: list[str],
    stdin_fd: int,
    pass_fds: list[int],
    env: dict | None,
    limits: SandboxLimits,
    through_bwrap: bool,
    cwd: str = "/",
) -> _Outcome:
    """Start `command` in a session of its own, read its output until it ends or a limit is hit, kill its process group
    on a limit, and reap it."""
    start = time.monotonic()
    deadline = start + limits.timeout_s
    proc = subprocess.Popen(
        command,
        stdin=stdin_fd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=pass_fds,
        env=env if env is not None else {},
        cwd=cwd,
        start_new_session=True,
    )
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    kept = {out_fd: bytearray(), err_fd: bytearray()}
    truncated, killed, exited = False, None, False
    pidfd = os.pidfd_open(proc.pid)
    try:
        with selectors.DefaultSelector() as selector:
            for fd in kept:
                os.set_blocking(fd, False)
                selector.register(fd, selectors.EVENT_READ)
            selector.register(pidfd, selectors.EVENT_READ)
            while killed is None and not (exited and len(selector.get_map()) == 0):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    killed = None if exited else "timeout"
                    break
                for key, _ in selector.select(remaining):
                    if key.fd == pidfd:
                        exited = True
                        selector.unregister(pidfd)
                        # bubblewrap is gone and with it the sandbox's PID namespace: its pipes close as its
                        # processes die. (Unsandboxed, a child that left the session may hold them: stop waiting.)
                        deadline = min(deadline, time.monotonic() + EXIT_GRACE_S)
                        continue
                    chunk = _read_some(key.fd)
                    if chunk is None:
                        continue
                    if not chunk:
                        selector.unregister(key.fd)
                        continue
                    buffer = kept[key.fd]
                    room = limits.max_output_bytes - len(buffer)
                    buffer += chunk[:room]
                    if len(chunk) > room:
                        truncated, killed = True, "output_limit"
                        break
        if killed is not None:
            _kill_group(proc.pid)
        _, wait_status = os.waitpid(proc.pid, 0)
    finally:
        os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
    proc.returncode = wait_status  # reaped here: Popen must not wait for it again
    if not through_bwrap:
        _kill_group(proc.pid)  # what it left in its session (a child that left the session is not reached)
    return _Outcome(
        stdout=bytes(kept[out_fd]),
        stderr=bytes(kept[err_fd]),
        truncated=truncated,
        killed=killed,
        wait_status=wait_status,
        seconds=time.monotonic() - start,
        through_bwrap=through_bwrap,
    )


def _read_some(fd: int) -> bytes | None:
    """Up to READ_CHUNK bytes of non-blocking pipe `fd`: b"" at its end, None when nothing is there yet."""
    try:
        return os.read(fd, READ_CHUNK)
    except BlockingIOError:
        return None


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
