"""Owner-only run directories: every directory a run makes is 0700 and every file it writes
0600, whatever the umask (at the usual 022 a run's samples, config and weights would be
readable by every local user).

Each mode is set when the file or directory is created, never widened and narrowed after:
our files are opened with 0600 (`open_private`, `write_private`), our directories made with
0700 (`private_dir`; the explicit chmod only undoes a umask that removed owner bits, it
never adds anyone else's). What other libraries write (`save_pretrained`, `torch.save`,
TensorBoard's event files) goes into a directory that is already 0700, which no other user
can enter, and `narrow` strips the group and other bits there before the directory is
renamed into place or closed. A directory that existed before the run (`--output-dir .`)
keeps its mode; the files the run writes into it are still 0600.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_MODE, FILE_MODE = 0o700, 0o600


def private_dir(path: Path, *, exist_ok: bool = True) -> Path:
    """`mkdir -p path`, each directory it makes 0700; an existing one keeps its mode
    (FileExistsError when it exists and not `exist_ok`: `mkdir` is atomic, so two runs
    never share a default directory)."""
    path = Path(path)
    if exist_ok and path.is_dir():
        return path
    if not path.parent.is_dir():
        private_dir(path.parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if exist_ok and path.is_dir():
            return path
        raise
    os.chmod(path, DIR_MODE)
    return path


def _opener(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_CLOEXEC, FILE_MODE)


def open_private(path: Path, mode: str = "w", **kwargs):
    """`open(path, mode)` that creates the file 0600 (an existing file keeps its mode)."""
    return open(path, mode, opener=_opener, **kwargs)


def write_private(path: Path, data: str | bytes) -> None:
    """`path.write_text` / `write_bytes`, the file created 0600."""
    with open_private(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def narrow(root: Path) -> None:
    """Strip the group and other bits from `root` and everything under it (links are left
    alone): for files another library wrote inside a directory that is already 0700."""
    for base, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            _narrow_one(Path(base) / name)
    _narrow_one(Path(root))


def _narrow_one(path: Path) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:  # removed while walking (a writer's temporary file)
        return
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
