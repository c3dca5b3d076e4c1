"""What a sandbox run is given and gives back: its limits, its result, its errors."""

from __future__ import annotations

from dataclasses import dataclass

SETUP_S = 30.0  # building the jail on a loaded machine; not part of the program's time
_GRACE_S = 1.0  # the trainer's own deadline, after the jail's
ISOLATIONS = ("auto", "namespaces", "none")


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program it runs)."""


class SandboxUnavailable(SandboxError):
    """Isolation was required but Linux namespaces do not work here."""


@dataclass(frozen=True)
class SandboxResult:
    """returncode: the program's exit status (negative: killed by that signal); stdout/stderr:
    decoded, at most `max_output_bytes` each; timed_out: killed by the wall-clock limit;
    isolation: "namespaces" or "none"; budget: how the whole sandbox's memory was bounded
    ("cgroup v2", "cgroup v1" or "per-process", `budget.py`); memory_peak_bytes: the most its
    processes held together (cgroups only, else None); oom_kills: how many of them the kernel
    killed for the budget; uid: the host uid the program ran as where it was a fresh one (as
    root), else None (what a caller checks for processes left behind)."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    isolation: str
    budget: str = "per-process"
    memory_peak_bytes: int | None = None
    oom_kills: int = 0
    uid: int | None = None


@dataclass(frozen=True)
class Limits:
    """timeout_s: wall clock; cpu_s: RLIMIT_CPU; memory_mb: RLIMIT_AS; max_procs: RLIMIT_NPROC;
    max_open_files: RLIMIT_NOFILE; max_output_bytes: RLIMIT_FSIZE (files and stdout/stderr);
    tmp_mb: size of the writable /tmp. cgroup: bound the whole sandbox (every process and
    /tmp together) to memory_mb + tmp_mb and max_procs tasks with a cgroup where the kernel
    allows one (`budget.py`); False keeps the per-process limits only."""

    timeout_s: float = 5.0
    cpu_s: int | None = None  # default: ceil(timeout_s)
    memory_mb: int = 512
    max_procs: int = 32
    max_open_files: int = 64
    max_output_bytes: int = 1 << 20
    tmp_mb: int = 16
    cgroup: bool = True
