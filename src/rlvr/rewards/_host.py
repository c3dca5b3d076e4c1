"""What the sandbox asks of the host: the kernel's RLIMIT_NPROC semantics, this process's
uid and gid maps (to pick a fresh id for the program), and the process table (to count a
uid's processes and to SIGKILL a group or a uid's processes until none is left running).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time


def nproc_is_per_namespace() -> bool:
    """RLIMIT_NPROC counts per user namespace since Linux 5.14."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


def user_process_count() -> int:
    uid, n = os.getuid(), 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                n += os.stat(f"/proc/{d}").st_uid == uid
    return n


def id_ranges(path: str) -> list[tuple[int, int]]:
    """[first, end) ranges of the ids this process's user namespace maps."""
    try:
        with open(path) as f:
            rows = [line.split() for line in f if line.strip()]
        return [(int(r[0]), int(r[0]) + int(r[2])) for r in rows]
    except (OSError, ValueError, IndexError):
        return []


def fresh_id(low: int = 1_000_000) -> int | None:
    """A random id >= `low`, mapped here as both a uid and a gid, for the program to run as
    (as root: one that owns no file and no process). None where no such id exists (root of
    a container whose namespace maps only a few ids): the program then runs as our uid."""
    uids, gids = id_ranges("/proc/self/uid_map"), id_ranges("/proc/self/gid_map")
    spans = []
    for a, b in uids:
        for c, d in gids:
            lo, hi = max(a, c, low), min(b, d, 1 << 31)
            if hi - lo > 1000:
                spans.append((lo, hi))
    if not spans:
        return None
    lo, hi = spans[secrets.randbelow(len(spans))]
    return lo + secrets.randbelow(hi - lo)


def alive(pid: int) -> bool:
    """Running (zombies are dead: their parent reaps them, or nobody does, harmlessly)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_until_dead(pids: list[int], uid: int | None = None, wait_s: float = 5.0) -> None:
    """SIGKILL `pids` (and, given `uid`, every new process of that uid) until none runs."""
    deadline = time.monotonic() + wait_s
    while pids and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)
        pids = pids_of(uid) if uid is not None else [p for p in pids if alive(p)]


def kill_group(pgid: int, wait_s: float = 5.0) -> None:
    """SIGKILL a process group until no running member is left (a fork bomb keeps adding
    members while the kernel delivers the signals)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        members = [int(d) for d in os.listdir("/proc") if d.isdigit() and group_of(int(d)) == pgid]
        if not any(alive(p) for p in members):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        time.sleep(0.005)


def group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def pids_of(uid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{d}").st_uid == uid and alive(int(d)):
                    out.append(int(d))
    return out
