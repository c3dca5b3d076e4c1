"""Killing what a program left running: by pid, by process group, by uid."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time


def _alive(pid: int) -> bool:
    """Running (zombies are dead: their parent reaps them, or nobody does, harmlessly)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill_until_dead(pids: list[int], uid: int | None = None, wait_s: float = 5.0) -> None:
    """SIGKILL `pids` (and, given `uid`, every new process of that uid) until none runs."""
    deadline = time.monotonic() + wait_s
    if uid is None:
        pids = [p for p in pids if _alive(p)]  # most are gone already: no kill, no sleep
    while pids and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if uid is not None or exited_within(pids[0], 0.05) is None:
            time.sleep(0.002)  # woken by the first one's pidfd the moment it dies, else 2 ms
        pids = _pids_of(uid) if uid is not None else [p for p in pids if _alive(p)]


def _kill_group(pgid: int, wait_s: float = 5.0) -> None:
    """SIGKILL a process group until no running member is left (a fork bomb keeps adding
    members while the kernel delivers the signals)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        members = [int(d) for d in os.listdir("/proc") if d.isdigit() and _pgid(int(d)) == pgid]
        if not any(_alive(p) for p in members):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        time.sleep(0.005)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _pids_of(uid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{d}").st_uid == uid and _alive(int(d)):
                    out.append(int(d))
    return out


def exited_within(pid: int, timeout_s: float | None) -> bool | None:
    """Whether `pid` exits (or has exited) within `timeout_s` seconds (None: no limit), woken by
    its pidfd the moment it does; None where no pidfd can be had (kernels before 5.3)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # gone, and reaped
        return True
    except (AttributeError, OSError):
        return None
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)
