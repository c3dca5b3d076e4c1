"""A killable math-verify worker process, shared by the threads of one Python process.

Why a process: math-verify's timeouts are SIGALRM-based (main thread only, and unable to
interrupt sympy's C big-integer arithmetic), and a thread cannot be killed. One worker is kept
warm; a call waits at most `timeout_s` for its answer, and a worker that misses the deadline
is killed and replaced at once (the replacement imports math-verify while the caller moves on).
Calls are serialised by a lock, so the wait for the lock is not part of a call's time limit.
The worker's start (importing sympy: seconds, more on a loaded machine) has no time limit: it
is waited for as long as the worker runs, and a worker that exits or stays stopped (SIGSTOP,
Ctrl-Z) meanwhile is an error naming it (`rlvr.rewards.sandbox.liveness`), as is one that
stays stopped through a call whose limit is longer than the 2 s to 3 s that takes to see.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path

from rlvr.rewards.sandbox.liveness import Helper, ProcessLost, wait_until

_WORKER = Path(__file__).with_name("_verify_worker.py")


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(_WORKER), str(os.getpid())],  # it dies with this pid
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            start_new_session=True,  # Ctrl-C in a terminal goes to the trainer, not here
        )
        self.ready = False
        self.helper = Helper("the math-verify worker", self.proc.pid, self.proc)

    def readline(self, doing: str, timeout_s: float | None) -> str | None:
        """The worker's next line; None past `timeout_s` (None: no limit) or when it exited;
        ProcessLost when it stays stopped (or exits holding its pipe open) meanwhile."""
        fd = self.proc.stdout.fileno()

        def readable(seconds: float) -> bool:
            return bool(select.select([fd], [], [], seconds)[0])

        if not wait_until(readable, self.helper, doing, timeout_s):
            return None
        return self.proc.stdout.readline() or None  # "" = the worker died

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()


_lock = threading.Lock()
_worker: _Worker | None = None
_pid = os.getpid()
timeouts = 0  # calls that ran past their limit, since import (a metric for the curious)


def _get() -> _Worker:
    global _worker, _pid
    if _worker is not None and _worker.proc.poll() is not None:  # killed from outside
        _worker.kill()
        _worker = None
    if _worker is None or _pid != os.getpid():  # after a fork the child starts its own
        _worker, _pid = _Worker(), os.getpid()
    if not _worker.ready:
        try:
            line = _worker.readline("starting (importing math-verify)", None)
        except ProcessLost:
            _worker.kill()
            _worker = None
            raise
        if line is None:
            _worker.kill()
            _worker = None
            raise RuntimeError("the math-verify worker did not start (is math-verify installed?)")
        _worker.ready = True
    return _worker


def warm_up() -> None:
    """Start the worker (or wait for its replacement) now, so no call pays for the import."""
    with _lock:
        _get()


def verify_in_worker(prediction: str, reference: str, *, timeout_s: float) -> bool:
    """math-verify's verdict on two bare answers; False on a timeout, crash or parse error."""
    global _worker, timeouts
    with _lock:
        worker = _get()
        try:
            worker.proc.stdin.write(json.dumps({"p": prediction, "r": reference}) + "\n")
            worker.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            line = None
        else:
            try:
                line = worker.readline("checking an answer", timeout_s)
            except ProcessLost:
                worker.kill()
                _worker = None  # the next call starts a new one
                raise
        if line is None:
            timeouts += 1
            worker.kill()
            _worker = _Worker()  # warm up the replacement in the background
            return False
        return bool(json.loads(line).get("ok", False))


@atexit.register
def _shutdown() -> None:
    if _worker is not None and _pid == os.getpid():
        _worker.kill()
