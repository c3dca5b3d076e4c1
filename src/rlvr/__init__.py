"""rlvr: reinforcement learning from verifiable rewards (GRPO, DAPO and neighbours).

The Python API: `rlvr.train(model=..., reward_funcs=..., train_dataset=..., ...)` returns a
`TrainResult` (`.run_dir`, `.summary`, `.metrics`, `.model`); `rlvr.Trainer(...).train()` is
the same as an object. The training loop itself is the package `rlvr.training`.
"""

from rlvr.api.trainer import Trainer, TrainResult, train
from rlvr.rewards.combine import RESERVED_KWARGS

__version__ = "0.1.0"
__all__ = ["RESERVED_KWARGS", "TrainResult", "Trainer", "train"]
