"""The few lines that run first inside the sandbox, in the chosen interpreter: they set the program's resource limits,
drop to the sandbox's own user id where the sandbox started as root, and run the program as ``__main__``.

Why inside: limits set on bubblewrap itself would also bind bubblewrap's own processes, and RLIMIT_NPROC counts every
process of a user id, so a limit set outside would be shared with the other sandboxes of the pool. Set here, after
the namespaces exist, they bind the program and what it starts, and nothing else.

The text is given to the interpreter with ``-c``; its arguments (sys.argv[1:]) are the program's path, the user id to
run as (-1: keep the current one) and the limits, as integers.
"""

from __future__ import annotations

from .limits import MIB, SandboxLimits

BOOTSTRAP = """\
import os, resource, sys
program, uid, cpu, memory, nproc, fsize, nofile = sys.argv[1], *map(int, sys.argv[2:8])
for limit, soft, hard in (
    (resource.RLIMIT_CORE, 0, 0),
    (resource.RLIMIT_CPU, cpu, cpu + 1),
    (resource.RLIMIT_FSIZE, fsize, fsize),
    (resource.RLIMIT_NOFILE, nofile, nofile),
    (resource.RLIMIT_AS, memory, memory),
    (resource.RLIMIT_NPROC, nproc, nproc),
):
    resource.setrlimit(limit, (soft, hard))
if uid >= 0:
    os.chown(os.getcwd(), uid, uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
with open(program, encoding="utf-8", errors="replace") as f:
    source = f.read()
del f, limit, soft, hard, cpu, memory, nproc, fsize, nofile, uid
sys.argv = [program]
exec(compile(source, program, "exec"), {"__name__": "__main__", "__file__": program, "__builtins__": __builtins__})
"""


def bootstrap_args(program_path: str, uid: int, limits: SandboxLimits) -> list[str]:
    """The interpreter's arguments after ``-c BOOTSTRAP``: the program's path, the user id and the limits in the
    order BOOTSTRAP reads them (bytes, seconds, counts)."""
    return [
        program_path,
        str(uid),
        str(limits.cpu_seconds),
        str(limits.memory_mb * MIB),
        str(limits.max_processes),
        str(limits.disk_mb * MIB),
        str(limits.max_open_files),
    ]
