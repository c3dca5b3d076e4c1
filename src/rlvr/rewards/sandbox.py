"""Run untrusted Python in a sandbox: `run_python(source, stdin=...) -> SandboxResult`.

What the sandbox guarantees (isolation "root" or "userns", i.e. Linux namespaces work):
  - no network: a fresh network namespace with only a loopback that is down, so even
    127.0.0.1 is unreachable;
  - a private filesystem: the program is chrooted into a tmpfs that holds only the Python
    installation, /usr and /lib* (read-only, nosuid) and /dev/{null,zero,urandom}; the
    project, /home, /root, /etc, /proc and /work do not exist there. The only writable place
    is its working directory /tmp, a tmpfs of `tmp_mb`; everything is gone after the run;
  - its own pid namespace and process group: on exit or timeout the whole group is killed,
    and the kernel kills every process left in the namespace;
  - limits: CPU seconds, address space, open files, processes (RLIMIT_NPROC against a fresh
    uid of its own as root, so a fork bomb stops at `max_procs`), file size (which also caps
    stdout/stderr: they go to files, and a program that writes more gets SIGXFSZ);
  - an empty environment, `python -I -S -B` (no site-packages, no user site, no .pyc);
  - as root the program runs as an unprivileged uid that owns nothing; without root it runs
    in a nested user namespace with no capabilities over its mounts, and with
    PR_SET_NO_NEW_PRIVS either way.
Limits of the guarantee: it is not a VM or seccomp jail: it shares the kernel, it can read
the system's Python standard library and /usr, and a kernel bug could break out. CPU and
memory are per process, so N processes may use N times the limits until the wall-clock
timeout (default 5 s) kills them all.

Isolation "none" (namespaces unavailable: some containers forbid unshare): limits, empty
environment, fresh temporary directory and process group only; no network or filesystem
isolation, and a fork bomb is bounded only by the user's RLIMIT_NPROC. "auto" uses the
namespaces when a probe run succeeds and otherwise warns once and falls back to "none".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

_INIT = Path(__file__).with_name("_sandbox_init.py")
_SETUP_FAILED = 97


@dataclass(frozen=True)
class SandboxResult:
    """returncode: the program's exit status (negative: killed by that signal); stdout/stderr:
    decoded, at most `max_output_bytes` each; timed_out: killed by the wall-clock limit;
    isolation: "root", "userns" or "none"."""

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


def _user_process_count() -> int:
    uid, n = os.getuid(), 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                n += os.stat(f"/proc/{d}").st_uid == uid
    return n


def _run(mode: str, files: dict[str, str], argv_tail: list[str], stdin: str, lim: Limits):
    exe, _ = _python()
    tmp = tempfile.mkdtemp(prefix="rlvr-sandbox-")
    try:
        srcs = {}
        for i, (name, text) in enumerate(files.items()):
            srcs[name] = os.path.join(tmp, f"file{i}")
            Path(srcs[name]).write_text(text)
        procs = lim.max_procs
        uid = None
        if mode == "root":
            uid = 1_000_000 + secrets.randbelow(1_000_000_000)
        elif mode in ("userns", "none"):
            procs += _user_process_count()  # RLIMIT_NPROC counts all of this user's processes
        limits = {
            "RLIMIT_CPU": lim.cpu_s or max(1, math.ceil(lim.timeout_s)),
            "RLIMIT_AS": lim.memory_mb << 20,
            "RLIMIT_NPROC": procs,
            "RLIMIT_NOFILE": lim.max_open_files,
            "RLIMIT_FSIZE": lim.max_output_bytes,
            "RLIMIT_CORE": 0,
        }
        links, binds = _layout()
        workdir = os.path.join(tmp, "work")
        os.mkdir(workdir)
        cfg = {
            "mode": mode,
            "root": os.path.join(tmp, "root"),
            "workdir": workdir,
            "links": links,
            "binds": binds,
            "tmp_bytes": lim.tmp_mb << 20,
            "files": srcs,
            "uid": uid,
            "limits": limits,
            "argv": [exe, "-I", "-S", "-B", *argv_tail],
        }
        os.mkdir(cfg["root"])
        launcher = [sys.executable, "-I", "-S", str(_INIT), json.dumps(cfg)]
        if mode == "root":
            launcher = ["unshare", "--net", "--mount", "--pid", "--kill-child", *launcher]
        elif mode == "userns":
            launcher = ["unshare", "--user", "--map-root-user", "--net", "--mount", "--pid",
                        "--kill-child", *launcher]  # fmt: skip
        stdin_path = os.path.join(tmp, "stdin")
        Path(stdin_path).write_text(stdin)
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        with open(stdin_path, "rb") as i, open(out_path, "wb") as o, open(err_path, "wb") as e:
            proc = subprocess.Popen(
                launcher, stdin=i, stdout=o, stderr=e, env={"PATH": "/usr/bin:/bin"},
                start_new_session=True, cwd=workdir if mode == "none" else "/",
            )  # fmt: skip
            timed_out = False
            try:
                proc.wait(timeout=lim.timeout_s + 0.5)  # + the jail's own start-up
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_all(proc, uid)
        cap = lim.max_output_bytes

        def read(p):
            with open(p, "rb") as f:
                return f.read(cap).decode("utf-8", "replace")

        rc = proc.returncode
        if mode != "none" and 128 < rc < 160:
            rc = 128 - rc  # the launcher's report of "killed by signal rc - 128"
        return SandboxResult(rc, read(out_path), read(err_path), timed_out, mode)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _kill_all(proc: subprocess.Popen, uid: int | None, wait_s: float = 5.0) -> None:
    """SIGKILL the process group until it is gone (a fork bomb keeps adding members while
    the kernel delivers the signals), then, as root, every process of the sandbox's uid, which
    also finds any that left the group with setsid(). Returns when none is left, or after
    `wait_s` (the kernel then finishes the pid namespace's teardown on its own)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            break
        proc.poll()  # reap the leader, or the group never empties
        time.sleep(0.01)
    proc.wait()
    if uid is None:
        return
    while time.monotonic() < deadline:
        pids = _pids_of(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _pids_of(uid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{d}").st_uid == uid:
                    with open(f"/proc/{d}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] != "Z":  # zombies are dead
                            out.append(int(d))
    return out


_probe_lock = threading.Lock()
_probed: dict[str, str] = {}


def available_isolation() -> str:
    """The strongest isolation that works here: "root", "userns" or "none" (probed once)."""
    with _probe_lock:
        if "mode" not in _probed:
            mode = "none"
            if shutil.which("unshare") and sys.platform == "linux":
                candidate = "root" if os.geteuid() == 0 else "userns"
                try:
                    r = _run(candidate, {"p.py": "print(6*7)"}, ["p.py"], "", Limits(timeout_s=20))
                    if r.returncode == 0 and r.stdout.strip() == "42":
                        mode = candidate
                    else:
                        _probed["why"] = r.stderr.strip()[-300:]
                except OSError as e:
                    _probed["why"] = str(e)
            _probed["mode"] = mode
        return _probed["mode"]


def _mode(isolation: str) -> str:
    if isolation not in ("auto", "namespaces", "none"):
        raise ValueError(f"isolation must be 'auto', 'namespaces' or 'none', got {isolation!r}")
    if isolation == "none":
        return "none"
    mode = available_isolation()
    if mode == "none":
        why = _probed.get("why", "unshare not found")
        if isolation == "namespaces":
            raise RuntimeError(f"sandbox: Linux namespaces unavailable here ({why})")
        if not _probed.get("warned"):
            _probed["warned"] = "1"
            warnings.warn(
                f"sandbox: Linux namespaces unavailable ({why}); running code with "
                "resource limits only, without network or filesystem isolation",
                stacklevel=3,
            )
    return mode


def run_python(
    source: str,
    *,
    stdin: str = "",
    limits: Limits | None = None,
    isolation: str = "auto",
    extra_files: dict[str, str] | None = None,
    source_via_stdin: bool = False,
) -> SandboxResult:
    """Run `source` as a Python program in the sandbox, feeding it `stdin`.

    isolation: "auto" (namespaces if they work, else "none" with a warning), "namespaces"
    (raise RuntimeError if they do not work) or "none". extra_files are written next to the
    program in its working directory. source_via_stdin runs `python -` with the source as
    stdin (then `stdin` must be empty), so the program has no file of its own to read.
    """
    mode = _mode(isolation)
    if source_via_stdin:
        if stdin:
            raise ValueError("source_via_stdin leaves no stdin for the program")
        files, argv, stdin = dict(extra_files or {}), ["-"], source
    else:
        files, argv = {"main.py": source, **(extra_files or {})}, ["main.py"]
    result = _run(mode, files, argv, stdin, limits or Limits())
    if result.returncode == _SETUP_FAILED and "rlvr sandbox setup failed" in result.stderr:
        raise RuntimeError(result.stderr.strip())
    return result
