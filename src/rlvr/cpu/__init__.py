"""The optional CPU speed backend: C kernels (`native`, built on first use), packed linear
weights (`packed`), the lean decoder and the shared-prefix decode attention (`lean`,
`prefix_attention`, put together for a rollout by `decoding`), the training forwards' native
attention, RMSNorm, SiLU-gate and RoPE passes (`attention`, `fused`), and malloc tuning
(`allocator`).

One gate, decided once per run when it is set up: `enabled(model)` is true only for a model
whose weights are fp32 on the CPU. `backend(model)` turns that answer into a `Backend`, and the
trainer, the engines and the update reach the CPU code only through it: when it is off,
nothing is swapped, patched, packed, compiled or retuned, and none of the modules above is
even imported. Under bf16 autocast over fp32 weights the gate is on and each fast path
declines the bf16 inputs it does not read. `RLVR_NATIVE=0` or a missing C compiler turns off
only the C kernels; the torch-level paths (packed weights, the lean decoder, prefix attention
in torch ops) stay.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

OFF_REASON = "off: the model's weights are not fp32 on the CPU"


def enabled(model: torch.nn.Module) -> bool:
    """True only for a model whose floating-point weights are all fp32 on the CPU."""
    params = [p for p in model.parameters() if p.is_floating_point()]
    return bool(params) and all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params)


@dataclass(frozen=True)
class Backend:
    """The gate's answer for one run, and the only door to the CPU code (see the module doc).
    Off, every method is a no-op and every context an empty block."""

    on: bool

    def tune_malloc(self, memory_first: bool = False) -> str:
        """glibc malloc keeps freed memory for the next step, or with `memory_first` (gradient
        checkpointing) returns every freed tensor buffer at once (`rlvr.cpu.allocator`);
        returns "on...", or "off: <why>". The first call of a process decides."""
        if not self.on:
            return OFF_REASON
        import rlvr.cpu.allocator as allocator

        return allocator.return_freed_memory() if memory_first else allocator.keep_freed_memory()

    def kernels(self) -> str:
        """Whether the C kernels are built and on ("on" or "off: <why>"); builds them when
        the gate is on and they are not built yet."""
        if not self.on:
            return OFF_REASON
        import rlvr.cpu.native as native

        return native.status()

    def training_ops(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The block of a training or log-prob forward: native RMSNorm, SiLU-gate, RoPE and
        attention passes where they apply (`rlvr.cpu.fused.fused_ops`); yields how many
        modules were swapped."""
        if not self.on:
            return contextlib.nullcontext(0)
        from rlvr.cpu.fused import fused_ops

        return fused_ops(model)

    def pack_frozen(self, model: torch.nn.Module) -> int:
        """The frozen reference copy multiplies with weights packed once for the run
        (`rlvr.cpu.fused.pack_frozen_linears`); returns how many linears."""
        if not self.on:
            return 0
        from rlvr.cpu.fused import pack_frozen_linears

        return pack_frozen_linears(model)

    def decoding(
        self, model: torch.nn.Module, *, pack_weights: bool, prefix_attention: bool, lean: bool
    ):
        """A `rlvr.cpu.decoding.CpuDecoding` for one rollout of the fast engine, or None."""
        if not self.on:
            return None
        from rlvr.cpu.decoding import CpuDecoding

        return CpuDecoding(
            model, pack_weights=pack_weights, prefix_attention=prefix_attention, lean=lean
        )


OFF = Backend(False)


def backend(model: torch.nn.Module) -> Backend:
    """The gate for `model` (see `enabled`)."""
    return Backend(enabled(model))
