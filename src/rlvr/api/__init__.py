"""The Python API, shaped after TRL's `GRPOTrainer`: `rlvr.train(...)` and `rlvr.Trainer`
(`trainer`), their arguments as an ordinary run's inputs (`inputs`), and TRL's `GRPOConfig`
and `peft.LoraConfig` as rlvr config changes (`trl`)."""

from rlvr.api.trainer import Trainer, TrainResult, train

__all__ = ["TrainResult", "Trainer", "train"]
