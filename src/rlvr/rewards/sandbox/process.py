"""`SandboxProcess`: one program in the jail, launched, awaited and cleaned up."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import budget as budgets
from . import scratch
from .jail_config import _config
from .reap import _kill_group, _kill_until_dead, _pids_of, exited_within
from .spec import _GRACE_S, SETUP_S, Limits, SandboxError, SandboxResult
from .zygote import Launcher, zygote

_INIT = Path(__file__).with_name("jail_init.py")


class SandboxProcess:
    """A program running in the sandbox. `stdin` is a pipe the caller writes (a pipe, not a
    file: nothing to seek back in); with `pipe_stdout` its stdout is a pipe too (`stdout`),
    else a file of at most `max_output_bytes`. Start with `start()` (waits for the jail),
    end with `finish()` (waits for the program, at most its wall clock) and `close()`.

    `gated`: the jail is built by `launch()` but the program starts only at `go()`, so a
    caller builds the next program's jail while the current one runs; the wall clock starts
    at `go()`."""

    def __init__(self, files: dict[str, str | bytes], argv_tail: list[str], limits: Limits,
                 mode: str, *, pipe_stdout: bool = False, gated: bool = False):  # fmt: skip
        self.limits, self.mode = limits, mode
        # its files' prefix in the process's scratch directory (`scratch.py`)
        self.stem = os.path.join(scratch.acquire(), secrets.token_hex(8) + "-")
        self._scratch_held = True
        self._paths: list[str] = []  # its files, unlinked by close()
        self.proc: subprocess.Popen | None = None
        self.uid: int | None = None
        self.status, self.deadline = b"", 0.0
        self.pipe_stdout = pipe_stdout
        self._cfg = (files, argv_tail)
        self._dead = False  # killed and awaited: its pids are never signalled again
        self.budget = budgets.Budget()
        self.gated, self._gate = gated, None  # the gate's write end while it is shut

    def start(self) -> None:
        """Launch the jail, wait until it is ready, and start the program."""
        self.launch()
        self.wait_ready()
        self.go()

    def go(self) -> None:
        """Start the program (of a gated sandbox: open its gate); its wall clock starts now."""
        if self._gate is not None:
            with contextlib.suppress(OSError):  # the jail is gone: finish() reports it
                os.write(self._gate, b"g")
            os.close(self._gate)
            self._gate = None
        self.deadline = time.monotonic() + self.limits.timeout_s + _GRACE_S

    def launch(self) -> None:
        """Start building the jail (`wait_ready` waits for it: launch several, then wait)."""
        files, argv_tail = self._cfg
        status_r, status_w = os.pipe()
        self._status_fd = status_r
        self.budget = budgets.create(self.limits)
        cfg = _config(self.mode, self.stem, files, argv_tail, self.limits, status_w)
        self._paths = [*cfg["files"].values()]
        cfg["cgroups"] = self.budget.dirs
        gate_r = None
        if self.gated:
            gate_r, self._gate = os.pipe()
            cfg["gate_fd"] = gate_r  # the number under Popen; the zygote renumbers it
        if self.mode == "none":
            os.mkdir(cfg["workdir"])
            self._paths.append(cfg["workdir"])
        self.uid = cfg["outer_uid"] if self.mode != "none" and cfg["fresh_id"] else None
        self.out_path, self.err_path = self.stem + "stdout", self.stem + "stderr"
        self._paths += [self.out_path, self.err_path]
        private = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        with open(os.open(self.err_path, private, 0o600), "wb") as e, \
                open(os.open(self.out_path, private, 0o600), "wb") as o, \
                _closing(status_w), _closing(gate_r):  # fmt: skip
            fds = [status_w] + ([] if gate_r is None else [gate_r])
            if self.mode == "none":
                self._popen(cfg, o, e, fds)
            else:
                self._fork(cfg, o, e, fds)

    def _popen(self, cfg: dict, out, err, fds: list[int]) -> None:
        """The launcher as an interpreter of its own (isolation "none")."""
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_INIT), json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if self.pipe_stdout else out,
            stderr=err,
            env={"PATH": "/usr/bin:/bin"},
            start_new_session=True,
            pass_fds=tuple(fds),
            cwd=cfg["workdir"],
        )
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout

    def _fork(self, cfg: dict, out, err, fds: list[int]) -> None:
        """The launcher forked by this process's zygote (`zygote.py`)."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe() if self.pipe_stdout else (None, out.fileno())
        try:
            owner = zygote()
            self.proc = Launcher(owner, owner.spawn(cfg, [stdin_r, stdout_w, err.fileno(), *fds]))
        except BaseException:
            for fd in (stdin_w, stdout_r):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            os.close(stdin_r)
            if stdout_r is not None:
                os.close(stdout_w)
        self.stdin = open(stdin_w, "wb")  # noqa: SIM115 (closed by close())
        self.stdout = None if stdout_r is None else open(stdout_r, "rb")  # noqa: SIM115

    def wait_ready(self) -> None:
        """Wait for the jail's "ready"; SandboxError when it failed or took over SETUP_S."""
        self._read_status(time.monotonic() + SETUP_S, until=b"ready\n")
        if self._line(b"ready") is None:
            self.kill()
            why = self._line(b"error") or f"the jail was not ready within {SETUP_S:.0f} s"
            raise SandboxError(f"sandbox setup failed ({self.mode}): {why.removeprefix('error ')}")
        if not self.gated:
            self.go()

    def _read_status(self, deadline: float, until: bytes | None = None) -> None:
        """Read status lines until `until` has arrived, EOF, or the deadline."""
        while until is None or until not in self.status:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._status_fd], [], [], left)[0]:
                return
            chunk = os.read(self._status_fd, 4096)
            if not chunk:
                return
            self.status += chunk
            if self._line(b"error"):
                return

    def _line(self, head: bytes) -> str | None:
        """The first complete status line that starts with `head`."""
        for line in self.status.split(b"\n")[:-1]:
            if line.startswith(head):
                return line.decode(errors="replace")
        return None

    def finish(self) -> SandboxResult:
        """Wait for the program (at most until its deadline), kill what is left, and return
        its result as the jail reported it."""
        timed_out = not _exited(self.proc, max(0.0, self.deadline - time.monotonic()))
        self.kill()
        self._read_status(time.monotonic() + 1.0)
        lines = self.status.decode(errors="replace").split("\n")
        rc = -signal.SIGKILL
        for line in lines[lines.index("ready") + 1 :]:
            if line == "timeout":
                timed_out = True
            elif line.startswith("exit "):
                rc = int(line[5:])
            elif line.startswith("error"):  # only the exec can fail after "ready"
                raise SandboxError(f"sandbox: {line}")
        if self.mode == "none":
            rc = self.proc.returncode
        cap = self.limits.max_output_bytes
        out = b"" if self.pipe_stdout else _read(self.out_path, cap)
        b = self.budget
        return SandboxResult(rc, out.decode("utf-8", "replace"),
                             _read(self.err_path, cap).decode("utf-8", "replace"),
                             timed_out, "none" if self.mode == "none" else "namespaces",
                             b.kind, b.peak_bytes(), b.oom_kills(), self.uid)  # fmt: skip

    def kill(self) -> None:
        """SIGKILL the launcher's process group; in a namespace, wait for its init (whose
        death takes every process of the program with it)."""
        if self.proc is None or self._dead:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if isinstance(self.proc, Launcher):
                self.proc.signal_group(signal.SIGKILL)
            else:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.budget.kill_members()
        self.proc.wait()
        if self.mode == "none":
            _kill_group(self.proc.pid)
            self._dead = True
            return
        init = re.search(rb"^pid (\d+)$", self.status, re.MULTILINE)
        if init:  # the kernel kills and reaps every process of a pid namespace before its
            _kill_until_dead([int(init[1])])  # init's exit completes: init dead, all dead
        elif self.uid is not None:  # no init reported: whatever runs under the jail's uid
            _kill_until_dead(_pids_of(self.uid), uid=self.uid)
        self._dead = True

    def close(self) -> None:
        if self._gate is not None:  # never opened: the jail ends without running anything
            os.close(self._gate)
            self._gate = None
        self.kill()
        for f in (getattr(self, "stdin", None), getattr(self, "stdout", None)):
            with contextlib.suppress(OSError):
                if f is not None:
                    f.close()
        with contextlib.suppress(OSError, AttributeError):
            os.close(self._status_fd)
        for path in self._paths:
            with contextlib.suppress(OSError):
                if os.path.isdir(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        self._paths = []
        if self._scratch_held:
            self._scratch_held = False
            scratch.release()
        self.budget.remove()

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _exited(proc: subprocess.Popen | Launcher, timeout_s: float) -> bool:
    """Whether `proc` exits within `timeout_s`, woken by its pidfd the moment it does
    (`Popen.wait(timeout)` polls, sleeping up to 50 ms between looks)."""
    exited = exited_within(proc.pid, timeout_s)
    if exited is not None:
        return exited
    try:
        proc.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


@contextlib.contextmanager
def _closing(fd: int | None):
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _read(path: str, cap: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(cap)
