"""Rollout engines: prompts in, a `Rollout` (ids, lengths, truncation flags) out. `ENGINES`
names them; `build_engine` builds the one a config names (`registry.py`)."""

from rlvr.rollout.base import (
    EngineDefaults,
    EngineError,
    EngineSite,
    Rollout,
    RolloutEngine,
    SamplingParams,
    decode_completions,
    dedupe,
    derive_seed,
    left_pad,
    lengths_from_eos,
)
from rlvr.rollout.fast import FastEngine
from rlvr.rollout.hf import HFEngine
from rlvr.rollout.registry import ENGINES, build_engine, longest_sequence
from rlvr.rollout.vllm import VLLMEngine  # imports vllm only when constructed

__all__ = [
    "ENGINES",
    "EngineDefaults",
    "EngineError",
    "EngineSite",
    "FastEngine",
    "HFEngine",
    "Rollout",
    "RolloutEngine",
    "SamplingParams",
    "VLLMEngine",
    "build_engine",
    "decode_completions",
    "dedupe",
    "derive_seed",
    "left_pad",
    "lengths_from_eos",
    "longest_sequence",
]
