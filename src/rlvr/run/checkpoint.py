"""Atomic checkpoints: written whole or not at all, verified before use.

A checkpoint is a directory `checkpoints/step-000012/` holding the policy in Hugging Face
format (`save_pretrained`, so it loads anywhere as a model), the tokenizer, `trainer_state.pt`
(optimiser, scheduler, step, sampler position, RNG states, metrics needed to continue) and
`manifest.json` (size and sha256 of every file). It is written under a temporary name,
every file and the directory fsynced, then renamed into place: a crash mid-save leaves a
`.tmp-*` directory that is never mistaken for a checkpoint and is removed when the run
directory is next opened, or by the next save; a failed save (full disk) removes its own.

A checkpoint is used only when its manifest is well formed (a non-empty mapping of file
names inside the checkpoint to size and sha256, the trainer state listed, its step equal to
the directory's) and every file matches it. Older checkpoints are deleted only when `keep`
newer ones verify; a corrupt checkpoint is never deleted, only reported.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from rlvr.run.manifest import (
    MANIFEST,
    STATE,
    CheckpointError,
    verify_checkpoint,
    write_manifest,
)
from rlvr.run.private import narrow, private_dir
from rlvr.run.trainer_state import load_trainer_state, nonfinite_tensor  # noqa: F401 (re-exported)


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
    """The RNG states as tensors and plain values, which `load_trainer_state` reads without
    unpickling any class: numpy's MT19937 key as an int64 tensor instead of an ndarray."""
    kind, key, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, key, *rest = state["numpy"]
    key = key.numpy() if isinstance(key, torch.Tensor) else key
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), *rest))
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
    warn: Callable[[str], Any] | None = None,
) -> Path:
    """Write checkpoint `step` atomically, then apply the keep policy (`prune_checkpoints`).
    `model_state`: the full weights when the live model holds only a shard (FSDP2).

    A failed save (a full disk, a quota, an I/O error) removes its `.tmp-*` directory and
    raises CheckpointError naming the step, the path and, for a full disk, the space needed;
    the checkpoints already on disk are untouched. Weights or a trainer state holding NaN/inf
    are never saved (CheckpointError naming the tensor): every checkpoint the keep policy
    counts is finite, so it never deletes the last finite one for a broken newer one."""
    weights = model_state if model_state is not None else model.state_dict()
    bad = nonfinite_tensor(weights, "weights") or nonfinite_tensor(trainer_state, "trainer state")
    if bad is not None:
        last = list_checkpoints(run_dir)
        raise CheckpointError(
            f"checkpoint step {step}: {bad} holds NaN/inf; not saved (the newest checkpoint "
            f"on disk is {last[-1] if last else 'none'})"
        )
    root = private_dir(run_dir / "checkpoints")
    remove_staging(run_dir)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    try:
        _write(tmp, step, model, tokenizer, trainer_state, model_state)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, _WRITE_ERRORS) or _is_no_space(e):
            raise _save_error(e, step, root, model, trainer_state, model_state) from e
        raise
    if final.exists():  # a re-save of the same step (e.g. resumed, then stopped at once)
        reason = checkpoint_problem(final, trust_known=False)
        if reason is not None:  # superseded by the complete one just written
            (warn or _stderr)(f"replacing corrupt checkpoint {final} ({reason})")
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)
    _known[_identity(final)] = None
    prune_checkpoints(run_dir, keep, warn=warn or _stderr)
    return final


# what a failed write raises: the OS, torch.save ("file write failed"), safetensors
_WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)


def _write(tmp: Path, step: int, model, tokenizer, trainer_state, model_state) -> None:
    """The checkpoint's files in `tmp`, a directory made 0700 first: what the libraries
    create there at their own modes is narrowed to the owner's before it is renamed into
    place (rlvr.run.private)."""
    private_dir(tmp)
    model.save_pretrained(tmp, safe_serialization=True, state_dict=model_state)
    _fault_point("save")  # tests kill the process here: mid-save, the model written, no manifest
    tokenizer.save_pretrained(tmp)
    torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / STATE)
    for p in [*write_manifest(tmp, step), tmp / MANIFEST]:
        _fsync(p)
    narrow(tmp)
    _fsync(tmp)


def _is_no_space(e: BaseException) -> bool:
    """ENOSPC / EDQUOT anywhere in the exception chain, or in the text of a library's wrapped
    error (torch.save reports a full disk as RuntimeError "file write failed")."""
    chain: list[BaseException] = []
    while e is not None and e not in chain and len(chain) < 16:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return any(
        (isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT))
        or "No space left on device" in str(x)
        or "Disk quota exceeded" in str(x)
        for x in chain
    )


def _save_error(e, step, root, model, trainer_state, model_state) -> CheckpointError:
    free = shutil.disk_usage(root).free
    need = _estimated_size(model, trainer_state, model_state)
    # torch.save wraps a full disk in "file write failed": a save that failed with less free
    # space than the checkpoint needs is reported as a full disk
    if _is_no_space(e) or free < need:
        return CheckpointError(
            f"checkpoint step {step}: no space left on device at {root} "
            f"(need ~{_size(need)}, {_size(free)} free); the partial "
            "checkpoint was removed, the earlier ones are intact"
        )
    return CheckpointError(f"checkpoint step {step}: writing {root} failed: {e}")


def _size(n: int) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2**10:.0f} kB"


def _estimated_size(model, trainer_state: dict[str, Any], model_state) -> int:
    """Bytes of every tensor the checkpoint holds (weights, optimiser state): its size
    within the tokenizer files and a few kB of metadata."""
    state = model_state if model_state is not None else model.state_dict()
    return _tensor_bytes(state) + _tensor_bytes(trainer_state)


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def remove_staging(run_dir: Path) -> list[Path]:
    """Delete `.tmp-*` staging directories left by a save that crashed or ran out of disk.
    Call only while holding the run directory's lock (rlvr.run.rundir): a live run's save
    in progress is staged there too."""
    root = Path(run_dir) / "checkpoints"
    stale = sorted(root.glob(".tmp-*")) if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint directories `step-NNNNNN`, oldest first (temporary ones excluded)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(p.name[5:]))


_STEP_DIR = re.compile(r"step-\d+")


def prune_checkpoints(run_dir: Path, keep: int, warn: Callable[[str], Any] = print) -> None:
    """The keep policy: delete a checkpoint only when it verifies and `keep` newer verified
    checkpoints exist. A corrupt checkpoint is never deleted: it is left in place (resume
    skips it) and reported once, with the reason, through `warn`."""
    good = 0
    for path in reversed(list_checkpoints(run_dir)):
        reason = checkpoint_problem(path)
        if reason is not None:
            if path not in _reported:
                _reported.add(path)
                warn(f"keeping corrupt checkpoint {path} ({reason}); resume never uses it")
            continue
        good += 1
        if good > keep:
            shutil.rmtree(path, ignore_errors=True)
            _known.pop(_identity(path), None)


_reported: set[Path] = set()


def checkpoint_problem(path: Path, *, trust_known: bool = True) -> str | None:
    """None when `path` verifies, else why not. With `trust_known`, a checkpoint this process
    wrote or already verified is not hashed again (keyed by its manifest's inode, mtime and
    size), so each save's keep policy costs no more than the save."""
    key = _identity(path)
    if trust_known and key is not None and key in _known:
        return _known[key]
    try:
        verify_checkpoint(path)
        reason = None
    except CheckpointError as e:
        reason = str(e).removeprefix(f"checkpoint {path}: ")
    if key is not None:
        _known[key] = reason
    return reason


_known: dict[tuple, str | None] = {}  # manifest identity -> None (verified) or the reason


def _identity(path: Path) -> tuple | None:
    try:
        st = (path / MANIFEST).stat()
    except OSError:
        return None
    return (str(path), st.st_ino, st.st_mtime_ns, st.st_size)


def latest_good_checkpoint(run_dir: Path, warn=print) -> Path | None:
    """The newest checkpoint that verifies; each refused one is reported through `warn`."""
    return scan_checkpoints(run_dir, warn)[0]


def scan_checkpoints(run_dir: Path, warn=print) -> tuple[Path | None, list[str]]:
    """(the newest checkpoint that verifies or None, "step-N: reason" for each newer one
    refused); each refusal is also reported through `warn`."""
    refused = []
    for path in reversed(list_checkpoints(run_dir)):
        reason = checkpoint_problem(path, trust_known=False)
        if reason is None:
            return path, refused
        refused.append(f"{path.name}: {reason}")
        warn(f"refusing checkpoint {path} ({reason}); trying the previous checkpoint")
    return None, refused


def resume_checkpoint(run_dir: Path, save_every: int, warn=print) -> Path | None:
    """The checkpoint `--resume` continues from. None (start over from step 0) only when the
    run cannot have finished a checkpoint yet: no `step-*` directory, and no metrics past the
    first save (`train.save_every`; 0 = saves only at the end). Every other case without a
    verifiable checkpoint raises CheckpointError naming the run directory and each
    checkpoint's reason, and changes nothing on disk."""
    run_dir = Path(run_dir)
    found, refused = scan_checkpoints(run_dir, warn)
    if found is not None:
        return found
    if refused:
        raise CheckpointError(
            f"--resume {run_dir}: no checkpoint verifies ({'; '.join(refused)}); nothing was "
            "changed. Restore a checkpoint, or start a new run with another --output-dir"
        )
    last = last_logged_step(run_dir / "metrics.jsonl")
    if save_every and last > save_every:
        raise CheckpointError(
            f"--resume {run_dir}: metrics.jsonl reaches step {last} but checkpoints/ holds no "
            f"checkpoint (one is saved every {save_every} steps: were they deleted?); nothing "
            "was changed"
        )
    return None


def last_logged_step(path: Path) -> int:
    """The largest "step" among the complete lines of a metrics file (0 when none)."""
    if not path.is_file():
        return 0
    last = 0
    for line in path.read_bytes().split(b"\n"):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and type(row.get("step")) is int:
            last = max(last, row["step"])
    return last


def _stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
