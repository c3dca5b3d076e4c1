"""rlvr: reinforcement learning from verifiable rewards (GRPO, DAPO and neighbours).

The Python API: `rlvr.train(model=..., reward_funcs=..., train_dataset=..., ...)` returns a
`TrainResult` (`.run_dir`, `.summary`, `.metrics`, `.model`); `rlvr.Trainer(...).train()` is
the same as an object. `rlvr.train` is the package of the training loop made callable, so
`rlvr.train.trainer` and the other submodules import as usual.
"""

from rlvr import train
from rlvr.api import Trainer, TrainResult
from rlvr.rewards.combine import RESERVED_KWARGS

__version__ = "0.1.0"
__all__ = ["RESERVED_KWARGS", "TrainResult", "Trainer", "train"]
