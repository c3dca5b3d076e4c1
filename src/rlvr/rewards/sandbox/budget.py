"""One memory and process budget for a whole sandbox: a cgroup, where the kernel lets us make one.

RLIMIT_AS and RLIMIT_NPROC bound each process, not the sandbox: six children of 400 MB under
`memory_mb=512` hold 2.4 GB between them, and memfd or tmpfs pages sit outside RLIMIT_AS. A
cgroup bounds them together: the jail's launcher joins it before it forks anything, so every
process of the program is in it, and the kernel's OOM killer acts inside it when the sum of
their pages (anonymous, page cache, tmpfs and memfd alike) would pass the limit.

Where (`create`):
  - cgroup v2: a child of this process's own cgroup, when that cgroup delegates `memory` to its
    children (`cgroup.subtree_control`) and we may create one (root, or a delegated subtree);
  - cgroup v1: a child of this process's cgroup in the `memory` hierarchy (and in `pids`
    when mounted), when we may create one (root, as here);
  - otherwise none: the budget is per process, and the whole sandbox is bounded by
    `per_process_bound` (processes x (address space + memfd files) + the /tmp tmpfs), which the
    limits enforce one process at a time.
Limits in the cgroup: memory `memory_mb + tmp_mb` (the program's pages and its /tmp), no swap
beyond it, and `max_procs` + 3 tasks (the launcher, its helper and the namespace's init).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field

from .spec import Limits

EXTRA_TASKS = 3  # the launcher, its id-map helper and the namespace's init
PREFIX = "rlvr-sandbox-"  # + the trainer's pid + a random tag


@dataclass
class Budget:
    """kind: "cgroup v2", "cgroup v1" or "per-process"; dirs: the cgroups the launcher joins
    (its `cgroup.procs`); memory: the one that holds the memory limit (None per process)."""

    kind: str = "per-process"
    dirs: list[str] = field(default_factory=list)
    memory: str | None = None

    def peak_bytes(self) -> int | None:
        """The most memory the sandbox's processes held together (None per process)."""
        name = "memory.peak" if self.kind == "cgroup v2" else "memory.max_usage_in_bytes"
        return _read_int(self.memory, name) if self.memory else None

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed for the budget."""
        if not self.memory:
            return 0
        name = "memory.events" if self.kind == "cgroup v2" else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError), open(os.path.join(self.memory, name)) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def kill_members(self) -> None:
        """SIGKILL whatever is still in the cgroups."""
        for d in self.dirs:
            for pid in _members(d):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def remove(self, wait_s: float = 5.0) -> None:
        """Kill what is left and remove the cgroups (a cgroup goes once its tasks are reaped)."""
        deadline = time.monotonic() + wait_s
        for d in reversed(self.dirs):
            while os.path.isdir(d):
                self.kill_members()
                try:
                    os.rmdir(d)
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.005)
        self.dirs, self.memory = [], None


def per_process_bound(lim: Limits) -> int:
    """Bytes the whole sandbox may hold without a cgroup: every process its address space and
    as many memfd files as it may open (each at most the file-size limit), plus the /tmp
    tmpfs. RLIMIT_NPROC allows `max_procs` program processes and the namespace's init."""
    per_process = (lim.memory_mb << 20) + lim.max_open_files * lim.max_output_bytes
    return (lim.max_procs + 1) * per_process + (lim.tmp_mb << 20)


def cgroup_bytes(lim: Limits) -> int:
    """The memory limit of the sandbox's cgroup."""
    return (lim.memory_mb + lim.tmp_mb) << 20


def create(lim: Limits) -> Budget:
    """The sandbox's budget: a cgroup v2 or v1 where one can be made (module docstring), else
    the per-process one. `lim.cgroup=False` asks for the per-process one."""
    if not lim.cgroup:
        return Budget()
    mounts, own = _mounts(), _own_cgroups()
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    for make in (_make_v2, _make_v1):
        budget = Budget()
        try:
            if make(budget, mounts, own, name, lim) and _joinable(budget):
                return budget
        except OSError:
            pass
        budget.remove(wait_s=0.5)
    return Budget()


_JOINABLE: dict[str, bool] = {}  # by parent directories and kind: probed once a process


def _joinable(budget: Budget) -> bool:
    """Whether a process of ours may join the budget's cgroups (cgroup v2 refuses a member in a
    cgroup whose parent has members and controllers; delegation rules differ): a shell joins
    each and exits, as the jail's launcher will. Probed once per parent directory."""
    key = budget.kind + ":" + ",".join(os.path.dirname(d) for d in budget.dirs)
    if key not in _JOINABLE:
        _JOINABLE[key] = _probe_join(budget.dirs)
    return _JOINABLE[key]


def _probe_join(dirs: list[str]) -> bool:
    for d in dirs:
        probe = subprocess.run(
            ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs"', d],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
        )  # fmt: skip
        if probe.returncode != 0:
            return False
    return True


def kind_here(lim: Limits) -> str:
    """The budget a sandbox with these limits gets on this machine (a probe cgroup is made and
    removed)."""
    budget = create(lim)
    budget.remove()
    return budget.kind


def sandbox_bytes(lim: Limits) -> int:
    """What one sandbox may hold here: its cgroup's limit, or the per-process bound."""
    return cgroup_bytes(lim) if kind_here(lim) != "per-process" else per_process_bound(lim)


def sweep(base: str) -> None:
    """Remove the empty sandbox cgroups under `base` whose trainer is gone (one killed by
    SIGKILL never removes its own; a cgroup with a task left in it is not removed)."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(base):
            parts = entry.split("-")
            ours = entry.startswith(PREFIX) and len(parts) == 4 and parts[2].isdigit()
            if ours and not _alive(int(parts[2])):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(base, entry))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_v2(budget: Budget, mounts, own, name: str, lim: Limits) -> bool:
    if "cgroup2" not in mounts or "" not in own:
        return False
    base = os.path.join(mounts["cgroup2"], own[""].lstrip("/"))
    with open(os.path.join(base, "cgroup.subtree_control")) as f:
        delegated = f.read().split()
    if "memory" not in delegated or not os.access(base, os.W_OK):
        return False
    sweep(base)
    d = os.path.join(base, name)
    os.mkdir(d)
    budget.kind, budget.dirs, budget.memory = "cgroup v2", [d], d
    _write(d, "memory.max", cgroup_bytes(lim))
    if os.path.exists(os.path.join(d, "memory.swap.max")):
        _write(d, "memory.swap.max", 0)
    if "pids" in delegated:
        _write(d, "pids.max", lim.max_procs + EXTRA_TASKS)
    return True


def _make_v1(budget: Budget, mounts, own, name: str, lim: Limits) -> bool:
    if "memory" not in mounts or "memory" not in own:
        return False
    base = os.path.join(mounts["memory"], own["memory"].lstrip("/"))
    if not os.access(base, os.W_OK):
        return False
    sweep(base)
    d = os.path.join(base, name)
    os.mkdir(d)
    budget.kind, budget.dirs, budget.memory = "cgroup v1", [d], d
    _write(d, "memory.limit_in_bytes", cgroup_bytes(lim))
    if os.path.exists(os.path.join(d, "memory.memsw.limit_in_bytes")):
        _write(d, "memory.memsw.limit_in_bytes", cgroup_bytes(lim))
    if "pids" in mounts and "pids" in own:
        pids_base = os.path.join(mounts["pids"], own["pids"].lstrip("/"))
        pids = os.path.join(pids_base, name)
        with contextlib.suppress(OSError):
            sweep(pids_base)
            os.mkdir(pids)
            budget.dirs.append(pids)
            _write(pids, "pids.max", lim.max_procs + EXTRA_TASKS)
    return True


# the mount table's cgroup entries and this process's cgroups, read once (0.1 ms a sandbox)
@functools.cache
def _mounts() -> dict[str, str]:
    """Mount points: "cgroup2" for the unified hierarchy, a v1 controller's name for its."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            before, _, after = line.partition(" - ")
            fstype, _, options = [*after.split(), "", "", ""][:3]
            point = before.split()[4]
            if fstype == "cgroup2":
                out.setdefault("cgroup2", point)
            elif fstype == "cgroup":
                for opt in options.split(","):
                    if opt in ("memory", "pids"):
                        out.setdefault(opt, point)
    return out


@functools.cache
def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per hierarchy: "" for v2, the controller's name for v1."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    return out


def _write(d: str, name: str, value: int) -> None:
    with open(os.path.join(d, name), "w") as f:
        f.write(str(value))


def _read_int(d: str, name: str) -> int | None:
    try:
        with open(os.path.join(d, name)) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _members(d: str) -> list[int]:
    try:
        with open(os.path.join(d, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []
