"""The trainer's scratch directory for its sandboxes: each sandbox's files (its program's, its
stdout and stderr) under a random prefix of their own, and `root`, the empty directory every
jail mounts its own tmpfs root on inside its own mount namespace (so no other process sees
that mount).

One directory per process, not one per sandbox: on the 2-core machine's disk (ext4 mounted
with `discard`) removing a directory waits 3.6 ms, so a directory per sandbox, with the jail's
mount point and a working directory in it, takes 6-10 ms of every program's wall time to
remove, where unlinking a sandbox's three files takes 0.05 ms. The directory is removed on a
timer thread once no sandbox of the process has been open for `IDLE_S` (so a process that
ends without its exit handlers, a torchrun rank say, leaves nothing behind once it has been
idle that long), and at exit. 0711: a jail's init (another uid, as root) must reach `root`;
the files in it stay 0600.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading

IDLE_S = 2.0
_lock = threading.Lock()
_dirs: dict[int, list] = {}  # by pid (a forked child makes its own): [directory, open, timer]


def acquire() -> str:
    """The directory, made when needed, counted open until `release`."""
    pid = os.getpid()
    with _lock:
        entry = _dirs.get(pid)
        if entry is None or not os.path.isdir(os.path.join(entry[0], "root")):  # a cleaner took it
            d = tempfile.mkdtemp(prefix=f"rlvr-sandbox-{pid}-")
            os.chmod(d, 0o711)
            os.mkdir(os.path.join(d, "root"))
            entry = _dirs[pid] = [d, 0 if entry is None else entry[1], None]
        if entry[2] is not None:
            entry[2].cancel()
            entry[2] = None
        entry[1] += 1
        return entry[0]


def release() -> None:
    """One sandbox fewer open; the directory goes after IDLE_S with none open."""
    with _lock:
        entry = _dirs.get(os.getpid())
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            entry[2] = threading.Timer(IDLE_S, _remove_if_idle, (entry,))
            entry[2].daemon = True
            entry[2].start()


def _remove_if_idle(entry: list) -> None:
    with _lock:
        if _dirs.get(os.getpid()) is not entry or entry[1] != 0:
            return
        del _dirs[os.getpid()]
    shutil.rmtree(entry[0], ignore_errors=True)


@atexit.register
def _at_exit() -> None:
    entry = _dirs.get(os.getpid())  # a forked child that inherited the handler: its own
    if entry is not None:
        shutil.rmtree(entry[0], ignore_errors=True)
