"""rlvr: reinforcement learning from verifiable rewards (GRPO, DAPO and neighbours).

The Python API: `rlvr.train(model=..., reward_funcs=..., train_dataset=..., ...)` returns a
`TrainResult` (`.run_dir`, `.summary`, `.metrics`, `.model`); `rlvr.Trainer(...).train()` is
the same as an object. The training loop itself is the package `rlvr.training`.

The names are loaded on first use (`import rlvr` imports neither torch nor transformers), so
the command line answers `--help` without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["RESERVED_KWARGS", "TrainResult", "Trainer", "train"]

if TYPE_CHECKING:
    from rlvr.api.trainer import Trainer, TrainResult, train
    from rlvr.rewards.combine import RESERVED_KWARGS


def __getattr__(name: str) -> Any:
    if name in ("train", "Trainer", "TrainResult"):
        from rlvr.api import trainer

        value = getattr(trainer, name)
    elif name == "RESERVED_KWARGS":
        from rlvr.rewards.combine import RESERVED_KWARGS as value
    else:
        raise AttributeError(f"module 'rlvr' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
