"""A checkpoint's manifest: the size and sha256 of every file, written last, checked before use.

A manifest is accepted only when it is UTF-8 JSON holding a non-empty "files" mapping of
names inside the checkpoint directory (no absolute paths, no "..", no symlink out) to
{"size": int >= 0, "sha256": 64 hex digits}, lists the trainer state, and names the same
step as its directory; anything else is refused by name, never a crash, never a pass.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path, PurePosixPath

MANIFEST = "manifest.json"
STATE = "trainer_state.pt"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt; the message names it and why."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(tmp: Path, step: int) -> list[Path]:
    """Write `tmp/manifest.json` for every file under `tmp`; returns those files."""
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {
        "step": step,
        "files": {
            str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files
        },
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return files


def _manifest_entries(path: Path) -> dict[str, tuple[int, str]]:
    """The manifest's {file: (size, sha256)}, or CheckpointError naming what is malformed."""

    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path}: {MANIFEST} {why}")

    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {path}: no {MANIFEST} (incomplete save)")
    try:
        manifest = json.loads(manifest_path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise bad(f"cannot be read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise bad("is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise bad(f"is not valid JSON ({e.msg}, line {e.lineno})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise bad('has no "files" mapping of file name -> {"size", "sha256"}')
    step = manifest.get("step")
    if type(step) is not int or step != int(path.name[5:]):
        raise bad(f"says step {step!r}, the directory is {path.name}")
    if STATE not in files:
        raise bad(f"does not list {STATE}")
    entries = {}
    root = path.resolve()
    for name, meta in files.items():
        rel = PurePosixPath(name)
        if (
            rel.is_absolute()
            or ".." in rel.parts
            or not (root / rel).resolve().is_relative_to(root)
        ):
            raise bad(f"names {name!r}, outside the checkpoint directory")
        size = meta.get("size") if isinstance(meta, dict) else None
        sha = meta.get("sha256") if isinstance(meta, dict) else None
        if (
            type(size) is not int
            or size < 0
            or not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha))
        ):
            raise bad(f'entry {name!r} is not {{"size": bytes, "sha256": 64 hex digits}}')
        entries[name] = (size, sha)
    return entries


def verify_checkpoint(path: Path) -> None:
    """Raise CheckpointError unless the manifest is well formed and every file it lists is
    present, inside the checkpoint, of the listed size and sha256."""
    for name, (size, sha) in _manifest_entries(path).items():
        f = path / name
        try:
            if not f.is_file():
                raise CheckpointError(f"checkpoint {path}: file {name} is missing")
            if f.stat().st_size != size:
                raise CheckpointError(
                    f"checkpoint {path}: file {name} has {f.stat().st_size} "
                    f"bytes, manifest says {size} (truncated?)"
                )
            if _sha256(f) != sha:
                raise CheckpointError(f"checkpoint {path}: file {name} fails its sha256 check")
        except OSError as e:
            raise CheckpointError(f"checkpoint {path}: file {name}: {e.strerror}") from None
