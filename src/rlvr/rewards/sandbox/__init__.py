"""Run untrusted Python in a sandbox: `run_python(source, stdin=...) -> SandboxResult`, or
`SandboxProcess` for a program the caller talks to through pipes.

Isolation "namespaces" (the same for root and any other user; `jail_init.py` lists the
steps) guarantees:
  - no network: a fresh network namespace whose loopback is down, so even 127.0.0.1 is
    unreachable;
  - a private filesystem: the root is a tmpfs that holds only the Python installation, /usr
    and /lib* (read-only, nosuid) and /dev/{null,zero,urandom}; the project, /home, /root,
    /etc, /proc and /work do not exist there, and the host's root is detached, not hidden.
    The only writable place is the working directory /tmp, a tmpfs of `tmp_mb`;
  - its own pid namespace: the trainer, its environment and every other process are
    invisible and unreachable by signal; when the program exits, runs past `timeout_s`
    (sleeping or not), or the trainer dies (even by SIGKILL), the namespace's init exits and
    the kernel kills every process left in it, setsid and double-forked ones included;
  - no privileges: uid 1000 in its own user namespace (as root, mapped to a fresh uid that
    owns nothing; otherwise to the caller's uid), no capabilities, no nested user
    namespaces, PR_SET_NO_NEW_PRIVS;
  - limits: CPU seconds, address space, open files, processes (RLIMIT_NPROC counts the
    namespace's own processes on Linux >= 5.14), file size (which also caps stdout and
    stderr: they go to files, and a program that writes more gets SIGXFSZ);
  - an empty environment, `python -I -S -B` (no site-packages, no user site, no .pyc);
  - a process of its own: each sandbox's launcher is forked from a zygote (`jail_zygote.py`),
    an interpreter that imported the launcher's code once and never runs a program; the
    launcher builds a fresh jail and the program runs in a new process inside it, so no
    process ever runs two programs and nothing one program leaves reaches another;
  - a seccomp filter refusing (EPERM) the keyring syscalls (add_key, request_key, keyctl),
    io_uring (io_uring_setup, io_uring_enter, io_uring_register), bpf and perf_event_open,
    and every syscall of another ABI (x32, i386's `int 0x80`).
Limits of the guarantee: it is not a VM, and its seccomp filter refuses only those syscalls:
it shares the kernel, it can read the system's Python standard library and /usr, and
a kernel bug could break out. Memory is one budget for the whole sandbox where a cgroup can be
made (`budget.py`), else per process (N processes may hold N times `memory_mb`, within the
bound `budget.per_process_bound` states); CPU time is per process.

Infrastructure failures (namespaces refused, a mount failing, the interpreter missing) raise
`SandboxError`. The jail reports its state on a status pipe that only its own code holds,
closed before the program starts, so nothing the program prints, writes or exits with can
pass for a failed jail: once the jail reported "ready", the outcome is the program's.

Isolation "auto" (the default) is "namespaces" where they work and otherwise refuses to run
anything (`SandboxUnavailable`). "none" is the explicit opt-out: limits, an empty
environment, a fresh directory and a process group only; the program runs as the caller,
can read its files and /proc and reach the network, and its setsid children can outlive it.

The package imports only the standard library, so a copy of its directory runs on its own: the
unprivileged tests load one as a user who cannot read the installed package. Its modules:
`spec` (limits, result, errors), `jail_config` (what the jail binds, maps and limits),
`jail_init.py` (the launcher that builds the jail) and `jail_lockdown.py` (its last steps:
capabilities, limits, keyring, seccomp), `jail_zygote.py` and `zygote` (the zygote the
launchers are forked from, and its trainer side), `budget` (the whole sandbox's cgroup),
`process` (`SandboxProcess`, gated or not), `scratch` (the one directory a process's
sandboxes keep their files in), `reap` (killing what is left), `liveness`
(waiting on a helper process: one that is gone or stays stopped is an error naming it), `run`
(`run_python`, `PythonRun`, which isolation works here), `pipeline` (`run_pipelined`: jobs on
a few workers, each building its next job's jails while one runs).
"""

from __future__ import annotations

from .jail_config import _fresh_id
from .pipeline import run_pipelined
from .process import SandboxProcess
from .run import PythonRun, available_isolation, resolve_isolation, run_python
from .spec import ISOLATIONS, SETUP_S, Limits, SandboxError, SandboxResult, SandboxUnavailable

__all__ = [
    "ISOLATIONS",
    "SETUP_S",
    "Limits",
    "PythonRun",
    "SandboxError",
    "SandboxProcess",
    "SandboxResult",
    "SandboxUnavailable",
    "_fresh_id",
    "available_isolation",
    "resolve_isolation",
    "run_pipelined",
    "run_python",
]
