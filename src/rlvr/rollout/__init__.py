"""Rollout engines: prompts in, a `Rollout` (ids, lengths, truncation flags) out."""

from rlvr.rollout.base import (
    Rollout,
    RolloutEngine,
    SamplingParams,
    derive_seed,
    lengths_from_eos,
)
from rlvr.rollout.fast import FastEngine
from rlvr.rollout.hf import HFEngine, left_pad

ENGINES = {"hf": HFEngine, "fast": FastEngine}

__all__ = [
    "ENGINES",
    "HFEngine",
    "Rollout",
    "RolloutEngine",
    "SamplingParams",
    "derive_seed",
    "left_pad",
    "lengths_from_eos",
]
