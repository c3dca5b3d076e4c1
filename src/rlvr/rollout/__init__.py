"""Rollout engines: prompts in, a `Rollout` (ids, lengths, truncation flags) out."""

from rlvr.rollout.base import (
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
from rlvr.rollout.vllm import VLLMEngine  # imports vllm only when constructed

ENGINES = {"hf": HFEngine, "fast": FastEngine, "vllm": VLLMEngine}

__all__ = [
    "ENGINES",
    "FastEngine",
    "HFEngine",
    "Rollout",
    "RolloutEngine",
    "SamplingParams",
    "VLLMEngine",
    "decode_completions",
    "dedupe",
    "derive_seed",
    "left_pad",
    "lengths_from_eos",
]
