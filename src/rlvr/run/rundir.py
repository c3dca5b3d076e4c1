"""The run directory: created once, never overwritten by a new run, locked while a run uses it,
trimmed on resume.

The lock is `fcntl.flock` on `rlvr.lock` in the run directory, taken by the process that
writes (rank 0 under torchrun) before it writes anything and held until the run ends; the
kernel drops it when the process dies, SIGKILL included, so a crashed run never leaves a
stale lock. A second `rlvr train` on the same `--output-dir`, or `--resume` of a live run, is
refused naming the directory and the holder's pid. flock is advisory and local: on NFS it
is honoured only where the server supports it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import time
from pathlib import Path

from rlvr.config import Config, ConfigError, dump_yaml
from rlvr.run.checkpoint import remove_staging

LOCK = "rlvr.lock"

_held: dict[Path, int] = {}  # run directory (resolved) -> the lock file's descriptor


def prepare_run_dir(cfg: Config, resume: bool) -> Path:
    """Create (or, resuming, open) the run directory and lock it for this process; stale
    `.tmp-*` checkpoint staging directories left by a crashed save are removed."""
    if cfg.train.output_dir:
        run_dir = Path(cfg.train.output_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = new_default_run_dir(Path("runs"))
    lock_run_dir(run_dir)
    if not resume and (run_dir / "metrics.jsonl").exists():
        unlock_run_dir(run_dir)
        raise ConfigError(
            f"train.output_dir: {run_dir} already holds a run; resume it with "
            f"`rlvr train --resume {run_dir}` or choose another --output-dir"
        )
    for stale in remove_staging(run_dir):
        sys.stderr.write(f"removed {stale.name}, left by a save that did not finish\n")
    if not resume:
        (run_dir / "config.yaml").write_text(dump_yaml(cfg))
    return run_dir


def new_default_run_dir(parent: Path) -> Path:
    """`parent/<YYYYmmdd-HHMMSS>`, or `-2`, `-3`, ... after it when that name is taken:
    `mkdir` without exist_ok is atomic, so two runs started in the same second never share
    a directory."""
    parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 10_000):
        path = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise ConfigError(f"train.output_dir: {parent} holds 10000 runs named {stamp}*")


def lock_run_dir(run_dir: Path) -> None:
    """Take the run directory's lock for the life of this process (or `unlock_run_dir`);
    ConfigError naming the holder when another process has it. Re-locking a directory this
    process holds is a no-op."""
    key = run_dir.resolve()
    if key in _held:
        return
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            sys.stderr.write(
                f"warning: {run_dir}: this filesystem does not support locks ({e.strerror}); "
                "a second run on this directory will not be detected\n"
            )
            return
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ConfigError(f"train.output_dir: cannot lock {run_dir}: {e.strerror}") from None
        raise ConfigError(
            f"train.output_dir: {run_dir} is in use by another rlvr run (pid {holder}); "
            "wait for it to end or choose another --output-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = fd


def unlock_run_dir(run_dir: Path) -> None:
    """Release the lock taken by `lock_run_dir` (a no-op when this process does not hold it)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor of the open file releases the flock


def truncate_jsonl(path: Path, last_step: int, warn=None, *, one_per_step: bool = False) -> None:
    """Drop lines written after the checkpoint being resumed (they will be written again).
    With `one_per_step` (metrics.jsonl: one line a step) a step that does not follow the
    line before (a duplicated or out-of-order step) raises ConfigError naming both lines.

    A last line that is not a complete JSON object (the process died writing it) is dropped
    with a note; a malformed line elsewhere is not a crash artefact and raises ConfigError
    naming the file and line. The file is replaced atomically, so a crash or a full disk
    here leaves the old file whole."""
    if not path.exists():
        return
    lines = path.read_bytes().split(b"\n")
    keep, previous = [], None  # (line number, step) of the last row
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not an object")
        except ValueError:
            if any(rest.strip() for rest in lines[i + 1 :]):
                raise ConfigError(
                    f"{path}:{i + 1}: not a JSON object; the file is damaged (not by a crash "
                    "mid-write, which only cuts the last line)"
                ) from None
            (warn or _stderr)(
                f"{path}:{i + 1}: dropping an incomplete last line ({len(line)} bytes, "
                "written when the run was killed)"
            )
            break
        step = row.get("step", 0)
        if one_per_step and previous is not None and not (type(step) is int and step > previous[1]):
            raise ConfigError(
                f"{path}:{i + 1}: step {step!r} after step {previous[1]} on line {previous[0]}; "
                "steps must increase one line each (the file was edited or damaged)"
            )
        previous = (i + 1, step)
        if step <= last_step:
            keep.append(line + b"\n")
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(b"".join(keep))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
