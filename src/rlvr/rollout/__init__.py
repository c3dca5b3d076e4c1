"""Rollout engines: prompts in, a `Rollout` (ids, lengths, truncation flags) out."""

from rlvr.rollout.base import Rollout, RolloutEngine, SamplingParams, lengths_from_eos
from rlvr.rollout.fast import FastEngine
from rlvr.rollout.hf import HFEngine, left_pad

ENGINES = {"hf": HFEngine, "fast": FastEngine}

__all__ = [
    "ENGINES",
    "HFEngine",
    "Rollout",
    "RolloutEngine",
    "SamplingParams",
    "left_pad",
    "lengths_from_eos",
]
