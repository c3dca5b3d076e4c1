"""The fast engine's CPU decoding paths for one rollout, behind the backend's gate.

`rlvr.rollout.fast` runs the same loop on every device: each distinct prompt prefilled once,
a preallocated cache, one token per live row per step. On an fp32 CPU model
(`rlvr.cpu.enabled`) a `CpuDecoding` adds, where the model is the plain piece each was
written for:

- packed linear weights for the modules' forwards (`rlvr.cpu.packed`);
- the prompt's keys and values kept once per group and read by all its samples
  (`rlvr.cpu.prefix_attention`) instead of copied to each;
- the lean decoding step on fused packed weights (`rlvr.cpu.lean`) instead of the modules;
- the C sampler (`rlvr.cpu.native.sample`) for plain temperature sampling.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

import rlvr.cpu.native as native
from rlvr.cpu.lean import LeanDecoder
from rlvr.cpu.packed import packed_linears, packing_available
from rlvr.cpu.prefix_attention import (
    PrefixLayer,
    PrefixLayout,
    prefix_decoding,
    supports_prefix_attention,
)


class CpuDecoding:
    """What one rollout's decoding uses of the backend (see the module doc). Built before
    the rollout's `torch.no_grad` and autocast blocks are entered by the engine: under bf16
    autocast the decode matmuls run from bf16 packed copies (`compute_dtype`) and the engine
    lifts autocast for the rest (measured, CPU attention in bf16 is slower than in fp32, and
    casting the KV cache every step costs more again)."""

    def __init__(self, model: nn.Module, *, pack_weights: bool, prefix_attention: bool, lean: bool):
        self.model = model
        self.packs = pack_weights and packing_available()
        self.prefix = prefix_attention and supports_prefix_attention(model)
        self.want_lean = lean and self.packs
        bf16 = (
            torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        )
        self.compute_dtype = torch.bfloat16 if bf16 and self.packs else None
        self.layout: PrefixLayout | None = None
        self.lean: LeanDecoder | None = None

    def prepare(
        self, cache, rows: int, max_new_tokens: int, plain_layers: bool
    ) -> contextlib.AbstractContextManager:
        """Before the prefill: prefix layers in `cache` where prefix attention applies (every
        layer plain full attention: `plain_layers`), the lean decoder with them. Returns the
        block within which the modules' forwards multiply with packed weights: not in fp32
        with a lean decoder, where the modules run only the prefill, which packing ~30
        weights (~10 ms) does not pay for."""
        if self.prefix and plain_layers:
            cache.layers = [PrefixLayer(max_new_tokens) for _ in cache.layers]
            if self.want_lean:
                self.lean = LeanDecoder.build(self.model, rows, self.compute_dtype)
        if not self.packs or (self.lean is not None and self.compute_dtype is None):
            return contextlib.nullcontext()
        return packed_linears(self.model, rows, compute_dtype=self.compute_dtype)

    def keep_prompts_once(self, cache, prompt_mask: torch.Tensor, expand: torch.Tensor) -> bool:
        """After the prefill: True where the prompts stay once per prefill row (the layout
        maps each response row to its prompt); False where the caller copies them."""
        if not isinstance(cache.layers[0], PrefixLayer):
            return False
        self.layout = PrefixLayout.build(cache.layers, prompt_mask, expand)
        return True

    def attending(self) -> contextlib.AbstractContextManager:
        """The block of decoding steps: prefix attention over the layout, where there is one."""
        if self.layout is None:
            return contextlib.nullcontext()
        return prefix_decoding(self.model, self.layout)

    def retire(self, keep: torch.Tensor) -> None:
        """Rows `keep` stay live."""
        if self.layout is not None:
            self.layout.select(keep)

    def step(self, tokens, positions, cache) -> torch.Tensor | None:
        """The next-token logits from the lean step, or None where the modules decode."""
        return None if self.lean is None else self.lean.step(tokens, positions, cache)

    @staticmethod
    def sample(
        logits: torch.Tensor, temperature: float, suppress: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Plain temperature sampling as one C pass (tokens and their log-probs), or None
        where the kernels are off or the logits do not fit (see `native.sample`)."""
        return native.sample(logits, temperature, suppress)
