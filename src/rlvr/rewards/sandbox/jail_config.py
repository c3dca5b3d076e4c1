"""The jail's configuration for `jail_init.py`: the host directories it binds, the ids it maps
and the resource limits it sets."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import secrets
import sys

from .spec import Limits


# _python, _layout and _id_ranges read what does not change while a process runs; cached,
# they save about 0.3 ms of each sandbox's launch on the 2-core machine
@functools.cache
def _python() -> tuple[str, tuple[str, ...]]:
    """The real interpreter (not a venv's symlink) and the directories it needs."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    dirs = [prefix]
    if not exe.startswith(prefix + os.sep):
        dirs.append(os.path.dirname(exe))
    return exe, tuple(dirs)


@functools.cache
def _layout() -> tuple[tuple[str, ...], tuple[str, ...]]:
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
    return tuple(links), tuple(binds)


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


@functools.cache
def _id_ranges(path: str) -> tuple[tuple[int, int], ...]:
    """[first, end) ranges of the ids this process's user namespace maps."""
    try:
        with open(path) as f:
            rows = [line.split() for line in f if line.strip()]
        return tuple((int(r[0]), int(r[0]) + int(r[2])) for r in rows)
    except (OSError, ValueError, IndexError):
        return ()


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


def _config(
    mode: str, stem: str, files: dict[str, str | bytes], argv_tail, lim: Limits, status_fd: int
):
    """`stem`: the path prefix of this sandbox's own files in its process's scratch directory
    (`scratch.py`), whose `root` is the jail's mount point."""
    srcs = {}
    for i, (name, text) in enumerate(files.items()):
        srcs[name] = f"{stem}file{i}"
        with open(os.open(srcs[name], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
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
        "root": os.path.join(os.path.dirname(stem), "root"),
        "workdir": f"{stem}work",  # isolation "none" only: the program's directory
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
