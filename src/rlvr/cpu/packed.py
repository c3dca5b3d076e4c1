"""Pre-packed CPU matmul weights for decoding: oneDNN's blocked layout, packed once per rollout.

A decoding step multiplies a few dozen rows by every weight matrix of the model. At that shape
a plain `F.linear` (MKL sgemm) spends much of its time re-packing the weight into the kernel's
blocked layout on every call, and then reads it again. oneDNN can keep the weight in that layout:
`torch.ops.mkldnn._reorder_linear_weight` packs it once, `_linear_pointwise` multiplies with
it (what `torch.compile` emits for CPU linears). Measured on the bench/vs_trl.py model (2 threads,
32 rows): about 1.7x faster matmuls, 25-30% less generation time; packing the 4.25M-parameter
model costs ~7 ms, paid once per `generate` because the policy changes between rollouts.

The result differs from `F.linear` by float reassociation only (about 1e-6 relative): the same
tokens under greedy decoding, log-probs within 1e-5 (tested).

Only plain `nn.Linear` modules with ordinary CPU float32/bfloat16 weights are packed (a
DTensor under FSDP2, a CUDA tensor or a quantised layer keeps its own forward), and only
for the duration of the `with` block, under `no_grad`: `_linear_pointwise` has no backward.
With `compute_dtype=torch.bfloat16` it packs bf16 copies: the fast engine's bf16 sampling
(`model.autocast`) multiplies in bf16 and keeps the rest fp32; measured, CPU bf16 attention
under autocast is slower than fp32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

import rlvr.cpu.native as native

NATIVE_MAX_ROWS = 256  # up to here the native kernel matched or beat oneDNN (measured)
EPILOGUES = {"none": 0, "add": 1, "swish": 2, "mul": 3}  # oneDNN's post-op names

_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def packing_available() -> bool:
    """True where this torch build has oneDNN and the private packing ops."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
    )


def packable(module: nn.Module | None) -> bool:
    """A plain `nn.Linear` with an ordinary CPU float32/bfloat16 weight (what oneDNN packs)."""
    if type(module) is not nn.Linear:  # subclasses (quantised, LoRA-merged) keep their forward
        return False
    w = module.weight
    return (
        type(w) is nn.Parameter  # not a DTensor (FSDP2) or a quantised tensor subclass
        and w.device.type == "cpu"
        and w.dtype in _PACKABLE_DTYPES
        and (module.bias is None or module.bias.dtype == w.dtype)
    )


class Panels:
    """An (N, K) weight and its bias packed for the decoding-step kernel (`kernels/linear.c`),
    checked once here; a call checks only its input, as it runs every matmul of every step."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.N, self.K = weight.shape
        np_ = native.function("panel_width")()  # output columns per panel: 2 vectors' worth
        self.panels = torch.empty(-(-self.N // np_) * self.K * np_, dtype=torch.float32)
        native.function("pack_panels")(
            weight.data_ptr(), self.N, self.K, self.panels.data_ptr(), torch.get_num_threads()
        )
        self.bias = bias
        self._bias_ptr = 0 if bias is None else bias.data_ptr()
        self._fn = native.function("linear")

    def __call__(self, x: torch.Tensor, epilogue: str = "none", other=None) -> torch.Tensor | None:
        """`x @ W^T + bias`, then `epilogue` ("add" / "mul" `other`, "swish"), for contiguous
        fp32 CPU x (..., K) (and `other` shaped like the output); None where they do not fit."""
        if (
            x.dtype != torch.float32
            or x.device.type != "cpu"
            or not x.is_contiguous()
            or x.dim() == 0
            or x.shape[-1] != self.K
            or (epilogue in ("add", "mul")) != (other is not None)
        ):
            return None
        out_shape = (*x.shape[:-1], self.N)
        if other is not None and (
            other.shape != out_shape or not native.fp32_cpu(other) or not other.is_contiguous()
        ):
            return None
        y = torch.empty(out_shape, dtype=torch.float32)
        self._fn(
            x.data_ptr(), x.numel() // self.K, self.K, self.panels.data_ptr(), self.N,
            self._bias_ptr, EPILOGUES[epilogue], 0 if other is None else other.data_ptr(),
            y.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        return y


def pack_panels(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Panels | None:
    """An (N, K) fp32 CPU weight (and (N,) bias) packed for the decoding-step kernel, or None
    where the kernels are off or they are not contiguous fp32 CPU tensors of those shapes."""
    if native.function("linear") is None or weight.dim() != 2 or not native.fp32_cpu(weight):
        return None
    if not weight.is_contiguous():
        return None
    if bias is not None and (
        bias.shape != (weight.shape[0],) or not native.fp32_cpu(bias) or not bias.is_contiguous()
    ):
        return None
    return Panels(weight, bias)


class PackedLinear:
    """`x -> x @ weight.T + bias` with `weight` packed once (see `packed_linears`).

    `binary(x, other, "add" | "mul")` fuses `y + other` / `y * other` and `unary(x, "swish")`
    fuses SiLU into the same call (what inductor emits for CPU linears): one op instead of two
    or three at decode shapes, where the ops' own overhead is most of the time. Both need `x`
    in the packed dtype (the lean decoder uses them in fp32 only).

    For decoding-sized calls (`rows_hint` <= `NATIVE_MAX_ROWS`) in fp32 the weight is packed
    into `Panels` for the native decode-step kernel (`kernels/linear.c`), with the same
    epilogues: measured on bench/vs_trl.py's decode shapes (32 rows, 2 threads) 9-38% less time per
    matmul than oneDNN's, whose ~15 us of per-call setup dominates small matmuls, and it packs
    in a third of the time. Elsewhere (larger calls, bf16, the kernels off) oneDNN."""

    def __init__(self, weight, bias, rows_hint: int = 32, compute_dtype=None):
        self.weight, self.bias_full = weight.detach(), bias
        self.panels = None
        if compute_dtype is None and rows_hint <= NATIVE_MAX_ROWS:
            b = None if bias is None else bias.detach().contiguous()
            self.panels = pack_panels(self.weight.contiguous(), b)
        if self.panels is not None:
            self.bias, self.packed = self.panels.bias, None
            return
        w_c = self.weight if compute_dtype is None else self.weight.to(compute_dtype)
        self.bias = None if bias is None else bias.detach().to(w_c.dtype)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w_c, max(1, rows_hint))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.panels is not None:
            return self._native(x, "none")
        packed = self.packed
        if x.dtype == packed.dtype:
            return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")
        if x.dtype == self.weight.dtype:  # a lower compute dtype: cast in, multiply, cast back
            y = torch.ops.mkldnn._linear_pointwise(
                x.to(packed.dtype), packed, self.bias, "none", [], ""
            )
            return y.to(x.dtype)
        return nn.functional.linear(x, self.weight, self.bias_full)  # e.g. fp32 into bf16

    def unary(self, x: torch.Tensor, attr: str) -> torch.Tensor:
        if self.panels is not None:
            return self._native(x, attr)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, attr, [], "")

    def binary(self, x: torch.Tensor, other: torch.Tensor, attr: str) -> torch.Tensor:
        if self.panels is not None:
            return self._native(x, attr, other)
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.packed, self.bias, attr)

    def _native(self, x, epilogue: str, other=None) -> torch.Tensor:
        y = self.panels(x, epilogue, other)
        if y is not None:
            return y
        y = nn.functional.linear(x, self.weight, self.bias_full)  # what the kernel won't read
        if epilogue == "swish":
            return nn.functional.silu(y)
        return y + other if epilogue == "add" else y * other if epilogue == "mul" else y


def pack_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    rows_hint: int = 32,
    compute_dtype: torch.dtype | None = None,
) -> PackedLinear:
    """`x -> x @ weight.T + bias` with `weight` packed now (see `packed_linears`)."""
    return PackedLinear(weight, bias, rows_hint, compute_dtype)


@contextlib.contextmanager
def packed_linears(
    model: nn.Module, rows_hint: int = 32, compute_dtype: torch.dtype | None = None
) -> Iterator[int]:
    """Within the block, every packable `nn.Linear` of `model` multiplies with a packed copy
    of its current weight; yields how many were packed. `rows_hint` is the expected number of
    rows per call (oneDNN picks its blocking from it; any row count works). `compute_dtype`
    (bfloat16) packs copies in that dtype: inputs are cast to it and outputs back, so only the
    matmuls run in it (oneDNN accumulates in fp32)."""
    if not packing_available():
        yield 0
        return
    patched: list[nn.Module] = []
    try:
        with torch.no_grad():
            for module in model.modules():
                if not packable(module):
                    continue
                # an instance attribute: shadows the class's forward until deleted
                module.forward = pack_linear(module.weight, module.bias, rows_hint, compute_dtype)
                patched.append(module)
        yield len(patched)
    finally:
        for module in patched:
            del module.forward  # back to the class's forward
