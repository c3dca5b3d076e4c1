"""What a running process tree holds, read from /proc and the cgroup mounts (no psutil): the
sampling side of `soak.py`.

A run's processes are the trainer and every descendant (by parent pid), sandbox launchers,
namespace inits and programs included; each is known by (pid, start time) so a reused pid is
never mistaken for one of the run's. Sandbox cgroups are the directories named
`rlvr.rewards.sandbox.budget.PREFIX` + the creating process's pid, in any cgroup hierarchy;
those whose pid is one of the run's are the run's.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

from rlvr.rewards.sandbox.budget import PREFIX

CGROUP_ROOT = "/sys/fs/cgroup"
SHM = "/dev/shm"


def _stat(pid: int) -> tuple[int, int, int, str] | None:
    """(parent pid, session id, start time in clock ticks, state) of `pid`; None once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[3]), int(fields[19]), fields[0]


def processes() -> dict[int, tuple[int, int, int, str]]:
    """Every process now: pid -> (parent pid, session id, start time, state)."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(int(d))) is not None:
            out[int(d)] = st
    return out


def tree(root: int, table: dict[int, tuple[int, int, int, str]]) -> list[int]:
    """`root` and its descendants in `table`, zombies left out (they hold nothing)."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], [root] if root in table else []
    while todo:
        pid = todo.pop()
        if table[pid][3] != "Z":
            out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _status(pid: int) -> dict[str, int]:
    """VmRSS (KiB) and Threads of `pid` ({} once gone)."""
    out = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                out[key] = int(value.split()[0])
    return out


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def shm_names() -> set[str]:
    try:
        return set(os.listdir(SHM))
    except OSError:
        return set()


def _holds(pid: int, names: set[str]) -> set[str]:
    """Which of the /dev/shm `names` `pid` has open or mapped."""
    paths = {os.path.join(SHM, n): n for n in names}
    held = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                held.add(paths.get(os.readlink(f"/proc/{pid}/fd/{fd}")))
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as f:
        for line in f:
            held.add(paths.get(line.rstrip("\n").split(maxsplit=5)[-1]))
    return held & set(names)


def sandbox_cgroups() -> list[str]:
    """Every sandbox cgroup directory in every hierarchy under CGROUP_ROOT."""
    out = []
    for here, dirs, _ in os.walk(CGROUP_ROOT):
        ours = [d for d in dirs if d.startswith(PREFIX)]
        out += [os.path.join(here, d) for d in ours]
        dirs[:] = [d for d in dirs if d not in ours]  # nothing of ours nests inside them
    return out


def cgroup_pid(path: str) -> int | None:
    """The pid of the process that made a sandbox cgroup (`PREFIX<pid>-<tag>`)."""
    head = os.path.basename(path)[len(PREFIX) :].split("-")[0]
    return int(head) if head.isdigit() else None


@dataclass
class Probe:
    """Samples one run: `root` is the trainer's pid, `shm_before` /dev/shm before it started.
    `seen` collects every (pid, start time) of the run and `shm` every /dev/shm entry it held,
    for the check after it exits."""

    root: int
    shm_before: set[str]
    seen: set[tuple[int, int]] = field(default_factory=set)
    shm: set[str] = field(default_factory=set)

    def sample(self) -> dict[str, float]:
        """The run's resources now: resident memory of the tree and of the trainer alone
        (MiB), open descriptors, threads, processes below the trainer, /dev/shm entries made
        since it started, its sandbox cgroups."""
        table = processes()
        pids = tree(self.root, table)
        self.seen.update((p, table[p][2]) for p in pids)
        status = {p: _status(p) for p in pids}
        mine = {p for p, _ in self.seen}
        new = shm_names() - self.shm_before
        if unclaimed := new - self.shm:
            for p in pids:
                self.shm |= _holds(p, unclaimed)
        return {
            "rss_mib": round(sum(s.get("VmRSS", 0) for s in status.values()) / 1024, 1),
            "trainer_rss_mib": round(status.get(self.root, {}).get("VmRSS", 0) / 1024, 1),
            "fds": sum(_fds(p) for p in pids),
            "threads": sum(s.get("Threads", 0) for s in status.values()),
            "children": max(0, len(pids) - 1),
            "shm_files": len(new & self.shm),
            "cgroups": sum(cgroup_pid(c) in mine for c in sandbox_cgroups()),
        }

    def left_behind(self, session: int) -> dict[str, list]:
        """What the run left once its trainer exited: processes of the run (seen in a sample,
        or in its session `session`) still running, /dev/shm entries made since it started,
        its sandbox cgroups; `shm_others`: entries made since then that no process of the
        run was seen holding (another process's, or one the run held only between samples)."""
        table = processes()
        alive = [
            p for p, (_, sid, start, state) in table.items()
            if state != "Z" and ((p, start) in self.seen or sid == session)
        ]  # fmt: skip
        mine = {p for p, _ in self.seen}
        new = shm_names() - self.shm_before
        return {
            "processes": sorted(alive),
            "shm_files": sorted(new & self.shm),
            "shm_others": sorted(new - self.shm),
            "cgroups": sorted(c for c in sandbox_cgroups() if cgroup_pid(c) in mine),
        }
