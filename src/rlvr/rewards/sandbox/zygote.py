"""The trainer's side of the zygote (`jail_zygote.py`): one per process, started on first
use, asked for a launcher per sandbox in namespaces.

Measured on the 2-core development machine (`bench/code_reward.py`'s breakdown): a launcher
started as its own interpreter costs about 31 ms of CPU before it does anything (the
interpreter and its imports) and the program's interpreter another 13; forked from the
zygote, neither is paid.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .liveness import Helper, wait_until
from .reap import _alive, exited_within
from .spec import SandboxError

_SCRIPT = Path(__file__).with_name("jail_zygote.py")
_lock = threading.Lock()
_zygote: Zygote | None = None


class Zygote:
    """A running zygote and the socket to it; `spawn` and `reap` may come from any thread."""

    def __init__(self) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.owner = os.getpid()
        self.lock = threading.Lock()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", str(_SCRIPT), str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={"PATH": "/usr/bin:/bin"},
                start_new_session=True,
                pass_fds=(theirs.fileno(),),
                cwd="/",
            )
        finally:
            theirs.close()
        self.helper = Helper("the sandbox's zygote", self.proc.pid, self.proc, error=SandboxError)

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def _answered(self, seconds: float) -> bool:
        return bool(select.select([self.sock], [], [], seconds)[0])

    def spawn(self, cfg: dict, fds: list[int]) -> int:
        """Fork a launcher for `cfg` with `fds` (stdin, stdout, stderr, status) as its own;
        its pid."""
        with self.lock:
            try:
                self.sock.sendmsg(
                    [json.dumps(cfg).encode()],
                    [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))],
                )
                wait_until(self._answered, self.helper, "forking a sandbox's launcher")
                reply = self.sock.recv(4096).decode()
            except OSError as e:
                raise SandboxError(f"sandbox: the zygote is gone ({e})") from None
            except SandboxError:  # stopped or gone: the next sandbox starts a new zygote
                self.proc.kill()
                self.proc.wait()
                raise
        if not reply.startswith("pid "):
            raise SandboxError(f"sandbox setup failed: zygote: {reply or 'no reply'}")
        return int(reply[4:])

    def reap(self, pid: int) -> None:
        # OSError: the zygote is gone, and its children with it
        with self.lock, contextlib.suppress(OSError):
            self.sock.send(f"reap {pid}".encode())


def zygote() -> Zygote:
    """This process's zygote, started (again, after a fork or its death) when needed."""
    global _zygote
    with _lock:
        if _zygote is None or not _zygote.alive():
            _zygote = Zygote()
        return _zygote


class Launcher:
    """A launcher the zygote forked, with what `SandboxProcess` uses of a `Popen`: `pid`,
    `wait` (until it exits; then the zygote reaps it, and its pid is never used again) and
    `signal_group`."""

    def __init__(self, owner: Zygote, pid: int):
        self.owner, self.pid, self.reaped = owner, pid, False

    def wait(self, timeout: float | None = None) -> None:
        if self.reaped:
            return
        exited = exited_within(self.pid, timeout)
        if exited is None:  # no pidfd: look every 5 ms
            deadline = None if timeout is None else time.monotonic() + timeout
            while _alive(self.pid) and (deadline is None or time.monotonic() < deadline):
                time.sleep(0.005)
            exited = not _alive(self.pid)
        if not exited:
            raise subprocess.TimeoutExpired("sandbox launcher", timeout)
        self.owner.reap(self.pid)
        self.reaped = True

    def signal_group(self, sig: int) -> None:
        if not self.reaped:
            os.killpg(self.pid, sig)
