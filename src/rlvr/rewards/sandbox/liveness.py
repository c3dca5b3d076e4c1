"""Waiting on another process without hanging on it (docs/guides/resume.md#stopped-helpers).

Here, in the sandbox package, because that package imports only the standard library and runs
as a copy of its directory (its zygote is one of the helpers); the rest of rlvr imports it from
here.

Every wait of the trainer on a helper process of its own (an isolated
reward's worker, the sandbox's zygote, the math-verify worker while it starts) goes through
`wait_until`, which looks at the helper every `POLL_S` while it waits and ends the wait with
one line naming the helper (its role and pid), what happened to it and what it was doing when

  - the helper is gone: it exited (its exit code or signal, where it is our child) or is a
    zombie (exited, not yet reaped), while the wait's pipe or socket stays open (a child of
    the helper can hold its end);
  - the helper is stopped (SIGSTOP, or SIGTSTP from Ctrl-Z: state T in /proc/PID/stat) at
    `STOPPED_LOOKS` looks in a row, that is for 2 s to 3 s: nothing in the run will continue
    it, so the wait would never end.

A helper held by a debugger or a profiler (state t, ptrace) is waited for: someone is looking at
it, and py-spy pauses a process it samples many times a second. A helper that runs, however
slowly, is waited for as long as it runs (a generation on the CPU can take minutes); a
wall-clock limit applies only where the caller has one configured (`timeout_s`). A look reads
one /proc file (22 us on the 2-core machine), and `ready` returns the moment the answer
arrives, so the looks add no latency to a wait. Linux reads /proc; elsewhere only a helper that is gone
is seen (signal 0), never a stopped one.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

POLL_S = 1.0  # seconds between two looks at the helper while a wait lasts
STOPPED_LOOKS = 3  # a helper seen stopped at this many looks in a row is taken as lost
_PROC = os.path.exists("/proc/self/stat")
_STATES = {"T": "stopped", "t": "traced", "Z": "zombie", "X": "gone"}
_during: contextvars.ContextVar[str] = contextvars.ContextVar("rlvr_during", default="")


class ProcessLost(RuntimeError):
    """A helper process waited on is gone or stopped; the message names it."""


def state(pid: int) -> str:
    """The process's state: "running" (sleeping and disk waits included), "stopped" (by a
    signal), "traced" (stopped by a debugger), "zombie" or "gone"."""
    if not _PROC:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "gone"
        except PermissionError:
            pass
        return "running"
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            code = f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):  # no such process (the comm field may hold ')': rsplit)
        return "gone"
    return _STATES.get(code, "running")


@contextlib.contextmanager
def during(label: str) -> Iterator[None]:
    """Name what this thread works on ("step 3's batch") in any helper's error raised inside."""
    token = _during.set(label)
    try:
        yield
    finally:
        _during.reset(token)


@dataclass(frozen=True)
class Helper:
    """A process waited on: its `role` in words ("the sandbox's zygote"), `pid`, its `proc` where
    it is our child (its exit status is then named), what the error adds as `advice`, and the
    `error` type the caller's callers expect."""

    role: str
    pid: int
    proc: subprocess.Popen | None = None
    advice: str = ""
    error: type[Exception] = ProcessLost

    def ended(self) -> str | None:
        """How the helper ended ("was killed by signal 9"), or None while it exists."""
        code = self.proc.poll() if self.proc is not None else None
        if code is not None:
            return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        now = state(self.pid)
        return {"zombie": "has exited", "gone": "is gone"}.get(now)

    def lost(self, how: str, doing: str) -> Exception:
        """The error that names the helper, `how` it was found, and what it was `doing`."""
        label = _during.get()
        text = f"{self.role} (pid {self.pid}) {how} while {doing}"
        text += f", for {label}" if label else ""
        return self.error(text + (f"; {self.advice}" if self.advice else ""))


def wait_until(
    ready: Callable[[float], bool], helper: Helper, doing: str, timeout_s: float | None = None
) -> bool:
    """Ask `ready(seconds)` (wait at most that long for the answer: `Connection.poll`, a
    select) until it says True (returns True) or `timeout_s` passes (returns False; None: no
    limit). Between two asks the helper is looked at (the module docstring): gone, or stopped
    at `STOPPED_LOOKS` looks in a row, raises `helper.error` naming it and what it was `doing`.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    stopped = 0
    while True:
        left = POLL_S if deadline is None else max(0.0, deadline - time.monotonic())
        if ready(min(POLL_S, left)):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        how = helper.ended()
        stopped = stopped + 1 if how is None and state(helper.pid) == "stopped" else 0
        if stopped >= STOPPED_LOOKS:
            seen = f"seen stopped at {stopped} looks {POLL_S:g} s apart"
            how = f"is stopped (SIGSTOP or Ctrl-Z: {seen})"
        if how is not None:
            if ready(0):  # its answer arrived before it ended
                return True
            raise helper.lost(how, doing)
