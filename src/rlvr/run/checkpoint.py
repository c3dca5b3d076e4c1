"""Atomic checkpoints: written whole or not at all, verified before use.

A checkpoint is a directory `checkpoints/step-000012/` holding the policy in Hugging Face
format (`save_pretrained`, so it loads anywhere as a model), the tokenizer, `trainer_state.pt`
(optimiser, scheduler, step, sampler position, RNG states, metrics needed to continue) and
`manifest.json` (size and sha256 of every file). It is written under a temporary name,
every file and the directory fsynced, then renamed into place: a crash mid-save leaves a
`.tmp-*` directory that is never mistaken for a checkpoint and is removed on the next save.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch

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


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fault_point(name: str) -> None:
    """Fault injection for the crash tests: RLVR_FAULT=save:N SIGKILLs this process the N-th
    time it reaches point `save`. Unset in normal use, and then a no-op."""
    spec = os.environ.get("RLVR_FAULT", "")
    if not spec.startswith(name + ":"):
        return
    global _fault_hits
    _fault_hits += 1
    if _fault_hits == int(spec.split(":", 1)[1]):
        os.kill(os.getpid(), signal.SIGKILL)


_fault_hits = 0


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: Path,
    step: int,
    model,
    tokenizer,
    trainer_state: dict[str, Any],
    *,
    keep: int,
    model_state: dict[str, Any] | None = None,
) -> Path:
    """Write checkpoint `step` atomically and keep the newest `keep` checkpoints.
    `model_state`: the full weights when the live model holds only a shard (FSDP2)."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    model.save_pretrained(tmp, safe_serialization=True, state_dict=model_state)
    _fault_point("save")  # tests kill the process here: mid-save, the model written, no manifest
    tokenizer.save_pretrained(tmp)
    torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / STATE)
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {
        "step": step,
        "files": {
            str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files
        },
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    for p in [*files, tmp / MANIFEST]:
        _fsync(p)
    _fsync(tmp)
    if final.exists():  # a re-save of the same step (e.g. resumed, then stopped at once)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint directories, oldest first (temporary ones excluded)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if p.is_dir())


def verify_checkpoint(path: Path) -> None:
    """Raise CheckpointError unless every file of the manifest is present, sized and hashed."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no {MANIFEST} (incomplete save)")
    try:
        manifest = json.loads(manifest_path.read_text())
        entries = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path}: unreadable {MANIFEST} ({e})") from None
    for name, meta in entries.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: file {name} is missing")
        if f.stat().st_size != meta["size"]:
            raise CheckpointError(
                f"checkpoint {path}: file {name} has {f.stat().st_size} "
                f"bytes, manifest says {meta['size']} (truncated?)"
            )
        if _sha256(f) != meta["sha256"]:
            raise CheckpointError(f"checkpoint {path}: file {name} fails its sha256 check")


def latest_good_checkpoint(run_dir: Path, warn=print) -> Path | None:
    """The newest checkpoint that verifies; each refused one is reported through `warn`."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as e:
            warn(f"refusing {e}; trying the previous checkpoint")
    return None


def load_trainer_state(path: Path) -> dict[str, Any]:
    return torch.load(path / STATE, map_location="cpu", weights_only=False)
