"""Masked attention for the training and log-prob forwards on CPU, as one native pass each way.

GRPO's forwards attend over left-padded prompts and, with `optim.share_prompt`, over a prompt
cache that the completions continue: the mask is never plain causal, so torch's CPU
flash-attention kernel gets an explicit mask and computes every query against every key,
the masked causal half included, one small BLAS call per block. Measured on bench/vs_trl.py's
shapes (32 rows, 4 heads of 64, 63 queries over 110 keys, 2 threads) that was ~8% of a
training step. `kernels/attention.c` stops each query block at its last visible key and runs
the products as register-blocked loops (see its header); the backward recomputes the
probabilities from the saved log-sum-exp, as FlashAttention-2 does.

It plugs into Hugging Face models through their attention registry (`AttentionInterface`,
name "rlvr_attention", with SDPA's mask builder; registered on the first switch, not at
import): `native_attention(model)` switches a
Llama-family model that uses SDPA to it for the duration of a block. Anything the kernel does
not cover (not fp32 on the CPU, head sizes other than 32/64/128, dropout, a float mask, the
native kernels off) is handed to SDPA unchanged. Same math as SDPA up to float reassociation
(tested: outputs and q/k/v gradients within 1e-5, and whole-model logits and gradients).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

import rlvr.cpu.native as native
from rlvr.cpu.layers import is_llama_family

NAME = "rlvr_attention"
HEAD_SIZES = (32, 64, 128)  # the kernel's compile-time row widths
# Per-thread scratch of the backward (keys and values transposed, their gradient sums, a chunk
# of probabilities) grows with the keys: past this much over all threads, SDPA instead.
SCRATCH_BUDGET = 1 << 30


def _scratch_bytes(Lk: int, D: int) -> int:
    """All threads' scratch for Lk keys of width D, as the kernel sizes it."""
    return torch.get_num_threads() * native.function("attention_scratch_bytes")(Lk, D)


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, position) strides of a 4-D tensor; a size-1 dim reads as stride 0."""
    return tuple(0 if x.shape[i] == 1 else x.stride(i) for i in range(3))


def _call_args(q, k, v, mask):
    """What both kernels take first: the tensors' addresses, sizes and strides (the two int64
    arrays are returned too, so the caller holds them through the call)."""
    B, Hq, Lq, D = q.shape
    dims = torch.tensor([B, Hq, k.shape[1], Lq, k.shape[2], D], dtype=torch.int64)
    mask_strides = (0, 0, 0) if mask is None else _strides(mask)
    strides = torch.tensor(
        [*_strides(q), *_strides(k), *_strides(v), *mask_strides], dtype=torch.int64
    )
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), 0 if mask is None else mask.data_ptr())
    return (*ptrs, dims.data_ptr(), strides.data_ptr()), (dims, strides)


class _Attention(torch.autograd.Function):
    """out (B, Lq, Hq, D) = softmax(scale q k^T masked) v for q (B, Hq, Lq, D), k/v (B, Hkv,
    Lk, D); `mask` a bool (B or 1, Hq or 1, Lq, Lk) tensor or None (`causal` then)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal: bool, scale: float):
        B, Hq, Lq, D = q.shape
        out = q.new_empty(B, Lq, Hq, D)
        lse = q.new_empty(B, Hq, Lq)
        args, keep = _call_args(q, k, v, mask)
        threads = torch.get_num_threads()
        rc = native.function("attention_fwd")(
            *args, int(causal), scale, out.data_ptr(), lse.data_ptr(), threads
        )
        del keep
        if rc != 0:
            raise MemoryError("rlvr attention: no memory for the kernel's scratch buffers")
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, mask, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        dq = torch.empty(q.shape, dtype=q.dtype)
        dk, dv = torch.empty(k.shape, dtype=k.dtype), torch.empty(v.shape, dtype=v.dtype)
        args, keep = _call_args(q, k, v, mask)
        rc = native.function("attention_bwd")(
            *args,
            int(ctx.causal),
            ctx.scale,
            *(out.data_ptr(), dout.data_ptr(), lse.data_ptr()),
            *(dq.data_ptr(), dk.data_ptr(), dv.data_ptr()),
            torch.get_num_threads(),
        )
        del keep
        if rc != 0:
            raise MemoryError("rlvr attention: no memory for the kernel's scratch buffers")
        return dq, dk, dv, None, None, None


def fits(q, k, v, mask) -> bool:
    """Whether the kernel (built and on) reads these: fp32 CPU q (B, Hq, Lq, D), k and v
    (B, Hkv, Lk, D), D in HEAD_SIZES, Hq a multiple of Hkv, unit stride over D, keys few enough
    for the scratch budget; mask None or a bool (B | 1, Hq | 1, Lq, Lk) tensor with unit stride
    over keys."""
    if not native.available():
        return False
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        return False
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    if D not in HEAD_SIZES or k.shape[0] != B or k.shape[3] != D or Hq % Hkv or Lk == 0:
        return False
    if _scratch_bytes(Lk, D) > SCRATCH_BUDGET:  # very long keys on many threads
        return False
    tensors = (q, k, v)
    if not all(x.dtype == torch.float32 and x.device.type == "cpu" for x in tensors):
        return False
    if any(x.stride(3) != 1 for x in tensors):
        return False
    if mask is None:
        return True
    return (
        mask.dtype == torch.bool
        and mask.device.type == "cpu"
        and mask.dim() == 4
        and mask.shape[0] in (1, B)
        and mask.shape[1] in (1, Hq)
        and mask.shape[2:] == (Lq, Lk)
        and mask.stride(3) == 1
    )


def attention(q, k, v, mask, *, causal: bool, scale: float) -> torch.Tensor | None:
    """The native attention (B, Lq, Hq, D), or None where it does not apply (see `fits`)."""
    if not fits(q, k, v, mask):
        return None
    return _Attention.apply(q, k, v, mask, causal, scale)


def rlvr_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The attention-registry function: the native pass where it applies, SDPA otherwise,
    with SDPA's reading of the arguments (mask None: causal when more than one query)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = query.shape[2] > 1 and attention_mask is None and causal
    plain = not any(kwargs.get(k) for k in ("position_bias", "softcap", "output_attentions"))
    if dropout == 0.0 and plain:
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = attention(query, key, value, attention_mask, causal=causal, scale=scale)
        if out is not None:
            return out, None
    return sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        **kwargs,
    )


def _register() -> None:
    """Adds `rlvr_attention` (and SDPA's mask builder under its name) to transformers'
    registries when a model is switched to it (idempotent): importing this module changes
    nothing."""
    AttentionInterface.register(NAME, rlvr_attention)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


@contextlib.contextmanager
def native_attention(model: torch.nn.Module) -> Iterator[bool]:
    """Within the block a Llama-family `model` on the CPU that uses SDPA attends with
    `rlvr_attention`; yields whether it was switched (not for other families, attention
    implementations or devices, nor with the native kernels off)."""
    config = getattr(model, "config", None)
    param = next(model.parameters(), None)
    switch = (
        native.available()
        and is_llama_family(model)
        and getattr(config, "_attn_implementation", None) == "sdpa"
        and param is not None
        and param.device.type == "cpu"
    )
    if not switch:
        yield False
        return
    _register()
    config._attn_implementation = NAME
    try:
        yield True
    finally:
        config._attn_implementation = "sdpa"
