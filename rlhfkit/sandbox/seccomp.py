"""A seccomp filter that refuses new user namespaces and anonymous memory files inside the sandbox (bubblewrap's
``--seccomp FD`` reads it).

Why: inside a user namespace of its own a program is "root" over the mounts it makes, so it could mount a fresh
tmpfs of any size (the machine's memory) past the sandbox's disk limit, and it reaches far more kernel code, where
most privilege-escalation bugs of recent years were found. memfd_create() makes files in memory that no mount's size
bounds (only RLIMIT_FSIZE each, times open files, times processes). Nothing a unit-test program needs either.

The filter is classic BPF, built here so that no libseccomp is needed: on x86-64 and AArch64, unshare() and clone()
with CLONE_NEWUSER and memfd_create() fail with EPERM, and clone3() fails with ENOSYS (its flags sit in memory a filter cannot read;
the C library then falls back to clone(), which the filter can check). Every other system call is allowed. On other
architectures there is no filter, and bubblewrap's own --disable-userns (where the sandbox has a user namespace of
its own) is what remains.
"""

from __future__ import annotations

import errno
import platform
import struct

# linux/filter.h and linux/seccomp.h
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
BPF_RET_K = 0x06  # BPF_RET | BPF_K
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
CLONE_NEWUSER = 0x10000000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian low words)
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0 = 0, 4, 16

X32_SYSCALL_BIT = 0x40000000

# platform.machine() -> (audit arch, unshare, clone, clone3, memfd_create system call numbers)
ARCHES: dict[str, tuple[int, int, int, int, int]] = {
    "x86_64": (0xC000003E, 272, 56, 435, 319),
    "aarch64": (0xC00000B7, 97, 220, 435, 279),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def no_user_namespaces_filter(machine: str | None = None) -> bytes | None:
    """The filter program (struct sock_filter[] as bytes, the layout the kernel and bubblewrap expect) for this
    machine's architecture (`machine`: platform.machine()'s name), or None for one it has no numbers for.

    System calls of another ABI than the machine's own (32-bit calls on x86-64, x32 calls) are refused with ENOSYS:
    their numbers differ, so the checks below would not see them."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        return None
    arch, unshare, clone, clone3, memfd_create = ARCHES[machine]
    enosys = _op(BPF_RET_K, SECCOMP_RET_ERRNO | errno.ENOSYS)
    allow = _op(BPF_RET_K, SECCOMP_RET_ALLOW)
    program = [
        _op(BPF_LD_W_ABS, OFFSET_ARCH),  # 0
        _op(BPF_JEQ_K, arch, 1, 0),  # 1: the machine's own ABI -> 3
        enosys,  # 2
        _op(BPF_LD_W_ABS, OFFSET_NR),  # 3
        _op(BPF_JSET_K, X32_SYSCALL_BIT, 0, 1) if machine == "x86_64" else _op(BPF_JEQ_K, 0xFFFFFFFF, 0, 1),  # 4
        enosys,  # 5
        _op(BPF_JEQ_K, clone3, 0, 1),  # 6
        enosys,  # 7
        _op(BPF_JEQ_K, memfd_create, 0, 1),  # 8
        _op(BPF_RET_K, SECCOMP_RET_ERRNO | errno.EPERM),  # 9
        _op(BPF_JEQ_K, unshare, 1, 0),  # 10 -> 12
        _op(BPF_JEQ_K, clone, 0, 3),  # 11 -> 12, else 15
        _op(BPF_LD_W_ABS, OFFSET_ARG0),  # 12
        _op(BPF_JSET_K, CLONE_NEWUSER, 0, 1),  # 13 -> 14, else 15
        _op(BPF_RET_K, SECCOMP_RET_ERRNO | errno.EPERM),  # 14
        allow,  # 15
    ]
    return b"".join(program)
