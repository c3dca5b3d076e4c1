"""RMSNorm, the SiLU-gated MLP product and RoPE as single native passes, forward and backward.

In the training forward of a small model on CPU, the Llama family's RMSNorm (six eager ops,
twice as many in its backward) and `silu(gate) * up` (three, and their backward) stream the
activations through memory again and again: measured on bench/vs_trl.py's model, ~10% of a training
step. `fused_ops(model)` swaps, for the duration of a `with` block, each plain RMSNorm's and
SiLU MLP's forward for autograd functions whose forward and backward are one pass each of
`rlvr.cpu.native`'s C kernels. Same math, float reassociation only (tested against the
modules' outputs and gradients within 1e-5).

Only what the kernels read is swapped: fp32 CPU inputs and plain `nn.Parameter` weights (not
FSDP2's DTensors, not under bf16 autocast, where a bf16 input arrives); anything else calls the
module's own forward. With the native kernels off (`rlvr.cpu.native.status()`), nothing is
swapped.

RoPE (`q * cos + rotate_half(q) * sin`, four to six eager ops per tensor and as many again in
the backward) is a module-level function that the Llama family's attention forwards call by
name, `apply_rotary_pos_emb` in their modeling module; for the block, that name points to a
version that runs `rope_fwd` / `rope_bwd` on fp32 CPU tensors of the layout the attention
forward makes (and the original on anything else), and is put back after.

The attention itself, where the model uses SDPA, runs `rlvr.cpu.attention`'s native pass for the
block too (the same switch of the model's attention implementation that the fast engine's
decoding makes).

`pack_frozen_linears` is for the frozen reference copy: its fp32 linears multiply with
oneDNN-packed weights made once for the run (`rlvr.cpu.packed`). On this CPU (AMD Zen 4,
2 threads) oneDNN's fp32 kernels ran at ~220 GFLOP/s against MKL's ~198 at 2,016 rows and
~1.7x MKL at 188 (a prompt pass): the reference forward of bench/vs_trl.py's step takes ~116 ms
with them, ~129 ms without (medians of 3 alternating runs). The policy's weights are not packed:
they change every step, and packing them anew for each training forward (~0.27 ms a weight)
costs what the faster matmuls save.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch
from torch import nn

import rlvr.cpu.native as native
from rlvr.cpu.attention import native_attention
from rlvr.cpu.layers import is_llama_family, is_silu_mlp, rms_norm_eps
from rlvr.cpu.packed import PackedLinear, pack_linear, packable, packing_available
from rlvr.models import unwrap_model


def _fits(*tensors: torch.Tensor) -> bool:
    return all(
        t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors
    )


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        d = x.shape[-1]
        n = x.numel() // d
        y, r = torch.empty_like(x), torch.empty(n, dtype=torch.float32)
        threads = torch.get_num_threads()
        native.function("rms_norm_fwd")(
            x.data_ptr(), weight.data_ptr(), n, d, eps, y.data_ptr(), r.data_ptr(), threads
        )
        ctx.save_for_backward(x, weight, r)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, r = ctx.saved_tensors
        dy = dy.contiguous()
        d = x.shape[-1]
        n = x.numel() // d
        threads = torch.get_num_threads()
        dx, dw = torch.empty_like(x), torch.empty_like(weight)
        part = torch.empty(threads * d, dtype=torch.float32)
        native.function("rms_norm_bwd")(
            dy.data_ptr(),
            x.data_ptr(),
            weight.data_ptr(),
            r.data_ptr(),
            n,
            d,
            dx.data_ptr(),
            dw.data_ptr(),
            part.data_ptr(),
            threads,
        )
        return dx, dw, None


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(gate)
        native.function("silu_mul_fwd")(
            gate.data_ptr(), up.data_ptr(), gate.numel(), y.data_ptr(), torch.get_num_threads()
        )
        ctx.save_for_backward(gate, up)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        gate, up = ctx.saved_tensors
        dy = dy.contiguous()
        dg, du = torch.empty_like(gate), torch.empty_like(up)
        native.function("silu_mul_bwd")(
            dy.data_ptr(),
            gate.data_ptr(),
            up.data_ptr(),
            gate.numel(),
            dg.data_ptr(),
            du.data_ptr(),
            torch.get_num_threads(),
        )
        return dg, du


class _Rope(torch.autograd.Function):
    """x: (B, H, T, D), a transposed view of a contiguous (B, T, H, D) buffer (the layout the
    attention forward's `.view(...).transpose(1, 2)` makes); cos, sin: (B, T, D)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _rope_pass("rope_fwd", x, cos, sin)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        cos, sin = ctx.saved_tensors
        return _rope_pass("rope_bwd", dy, cos, sin), None, None


def _rope_pass(kernel: str, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """One native pass over (B, H, T, D) `x` read as (B, T, H, D) rows; the result in the
    layout the eager ops would have returned (a transposed view of a contiguous buffer)."""
    B, H, T, D = x.shape
    rows = x.transpose(1, 2).contiguous()  # no copy for the attention forward's layout
    out = torch.empty_like(rows)
    native.function(kernel)(
        rows.data_ptr(), cos.data_ptr(), sin.data_ptr(), B * T, H, D, out.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    return out.transpose(1, 2)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """`x * cos + rotate_half(x) * sin` (cos, sin broadcast over the heads of a (B, H, T, D)
    x) as one native pass with its backward, or None where the tensors do not fit: x must be
    the transposed view of a contiguous (B, T, H, D) fp32 CPU buffer, cos and sin contiguous
    (B, T, D) fp32 without grad (they come from positions, not from parameters)."""
    if not native.available() or x.dim() != 4 or x.shape[-1] % 2:
        return None
    B, _, T, D = x.shape
    return (
        _Rope.apply(x, cos, sin)
        if (
            cos.shape == sin.shape == (B, T, D)
            and _fits(cos, sin)
            and not (cos.requires_grad or sin.requires_grad)
            and x.dtype == torch.float32
            and x.device.type == "cpu"
            and x.transpose(1, 2).is_contiguous()
        )
        else None
    )


def _rope_function(original):
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if not args and not kwargs:  # the default unsqueeze_dim=1: heads on dim 1
            q_embed, k_embed = rope(q, cos, sin), rope(k, cos, sin)
            if q_embed is not None and k_embed is not None:
                return q_embed, k_embed
        return original(q, k, cos, sin, *args, **kwargs)

    apply_rotary_pos_emb.rlvr_original = original
    return apply_rotary_pos_emb


def _patch_rope(model: nn.Module) -> list:
    """Point `apply_rotary_pos_emb` of the model's Llama-family modeling modules to the native
    version; returns the modules patched (see `_unpatch_rope`)."""
    patched = []
    for m in model.modules():
        # a Llama-family attention module: its modeling module applies the RoPE
        if not is_llama_family(m) or not hasattr(m, "q_proj"):
            continue
        module = sys.modules.get(type(m).__module__)
        fn = getattr(module, "apply_rotary_pos_emb", None)
        if fn is None or hasattr(fn, "rlvr_original"):  # absent, or already ours
            continue
        module.apply_rotary_pos_emb = _rope_function(fn)
        patched.append(module)
    return patched


def _unpatch_rope(modules: list) -> None:
    for module in modules:
        module.apply_rotary_pos_emb = module.apply_rotary_pos_emb.rlvr_original


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """`weight * x / sqrt(mean(x^2, -1) + eps)` as one native pass (with its backward), or
    None where the tensors or the kernels do not allow it."""
    if not native.available() or not _fits(x, weight):
        return None
    if weight.shape != (x.shape[-1],):
        return None
    return _RMSNorm.apply(x, weight, eps)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """`silu(gate) * up` as one native pass (with its backward), or None."""
    if not native.available() or not _fits(gate, up):
        return None
    if gate.shape != up.shape:
        return None
    return _SiluMul.apply(gate, up)


def pack_frozen_linears(model: nn.Module) -> int:
    """For a model whose weights never change again (the frozen reference copy): each plain
    fp32 CPU `nn.Linear` without grad multiplies with a oneDNN-packed copy of its weight, made
    now and kept, at the cost of one more copy of those weights in memory (packed anew for
    each forward, as weights that change every step would need, it did not pay). Under
    autocast, for other dtypes and where a gradient is wanted, the module's own forward runs.
    Returns how many."""
    if not packing_available():
        return 0
    count = 0
    with torch.no_grad():
        for m in model.modules():
            if (
                packable(m)
                and m.weight.dtype == torch.float32
                and not m.weight.requires_grad
                and "forward" not in m.__dict__
            ):
                m.forward = _frozen_forward(m, pack_linear(m.weight, m.bias, rows_hint=2048))
                count += 1
    return count


def _frozen_forward(module: nn.Linear, packed: PackedLinear):
    own = type(module).forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if (
            x.dtype != torch.float32
            or x.device.type != "cpu"
            or torch.is_autocast_enabled("cpu")
            or (torch.is_grad_enabled() and x.requires_grad)
        ):
            return own(module, x)
        return packed(x)

    return forward


def _plain(p) -> bool:
    return type(p) is nn.Parameter and p.dtype == torch.float32 and p.device.type == "cpu"


def _norm_forward(module: nn.Module):
    own = type(module).forward
    eps = rms_norm_eps(module)

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = rms_norm(x, module.weight, eps)
        return own(module, x) if y is None else y

    return forward


def _mlp_forward(module: nn.Module):
    def forward(x: torch.Tensor) -> torch.Tensor:
        gate, up = module.gate_proj(x), module.up_proj(x)
        y = silu_mul(gate, up)
        if y is None:  # the module's own math (Llama family: down(act(gate) * up))
            return module.down_proj(module.act_fn(gate) * up)
        return module.down_proj(y)

    return forward


def _is_plain_norm(m: nn.Module) -> bool:
    return rms_norm_eps(m) is not None and _plain(m.weight)


@contextlib.contextmanager
def fused_ops(model: nn.Module) -> Iterator[int]:
    """Within the block, the plain RMSNorms and SiLU MLPs of `model`, and the RoPE of its
    Llama-family attention, run the native passes (see the module doc), and so does its
    attention where it uses SDPA (`rlvr.cpu.attention`); yields how many modules were swapped."""
    if not native.available():
        yield 0
        return
    patched: list[nn.Module] = []
    rope_modules = _patch_rope(model)
    try:
        with native_attention(unwrap_model(model)):
            yield _swap_modules(model, patched)
    finally:
        for m in patched:
            del m.forward
        _unpatch_rope(rope_modules)


def _swap_modules(model: nn.Module, patched: list[nn.Module]) -> int:
    """Points the plain norms' and MLPs' forwards to the native versions, recording each
    module in `patched` (undone by deleting the instance attribute); returns how many."""
    for m in model.modules():
        if "forward" in m.__dict__:  # already swapped (packed weights, a hook): leave it
            continue
        if _is_plain_norm(m):
            m.forward = _norm_forward(m)
        elif is_silu_mlp(m):
            m.forward = _mlp_forward(m)
        else:
            continue
        patched.append(m)
    return len(patched)
