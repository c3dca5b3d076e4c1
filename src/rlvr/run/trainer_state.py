"""Reading a checkpoint's `trainer_state.pt` without running code, and the NaN/inf check a
checkpoint's tensors pass before they are saved or trained on."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.run.manifest import STATE, CheckpointError

# What a trainer state may hold besides tensors and plain values: numpy's uint32 RNG key as
# written by checkpoints that stored it as an ndarray (an array of a fixed dtype, no code).
_NUMPY_ARRAY = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), np.empty(0).__reduce__()[0]]


def load_trainer_state(path: Path, required: tuple[str, ...] = ("step",)) -> dict[str, Any]:
    """`path`'s trainer state, read with `torch.load(weights_only=True)`: tensors, numbers,
    strings, lists, tuples and dicts only (plus numpy's RNG key array), so a state file
    written by someone else cannot run code when a run resumes from it (the manifest does not
    help there: whoever wrote the file wrote the manifest). Anything else, or a state without
    the keys in `required`, raises CheckpointError naming the file."""
    file = path / STATE
    try:
        with torch.serialization.safe_globals(_NUMPY_ARRAY):
            state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL (\S+) was not|but got <class '([^']+)'>", str(e))
        if found is None:
            why = re.search(r"WeightsUnpickler error: (.+)", str(e))
            raise CheckpointError(
                f"{file}: unreadable trainer state: {why.group(1)[:300] if why else _first_line(e)}"
            ) from None
        raise CheckpointError(
            f"{file}: refused: it holds an object of {found.group(1) or found.group(2)}; a "
            "trainer state may hold only tensors and plain values (it is loaded without running "
            "code)"
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        raise CheckpointError(f"{file}: unreadable trainer state: {_first_line(e)}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: expected a dict, got {type(state).__name__}")
    missing = [k for k in required if k not in state]
    if missing:
        raise CheckpointError(f"{file}: the trainer state has no {', '.join(map(repr, missing))}")
    bad = nonfinite_tensor(state, "trainer state")
    if bad is not None:  # training on it would make every later step NaN
        raise CheckpointError(
            f"{file}: {bad} holds NaN/inf; refusing to train on it (move {path.name} aside to "
            "resume from the checkpoint before it)"
        )
    return state


def nonfinite_tensor(obj: Any, where: str) -> str | None:
    """The path ("trainer state.optimizer.state.3.exp_avg") of the first floating-point tensor
    under `obj` (dicts, lists, tuples) holding NaN or inf, or None when all are finite."""
    if isinstance(obj, torch.Tensor):
        bad = obj.is_floating_point() and not bool(torch.isfinite(obj).all())
        return where if bad else None
    items = (
        obj.items()
        if isinstance(obj, dict)
        else enumerate(obj)
        if isinstance(obj, (list, tuple))
        else ()
    )
    for key, value in items:
        found = nonfinite_tensor(value, f"{where}.{key}")
        if found is not None:
            return found
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]
