"""The jail's last steps before the program, for `jail_init.py` (standard library only):
drop every capability, set the resource limits and PR_SET_NO_NEW_PRIVS, join a keyring of
its own and refuse, with a seccomp filter, the keyring syscalls and the kernel interfaces a
program has no use for."""

import ctypes
import functools
import os
import platform
import resource

PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
KEYCTL_JOIN_SESSION_KEYRING = 1
# (audit arch, add_key, request_key, keyctl) per machine: the keyring syscalls refused
KEYRING_SYSCALLS = {
    "x86_64": (0xC000003E, 248, 249, 250),
    "aarch64": (0xC00000B7, 217, 218, 219),
}
# io_uring_setup, io_uring_enter, io_uring_register, bpf, perf_event_open per machine: large
# kernel surfaces (the source of many local privilege escalations) no program here needs
KERNEL_SURFACE_SYSCALLS = {
    "x86_64": (425, 426, 427, 321, 298),
    "aarch64": (425, 426, 427, 280, 241),
}
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4

libc = ctypes.CDLL(None, use_errno=True)
LIBC_CALLS = ("capset", "mount", "prctl", "syscall", "umount2", "unshare")


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]  # fmt: skip


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def prepare():
    """What every jail would otherwise work out again, done once by the zygote before it
    forks any launcher: libc's functions looked up, the machine's name read, the seccomp
    filter built. Each launcher and jail init then only uses them, writing to fewer of the
    pages it shares with the zygote (each such write copies a page)."""
    for name in LIBC_CALLS:
        getattr(libc, name)
    _seccomp_program()


def _call(name, *args):
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args!r}: {os.strerror(err)}")


def _drop_capabilities():
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # EINVAL past the last capability this kernel knows
    _call("prctl", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    _call("capset", header, (ctypes.c_uint32 * 6)())


def _restrict(lim):
    for name, value in lim.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    _call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _own_keyring():
    """A new anonymous session keyring: the one inherited from the trainer is no longer
    reachable as @s (and the keys the program could add die with the sandbox)."""
    numbers = KEYRING_SYSCALLS.get(platform.machine())
    failed = numbers is not None and libc.syscall(numbers[3], KEYCTL_JOIN_SESSION_KEYRING, None) < 0
    if failed and ctypes.get_errno() != 38:  # ENOSYS: a kernel without keyrings shares none
        raise OSError(ctypes.get_errno(), "keyctl(JOIN_SESSION_KEYRING) failed")


def _refuse_syscalls():
    """A seccomp filter: the keyring syscalls (add_key, request_key, keyctl: the user keyring
    @u is shared with every process of the same uid outside) and KERNEL_SURFACE_SYSCALLS
    fail with EPERM, and so does every syscall of another ABI (x32 on x86_64, and the i386
    ABI's `int 0x80`, which a program reaches through ctypes and machine code and whose
    numbers differ); everything else is allowed. On a machine not listed here, no filter."""
    built = _seccomp_program()
    if built is None:
        return
    failed = libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(built[1]), 0, 0) != 0
    if failed and ctypes.get_errno() != 22:  # EINVAL: a kernel without seccomp filters
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


@functools.cache
def _seccomp_program():
    """(the filter's instructions, the program pointing at them) for `_refuse_syscalls`, or
    None on a machine not listed."""
    machine = platform.machine()
    if machine not in KEYRING_SYSCALLS:
        return None
    arch, *calls = KEYRING_SYSCALLS[machine]
    calls += KERNEL_SURFACE_SYSCALLS[machine]
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, eperm = 0x7FFF0000, 0x00050000 | 1
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, eperm), (ld_abs, 0, 0, 0)]
    if arch == 0xC000003E:
        prog.append((jge, len(calls) + 1, 0, 0x40000000))
    for i, nr in enumerate(calls):
        prog.append((jeq, len(calls) - i, 0, nr))
    prog += [(ret, 0, 0, allow), (ret, 0, 0, eperm)]
    filters = (_Filter * len(prog))(*[_Filter(*f) for f in prog])
    return filters, _Program(len(prog), filters)
