"""`die_with(pid)`: SIGKILL the calling process when process `pid` (the trainer) exits.

For helper processes that run code which may hold the GIL in C for minutes (sympy, a user's
reward), where neither a thread nor EOF on a pipe would notice the trainer's death: a forked
watchdog waits on the trainer's pidfd and kills its parent; a parent-death signal ends the
watchdog with that parent. Stdlib only (loaded by path from `_verify_worker`).
"""

import ctypes
import os
import select
import signal
import time

PR_SET_PDEATHSIG = 1


def die_with(trainer: int) -> None:
    """Fork the watchdog and return (in the caller)."""
    worker = os.getpid()
    if os.fork():
        return
    os.closerange(0, 3)  # the worker's pipes stay the worker's alone
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != worker:
        os._exit(0)
    try:
        select.select([os.pidfd_open(trainer)], [], [])
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3) or already gone: poll
        while os.getppid() == worker and _alive(trainer):
            time.sleep(0.2)
    os.kill(worker, signal.SIGKILL)
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
