"""The run directory: created once, never overwritten by a new run, locked while a run uses it,
trimmed on resume, and left behind only by a run that started.

A new run's directory is prepared (created, locked, config.yaml written) only once the whole
run has been built and checked: config, data, rewards, model and tokenizer. What the run
writes before its first step is logged (the Python API's in-memory datasets, config.yaml,
the lock, the logs of a failing first evaluation) is removed again when it fails before that
step (`discard_unstarted`), the directory too when this process made it; files that were
there before, and any name a run does not write, are never touched. A directory rlvr did not make (no
`rlvr.lock`) that already holds a file of a run's own names (`RUN_FILES`: config.yaml, the
logs, checkpoints, the API's data files) is refused naming the file, so
`rlvr train config.yaml --output-dir .` never overwrites the user's config.yaml.

The lock is `fcntl.flock` on `rlvr.lock` in the run directory, taken by the process that
writes (rank 0 under torchrun) before it writes anything and held until the run ends; the
kernel drops it when the process dies, SIGKILL included, so a crashed run never leaves a
stale lock. A second `rlvr train` on the same `--output-dir`, or `--resume` of a live run, is
refused naming the directory and the holder's pid. flock is advisory and local: on NFS it
is honoured only where the server supports it.

What a run writes is its owner's only: directories 0700, files 0600 (rlvr.run.private).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import sys
import time
from pathlib import Path

from rlvr.config.load import dump_yaml
from rlvr.config.schema import Config, ConfigError
from rlvr.run.checkpoint import remove_staging
from rlvr.run.private import FILE_MODE, private_dir, write_private

LOCK = "rlvr.lock"

# The names a run writes into its directory (the Python API's datasets and a model built in
# memory, rlvr.api.model_object, included).
RUN_FILES = (
    "config.yaml",
    "metrics.jsonl",
    "samples.jsonl",
    "summary.json",
    "tensorboard",
    "checkpoints",
    "data/train.jsonl",
    "data/eval.jsonl",
    "base_model",
)

_held: dict[Path, int] = {}  # run directory (resolved) -> the lock file's descriptor
# run directory (resolved) -> the names it held before this process wrote into it (None:
# this process made it), until its run's first step is logged (`started`)
_drafts: dict[Path, frozenset[str] | None] = {}


def check_run_dir(run_dir: Path, resume: bool = False) -> None:
    """Refuse, writing nothing, a directory a new run may not use: one that holds a run, or
    a user's file under one of RUN_FILES' names (where rlvr.lock does not mark it as a run
    directory)."""
    if resume or not run_dir.is_dir():
        return
    _refuse_if_live(run_dir)
    if (run_dir / "metrics.jsonl").exists():
        raise ConfigError(
            f"train.output_dir: {run_dir} already holds a run; resume it with "
            f"`rlvr train --resume {run_dir}` or choose another --output-dir"
        )
    if (run_dir / LOCK).exists():
        return  # rlvr's own directory, of a run that never logged a step
    before = _drafts.get(run_dir.resolve(), _contents(run_dir))
    for name in RUN_FILES:
        if before is not None and name in before:
            raise ConfigError(
                f"train.output_dir: {run_dir} already holds {name} (not a run's: no {LOCK}), "
                "which the run would overwrite; choose a new or empty --output-dir"
            )


def _refuse_if_live(run_dir: Path) -> None:
    """ConfigError naming the holder when another process holds `run_dir`'s lock; writes
    nothing (the lock is tried on a read-only descriptor and let go at once)."""
    if run_dir.resolve() in _held:
        return
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file: no run holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            raise ConfigError(_in_use(run_dir, holder)) from None
    finally:
        os.close(fd)


def _in_use(run_dir: Path, holder: str) -> str:
    return (
        f"train.output_dir: {run_dir} is in use by another rlvr run (pid {holder}); "
        "wait for it to end or choose another --output-dir"
    )


def draft_run_dir(run_dir: Path, made: bool = False) -> None:
    """Note what `run_dir` holds before this process writes into it (`made`: nothing, this
    process has just made it; a no-op when noted already), so `discard_unstarted` can take
    back only what the run added."""
    key = run_dir.resolve()
    if key not in _drafts:
        _drafts[key] = None if made or not run_dir.is_dir() else _contents(run_dir)


def started(run_dir: Path) -> None:
    """The run in `run_dir` has logged a step: its directory stays, whatever happens next."""
    _drafts.pop(Path(run_dir).resolve(), None)


def discard_unstarted(run_dir: Path) -> None:
    """Remove what a run that never logged a step wrote into `run_dir`: the names a run
    writes (RUN_FILES, the lock, a tracker's folder) that were not there before, then
    `data/` and the directory itself when this process made them and they are left empty.
    Anything else, whoever wrote it, stays."""
    key = Path(run_dir).resolve()
    if key not in _drafts:
        return
    unlock_run_dir(key)
    made = _drafts[key] is None
    before = _drafts.pop(key) or frozenset()
    for name in (*RUN_FILES, LOCK, "wandb"):
        path = key / name
        if name in before or not (path.exists() or path.is_symlink()):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for folder, ours in ((key / "data", "data" not in before), (key, made)):
        if ours:
            with contextlib.suppress(OSError):  # not empty: something else wrote into it
                folder.rmdir()


def _contents(run_dir: Path) -> frozenset[str]:
    """Its top-level names and which of RUN_FILES it holds."""
    return frozenset(_entries(run_dir)) | {n for n in RUN_FILES if (run_dir / n).exists()}


def _entries(run_dir: Path) -> list[str]:
    try:
        return os.listdir(run_dir)
    except OSError:
        return []


def prepare_run_dir(cfg: Config, resume: bool) -> Path:
    """Create (or, resuming, open) the run directory and lock it for this process; stale
    `.tmp-*` checkpoint staging directories left by a crashed save are removed. A new run's
    directory is first checked (`check_run_dir`) and noted as a draft (`draft_run_dir`)."""
    if cfg.train.output_dir:
        run_dir = Path(cfg.train.output_dir)
        if not resume:
            check_run_dir(run_dir)
            draft_run_dir(run_dir)
        private_dir(run_dir)
    else:
        run_dir = new_default_run_dir(Path("runs"))
        draft_run_dir(run_dir, made=True)
    lock_run_dir(run_dir)
    if not resume and (run_dir / "metrics.jsonl").exists():
        discard_unstarted(run_dir)
        raise ConfigError(
            f"train.output_dir: {run_dir} already holds a run; resume it with "
            f"`rlvr train --resume {run_dir}` or choose another --output-dir"
        )
    for stale in remove_staging(run_dir):
        sys.stderr.write(f"removed {stale.name}, left by a save that did not finish\n")
    if not resume:
        write_private(run_dir / "config.yaml", dump_yaml(cfg))
    return run_dir


def new_default_run_dir(parent: Path) -> Path:
    """`parent/<YYYYmmdd-HHMMSS>`, or `-2`, `-3`, ... after it when that name is taken:
    `mkdir` without exist_ok is atomic, so two runs started in the same second never share
    a directory."""
    private_dir(parent)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 10_000):
        path = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            return private_dir(path, exist_ok=False)
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
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
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
        raise ConfigError(_in_use(run_dir, holder)) from None
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
        write_private(tmp, b"".join(keep))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
