"""The bubblewrap command line of one sandbox, and what it needs from the machine: bwrap itself, the interpreter's
installation, the system directories.

What the program sees (everything else of the host is absent, not merely unreadable):

- ``/usr`` (and the /bin, /lib, /lib64, /sbin links or directories beside it), read-only: the C library and the
  system's files; ``/etc``, ``/home``, ``/root``, ``/work``, ``/tmp`` and every cache are not there;
- the interpreter's own installation (its ``sys.base_prefix``), read-only, at the same path, when it lives outside
  /usr (a pyenv or conda install): the standard library, not a virtual environment's packages;
- ``/sandbox/main.py``, the program, read-only; ``/tmp``, an empty tmpfs of ``disk_mb`` MiB, its home and working
  directory, the only writable place;
- a fresh ``/proc`` of its own PID namespace and a minimal, read-only ``/dev`` (null, zero, random, urandom, tty; no
  writable /dev/shm, so no POSIX shared memory or multiprocessing semaphores).

Namespaces: its own mount, PID, network (only a loopback of its own: nothing to connect to), IPC, UTS and cgroup
namespaces; ``--new-session`` (no terminal to push keystrokes into); ``--die-with-parent`` (if bubblewrap or the
training process dies, so does the program); the environment cleared and set to ENV.

Who the program runs as. Started by an ordinary user, bubblewrap makes a user namespace of its own (then
RLIMIT_NPROC counts the processes of that namespace only, so each sandbox has its own budget); its --disable-userns
stops the program from making more. Started by root, bubblewrap's user namespace would map the program to root,
whose processes RLIMIT_NPROC does not count; so there it makes none, keeps only the capabilities needed to drop
privileges, and the bootstrap switches to an unprivileged user id of the sandbox's own (`uid`). The seccomp filter
(seccomp.py) refuses new user namespaces in both cases.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys

from rlhfkit.errors import SandboxUnavailableError

from .bootstrap import BOOTSTRAP, bootstrap_args
from .limits import MIB, SandboxLimits

INSTALL_LINE = "apt-get install -y bubblewrap (Debian/Ubuntu; dnf install bubblewrap on Fedora)"
PROGRAM_PATH = "/sandbox/main.py"
WORK_DIR = "/tmp"
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORK_DIR, "LANG": "C.UTF-8"}
# Beside /usr: on a merged-/usr system these are links into it, elsewhere directories of their own.
SYSTEM_DIRS = ("/usr",)
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What the bootstrap needs when bubblewrap starts as root: to give /tmp to the sandbox's user and become it.
ROOT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN")


def find_bwrap() -> str | None:
    """Path of the bwrap executable on PATH (or in /usr/bin), None without one."""
    return shutil.which("bwrap") or (shutil.which("bwrap", path="/usr/bin:/bin"))


def require_bwrap() -> str:
    """bwrap's path, or SandboxUnavailableError with the install line and the opt-in to the weaker mode."""
    path = find_bwrap()
    if path is None:
        raise SandboxUnavailableError(
            "rlhfkit.sandbox runs model-written code under bubblewrap, and bwrap is not installed here. Install it: "
            f"{INSTALL_LINE}. Only if this machine holds nothing worth protecting, pass allow_unsandboxed=True for "
            "the weaker limits-only mode (docs/sandbox.md: what it does not protect)."
        )
    return path


def default_python() -> str:
    """The training interpreter, symlinks resolved (resolved_python)."""
    return resolved_python(sys.executable)


def resolved_python(python: str) -> str:
    """`python` with its symlinks resolved: a virtual environment's python is a link to its base installation, which is
    what the sandbox binds (the environment's packages are not the sandboxed program's)."""
    return os.path.realpath(python)


@functools.lru_cache(maxsize=16)
def interpreter_prefixes(python: str) -> tuple[str, ...]:
    """The directories interpreter `python` needs (its sys.base_prefix and base_exec_prefix), asked of it once.

    Raises SandboxUnavailableError naming `python` when it cannot be run."""
    probe = "import sys, json; print(json.dumps([sys.base_prefix, sys.base_exec_prefix]))"
    try:
        out = subprocess.run([python, "-I", "-S", "-c", probe], capture_output=True, text=True, timeout=60, env=ENV)
        prefixes = json.loads(out.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailableError(
            f"sandbox python={python!r} cannot be run to find its installation ({type(e).__name__}: {e}). Pass the "
            "path of a working Python 3 interpreter (default: the training interpreter)."
        ) from None
    return tuple(dict.fromkeys(os.path.realpath(p) for p in prefixes))


@functools.lru_cache(maxsize=1)
def system_binds() -> tuple[str, ...]:
    """bwrap arguments for /usr and the top-level links or directories beside it, as the host has them."""
    args: list[str] = []
    for path in SYSTEM_DIRS:
        args += ["--ro-bind", path, path]
    for path in SYSTEM_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return tuple(args)


def interpreter_binds(prefixes: tuple[str, ...]) -> list[str]:
    """Read-only binds of the interpreter's installation directories not already under /usr, each below directories
    made traversable (0755): bubblewrap would give them the host's modes, and a pyenv under root's 0700 home would stay
    out of reach of the sandbox's unprivileged user."""
    args: list[str] = []
    made: set[str] = set()
    for prefix in prefixes:
        if any(prefix == d or prefix.startswith(d + "/") for d in SYSTEM_DIRS):
            continue
        parts = prefix.strip("/").split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[:depth])
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", prefix, prefix]
    return args


def bwrap_command(
    bwrap: str,
    python: str,
    prefixes: tuple[str, ...],
    limits: SandboxLimits,
    program_fd: int,
    status_fd: int,
    seccomp_fd: int | None,
    uid: int | None,
) -> list[str]:
    """The whole command line of one sandbox (the module docstring says what it gives the program).

    program_fd: a readable file descriptor holding the program, copied to PROGRAM_PATH; status_fd: where bwrap writes
    its JSON status (the child's pid, then its exit code); seccomp_fd: the filter (seccomp.py) or None; uid: None when
    bubblewrap starts unprivileged, else the user id the bootstrap switches to (bubblewrap started as root)."""
    if uid is None:
        namespaces = ["--unshare-all", "--unshare-user", "--disable-userns"]
    else:
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        namespaces += ["--cap-drop", "ALL"] + [arg for cap in ROOT_CAPS for arg in ("--cap-add", cap)]
    env = [arg for name, value in ENV.items() for arg in ("--setenv", name, value)]
    filesystem = [
        *system_binds(),
        *interpreter_binds(prefixes),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--remount-ro",  # its tmpfs (and /dev/shm in it) has no size limit: only /tmp may be written
        "/dev",
        "--size",
        str(limits.disk_mb * MIB),
        "--tmpfs",
        WORK_DIR,
        "--perms",
        "0444",
        "--ro-bind-data",
        str(program_fd),
        PROGRAM_PATH,
        "--remount-ro",
        "/",
    ]
    seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    return [
        bwrap,
        *namespaces,
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        *env,
        *filesystem,
        "--chdir",
        WORK_DIR,
        *seccomp,
        "--json-status-fd",
        str(status_fd),
        "--",
        python,
        "-I",
        "-c",
        BOOTSTRAP,
        *bootstrap_args(PROGRAM_PATH, -1 if uid is None else uid, limits),
    ]
