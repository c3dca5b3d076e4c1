"""Run untrusted Python in a sandbox: `run_python(source, stdin=...) -> SandboxResult`, or
`SandboxProcess` for a program the caller talks to through pipes.

Isolation "namespaces" (the same for root and any other user; `_sandbox_init` lists the
steps) guarantees:
  - no network: a fresh network namespace whose loopback is down, so even 127.0.0.1 is
    unreachable;
  - a private filesystem: the root is a tmpfs that holds only the Python installation, /usr
    and /lib* (read-only, nosuid) and /dev/{null,zero,urandom}; the project, /home, /root,
    /etc, /proc and /work do not exist there, and the host's root is detached, not hidden.
    The only writable place is the working directory /tmp, a tmpfs of `tmp_mb`;
  - its own pid namespace: the trainer, its environment and every other process are
    invisible and unreachable by signal; when the program exits, runs past `timeout_s`
    (sleeping or not), or the trainer dies (even by SIGKILL), the namespace's init exits and
    the kernel kills every process left in it, setsid and double-forked ones included;
  - no privileges: uid 1000 in its own user namespace (as root, mapped to a fresh uid that
    owns nothing; otherwise to the caller's uid), no capabilities, no nested user
    namespaces, PR_SET_NO_NEW_PRIVS;
  - limits: CPU seconds, address space, open files, processes (RLIMIT_NPROC counts the
    namespace's own processes on Linux >= 5.14), file size (which also caps stdout and
    stderr: they go to files, and a program that writes more gets SIGXFSZ);
  - an empty environment, `python -I -S -B` (no site-packages, no user site, no .pyc).
Limits of the guarantee: it is not a VM, and its seccomp filter refuses only the keyring
syscalls: it shares the kernel, it can read the system's Python standard library and /usr, and
a kernel bug could break out. CPU and memory are per process, so N processes may use N times
the limits until the wall clock ends.

Infrastructure failures (namespaces refused, a mount failing, the interpreter missing) raise
`SandboxError`. The jail reports its state on a status pipe that only its own code holds,
closed before the program starts, so nothing the program prints, writes or exits with can
pass for a failed jail: once the jail reported "ready", the outcome is the program's.

Isolation "auto" (the default) is "namespaces" where they work and otherwise refuses to run
anything (`SandboxUnavailable`). "none" is the explicit opt-out: limits, an empty
environment, a fresh directory and a process group only; the program runs as the caller,
can read its files and /proc and reach the network, and its setsid children can outlive it.

This module and `_sandbox_init.py` import only the standard library, so a copy of the two runs
on its own: the unprivileged tests load one as a user who cannot read the installed package.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_INIT = Path(__file__).with_name("_sandbox_init.py")
SETUP_S = 30.0  # building the jail on a loaded machine; not part of the program's time
_GRACE_S = 1.0  # the trainer's own deadline, after the jail's
ISOLATIONS = ("auto", "namespaces", "none")


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program it runs)."""


class SandboxUnavailable(SandboxError):
    """Isolation was required but Linux namespaces do not work here."""


@dataclass(frozen=True)
class SandboxResult:
    """returncode: the program's exit status (negative: killed by that signal); stdout/stderr:
    decoded, at most `max_output_bytes` each; timed_out: killed by the wall-clock limit;
    isolation: "namespaces" or "none"."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    isolation: str


@dataclass(frozen=True)
class Limits:
    """timeout_s: wall clock; cpu_s: RLIMIT_CPU; memory_mb: RLIMIT_AS; max_procs: RLIMIT_NPROC;
    max_open_files: RLIMIT_NOFILE; max_output_bytes: RLIMIT_FSIZE (files and stdout/stderr);
    tmp_mb: size of the writable /tmp."""

    timeout_s: float = 5.0
    cpu_s: int | None = None  # default: ceil(timeout_s)
    memory_mb: int = 512
    max_procs: int = 32
    max_open_files: int = 64
    max_output_bytes: int = 1 << 20
    tmp_mb: int = 16


def _python() -> tuple[str, list[str]]:
    """The real interpreter (not a venv's symlink) and the directories it needs."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    dirs = [prefix]
    if not exe.startswith(prefix + os.sep):
        dirs.append(os.path.dirname(exe))
    return exe, dirs


def _layout() -> tuple[list[str], list[str]]:
    links, binds = [], []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            links.append(top)
        elif os.path.isdir(top):
            binds.append(top)
    for p in _python()[1]:
        if not any(p == b or p.startswith(b + "/") for b in binds):
            binds.append(p)
    binds += [d for d in ("/dev/null", "/dev/zero", "/dev/urandom") if os.path.exists(d)]
    return links, binds


def _nproc_is_per_namespace() -> bool:
    """RLIMIT_NPROC counts per user namespace since Linux 5.14."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


def _user_process_count() -> int:
    uid, n = os.getuid(), 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                n += os.stat(f"/proc/{d}").st_uid == uid
    return n


def _id_ranges(path: str) -> list[tuple[int, int]]:
    """[first, end) ranges of the ids this process's user namespace maps."""
    try:
        with open(path) as f:
            rows = [line.split() for line in f if line.strip()]
        return [(int(r[0]), int(r[0]) + int(r[2])) for r in rows]
    except (OSError, ValueError, IndexError):
        return []


def _fresh_id(low: int = 1_000_000) -> int | None:
    """A random id >= `low`, mapped here as both a uid and a gid, for the program to run as
    (as root: one that owns no file and no process). None where no such id exists (root of
    a container whose namespace maps only a few ids): the program then runs as our uid."""
    uids, gids = _id_ranges("/proc/self/uid_map"), _id_ranges("/proc/self/gid_map")
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


def _config(mode: str, tmp: str, files: dict[str, str], argv_tail, lim: Limits, status_fd: int):
    srcs = {}
    for i, (name, text) in enumerate(files.items()):
        srcs[name] = os.path.join(tmp, f"file{i}")
        with open(os.open(srcs[name], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(text)
    outer = _fresh_id() if os.geteuid() == 0 else None
    fresh = outer is not None
    procs = lim.max_procs + 1  # + the namespace's init
    if mode == "none" or not (fresh or _nproc_is_per_namespace()):
        procs += _user_process_count()  # RLIMIT_NPROC then counts all of this uid's processes
    links, binds = _layout()
    return {
        "mode": mode,
        "parent": os.getpid(),
        "status_fd": status_fd,
        "root": os.path.join(tmp, "root"),
        "workdir": os.path.join(tmp, "work"),
        "links": links,
        "binds": binds,
        "tmp_bytes": lim.tmp_mb << 20,
        "files": srcs,
        "outer_uid": outer if fresh else os.geteuid(),
        "outer_gid": outer if fresh else os.getegid(),
        "fresh_id": fresh,
        "deny_setgroups": not fresh,  # required to map a gid without CAP_SETGID
        "timeout_s": lim.timeout_s,
        "limits": {
            "RLIMIT_CPU": lim.cpu_s or max(1, math.ceil(lim.timeout_s)),
            "RLIMIT_AS": lim.memory_mb << 20,
            "RLIMIT_NPROC": procs,
            "RLIMIT_NOFILE": lim.max_open_files,
            "RLIMIT_FSIZE": lim.max_output_bytes,
            "RLIMIT_CORE": 0,
        },
        "argv": [_python()[0], "-I", "-S", "-B", *argv_tail],
    }


class SandboxProcess:
    """A program running in the sandbox. `stdin` is a pipe the caller writes (a pipe, not a
    file: nothing to seek back in); with `pipe_stdout` its stdout is a pipe too (`stdout`),
    else a file of at most `max_output_bytes`. Start with `start()` (waits for the jail),
    end with `finish()` (waits for the program, at most its wall clock) and `close()`."""

    def __init__(self, files: dict[str, str], argv_tail: list[str], limits: Limits,
                 mode: str, *, pipe_stdout: bool = False):  # fmt: skip
        self.limits, self.mode = limits, mode
        self.tmp = tempfile.mkdtemp(prefix="rlvr-sandbox-")
        # the jail's init, under its own uid as root, must reach tmp/root to mount on it;
        # the files in tmp stay private (0600)
        os.chmod(self.tmp, 0o711)
        self.proc: subprocess.Popen | None = None
        self.uid: int | None = None
        self.status, self.deadline = b"", 0.0
        self.pipe_stdout = pipe_stdout
        self._cfg = (files, argv_tail)

    def start(self) -> None:
        """Launch the jail and wait until it is ready to run the program."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start building the jail (`wait_ready` waits for it: launch several, then wait)."""
        files, argv_tail = self._cfg
        status_r, status_w = os.pipe()
        self._status_fd = status_r
        cfg = _config(self.mode, self.tmp, files, argv_tail, self.limits, status_w)
        os.mkdir(cfg["root"])
        os.mkdir(cfg["workdir"])
        self.uid = cfg["outer_uid"] if self.mode != "none" and cfg["fresh_id"] else None
        self.out_path = os.path.join(self.tmp, "stdout")
        self.err_path = os.path.join(self.tmp, "stderr")
        private = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        with open(os.open(self.err_path, private, 0o600), "wb") as e, \
                open(os.open(self.out_path, private, 0o600), "wb") as o, \
                _closing(status_w):  # fmt: skip
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_INIT), json.dumps(cfg)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE if self.pipe_stdout else o,
                stderr=e,
                env={"PATH": "/usr/bin:/bin"},
                start_new_session=True,
                pass_fds=(status_w,),
                cwd=cfg["workdir"] if self.mode == "none" else "/",
            )
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout

    def wait_ready(self) -> None:
        """Wait for the jail's "ready"; SandboxError when it failed or took over SETUP_S."""
        self._read_status(time.monotonic() + SETUP_S, until=b"ready\n")
        if self._line(b"ready") is None:
            self.kill()
            why = self._line(b"error") or f"the jail was not ready within {SETUP_S:.0f} s"
            raise SandboxError(f"sandbox setup failed ({self.mode}): {why.removeprefix('error ')}")
        self.deadline = time.monotonic() + self.limits.timeout_s + _GRACE_S

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
        timed_out = False
        try:
            self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
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
        return SandboxResult(rc, out.decode("utf-8", "replace"),
                             _read(self.err_path, cap).decode("utf-8", "replace"),
                             timed_out, "none" if self.mode == "none" else "namespaces")  # fmt: skip

    def kill(self) -> None:
        """SIGKILL the launcher's process group; in a namespace, wait for its init (whose
        death takes every process of the program with it)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if self.mode == "none":
            _kill_group(self.proc.pid)
            return
        init = re.search(rb"^pid (\d+)$", self.status, re.MULTILINE)
        if init:
            _kill_until_dead([int(init[1])])
        if self.uid is not None:
            _kill_until_dead(_pids_of(self.uid), uid=self.uid)

    def close(self) -> None:
        self.kill()
        for f in (getattr(self, "stdin", None), getattr(self, "stdout", None)):
            with contextlib.suppress(OSError):
                if f is not None:
                    f.close()
        with contextlib.suppress(OSError, AttributeError):
            os.close(self._status_fd)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def _closing(fd: int):
    try:
        yield fd
    finally:
        os.close(fd)


def _read(path: str, cap: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(cap)


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
    while pids and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)
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


_probe_lock = threading.Lock()
_probed: dict[str, str] = {}


def available_isolation() -> str:
    """The isolation that works here: "namespaces" if a probe run in them succeeds, else
    "none" (probed once)."""
    with _probe_lock:
        if "mode" not in _probed:
            mode = "none"
            if sys.platform == "linux":
                try:
                    r = _run("namespaces", {"p.py": "print(6*7)"}, ["p.py"], "", Limits(20))
                    if r.returncode == 0 and r.stdout.strip() == "42":
                        mode = "namespaces"
                    else:
                        _probed["why"] = f"probe exited {r.returncode}: {r.stderr.strip()[-300:]}"
                except (OSError, SandboxError) as e:
                    _probed["why"] = str(e)
            _probed["mode"] = mode
        return _probed["mode"]


def resolve_isolation(isolation: str) -> str:
    """The mode `isolation` runs in: "namespaces" or "none"; raises SandboxUnavailable when
    isolation is required ("auto", "namespaces") and namespaces do not work here."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    if isolation == "none":
        return "none"
    if available_isolation() == "none":
        raise SandboxUnavailable(
            f"sandbox: Linux namespaces do not work here ({_probed.get('why', '?')}); "
            "model-written code will not run unisolated unless you opt out by name with "
            "reward.sandbox_isolation: none (isolation='none')"
        )
    return "namespaces"


def _run(mode: str, files: dict[str, str], argv_tail: list[str], stdin: str, lim: Limits):
    with SandboxProcess(files, argv_tail, lim, mode) as p:
        p.start()
        feeder = threading.Thread(target=_feed, args=(p.stdin, stdin.encode()), daemon=True)
        feeder.start()
        result = p.finish()
        feeder.join(timeout=1.0)
        return result


def _feed(pipe, data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):  # the program stopped reading
        pipe.write(data)
        pipe.close()


def run_python(
    source: str,
    *,
    stdin: str = "",
    limits: Limits | None = None,
    isolation: str = "auto",
    extra_files: dict[str, str] | None = None,
) -> SandboxResult:
    """Run `source` as a Python program in the sandbox, its stdin a pipe fed with `stdin`.

    isolation: "auto" or "namespaces" (run isolated, or raise SandboxUnavailable), or "none"
    (the explicit opt-out). extra_files are written next to the program in its working
    directory. Raises SandboxError when the jail fails; whatever the program does is in the
    result.
    """
    mode = resolve_isolation(isolation)
    files = {"main.py": source, **(extra_files or {})}
    return _run(mode, files, ["main.py"], stdin, limits or Limits())
