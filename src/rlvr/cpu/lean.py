"""A lean decoding step for the Llama family (Llama, Qwen2, Qwen3, Mistral) on CPU.

A decoding step moves one token per row through the model. Through the Hugging Face modules
that is ~25 module calls per layer, each with its Python, hooks, shape bookkeeping and mask
plumbing: on a small model most of the step. This module runs the same layer math directly
on the model's own parameters with fewer, larger matmuls: q/k/v fused into one packed weight,
gate/up into another (`rlvr.cpu.packed`), RMSNorm as one `F.rms_norm`, the model's own
rotary module for cos/sin (any RoPE scaling it implements), and the shared-prefix attention
of `rlvr.cpu.prefix_attention` on the same cache. The prefill still runs the modules.

It is used only where every piece is the plain one it expects (`LeanDecoder.build` returns
None otherwise: LoRA-wrapped projections, unknown norms, other families), and it is tested
against the module path: same logits within 1e-5, same greedy tokens.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import rlvr.cpu.native as native
from rlvr.cpu.layers import is_llama_family, is_silu_mlp, rms_norm_eps
from rlvr.cpu.packed import pack_linear, packable, packing_available
from rlvr.cpu.prefix_attention import current_layout, prefix_attention


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class _Layer:
    """One decoder layer's packed matmuls, norms and sizes."""

    def __init__(self, layer: nn.Module, rows: int, compute_dtype):
        a, m = layer.self_attn, layer.mlp
        self.idx, self.scaling, self.D = a.layer_idx, a.scaling, a.head_dim
        self.Hq = a.q_proj.out_features // self.D  # from the weights, whatever the config says
        self.Hkv = a.k_proj.out_features // self.D

        def fused(*linears):
            w = torch.cat([lin.weight for lin in linears])
            if all(lin.bias is None for lin in linears):
                return pack_linear(w, None, rows, compute_dtype)
            b = torch.cat(  # a projection without a bias adds zeros
                [
                    lin.bias if lin.bias is not None else w.new_zeros(lin.out_features)
                    for lin in linears
                ]
            )
            return pack_linear(w, b, rows, compute_dtype)

        self.qkv = fused(a.q_proj, a.k_proj, a.v_proj)
        self.o = pack_linear(a.o_proj.weight, a.o_proj.bias, rows, compute_dtype)
        self.down = pack_linear(m.down_proj.weight, m.down_proj.bias, rows, compute_dtype)
        self.act = m.act_fn
        # fp32 with SiLU: the residual adds, SiLU and the gate product ride on the matmuls
        # as oneDNN post-ops (measured ~20% off the MLP at decode shapes); otherwise the
        # fused gate/up matmul and separate ops.
        self.post_ops = compute_dtype is None and is_silu_mlp(m)
        if self.post_ops:
            self.gate = pack_linear(m.gate_proj.weight, m.gate_proj.bias, rows)
            self.up = pack_linear(m.up_proj.weight, m.up_proj.bias, rows)
        else:
            self.gate_up = fused(m.gate_proj, m.up_proj)
        self.n1, self.n2 = _norm(layer.input_layernorm), _norm(layer.post_attention_layernorm)
        self.q_norm = _norm(getattr(a, "q_norm", None))  # Qwen3 only
        self.k_norm = _norm(getattr(a, "k_norm", None))
        self.module = a  # prefix_attention reads its layer_idx

    def _native_attention(self, qkv, cos, sin, cache) -> torch.Tensor | None:
        """RoPE, cache write and attention in one native call, or None where it can't run
        (no kernel, Qwen3's q/k norms, a layout the kernel does not read)."""
        lay = current_layout()
        if self.q_norm is not None or lay is None or not lay.native or not native.available():
            return None
        n, heads = qkv.shape[0], (self.Hq, self.Hkv, self.D)
        layer = cache.layers[self.idx]
        keys, values = layer.buffers(lambda: qkv.new_empty(n, self.Hkv, 1, self.D))
        k_p, v_p = layer.prefix
        args = (qkv, cos, sin, heads, keys, values, layer.live + 1, k_p, v_p)
        args += (lay.bias.reshape(n, -1), lay.group)
        if not native.fits_rope(*args):
            return None
        out = native.rope_cache_attention(*args, self.scaling)
        layer.live += 1
        return out

    def __call__(self, h, cos, sin, cache) -> torch.Tensor:
        n, (Hq, Hkv, D) = h.shape[0], (self.Hq, self.Hkv, self.D)
        x = _rms(h, self.n1)
        qkv = self.qkv(x)
        attn = self._native_attention(qkv, cos.view(n, D), sin.view(n, D), cache)
        if attn is not None and self.post_ops:
            return self._mlp(self.o.binary(attn, h, "add"))  # h + o(attn)
        if attn is not None:
            return self._mlp(h + self.o(attn))
        q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(n, Hq, D), k.view(n, Hkv, D), v.view(n, Hkv, D)
        if self.q_norm is not None:  # Qwen3: RMSNorm over each head before RoPE
            q, k = _rms(q, self.q_norm), _rms(k, self.k_norm)
        q = q * cos + _rotate_half(q) * sin  # cos/sin: (n, 1, D), broadcast over heads
        k = k * cos + _rotate_half(k) * sin
        keys, values = cache.layers[self.idx].update(k[:, :, None], v[:, :, None])
        attn, _ = prefix_attention(self.module, q[:, :, None], keys, values, None, self.scaling)
        if self.post_ops:
            return self._mlp(self.o.binary(attn.reshape(n, Hq * D), h, "add"))  # h + o(attn)
        return self._mlp(h + self.o(attn.reshape(n, Hq * D)))

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        """h + down(act(gate(x)) * up(x)), x = norm(h)."""
        x = _rms(h, self.n2)
        if self.post_ops:
            mlp = self.up.binary(x, self.gate.unary(x, "swish"), "mul")  # up(x) * silu(gate(x))
            return self.down.binary(mlp, h, "add")
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return h + self.down(self.act(gate) * up)


def _norm(norm: nn.Module | None) -> tuple[torch.Tensor, float] | None:
    return None if norm is None else (norm.weight, rms_norm_eps(norm))


def _rms(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    """The Llama-family RMSNorm (fp32 statistics, weight times the input-dtype result)."""
    weight, eps = norm
    out = native.rms_norm(x, weight, eps)
    if out is not None:
        return out
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


class LeanDecoder:
    """`step(tokens, positions, cache) -> logits` for one decoding step of a supported model
    (its layers' caches must be `PrefixLayer`s and a `PrefixLayout` active)."""

    def __init__(self, model: nn.Module, rows: int, compute_dtype=None):
        inner = model.model
        self.embed, self.rotary, self.norm = inner.embed_tokens, inner.rotary_emb, _norm(inner.norm)
        self.layers = [_Layer(layer, rows, compute_dtype) for layer in inner.layers]
        self.head = pack_linear(model.lm_head.weight, model.lm_head.bias, rows, compute_dtype)

    @classmethod
    def build(cls, model: nn.Module, rows: int, compute_dtype=None) -> LeanDecoder | None:
        """A decoder for `model`, or None where any part is not the plain one expected."""
        config = getattr(model, "config", None)
        inner = getattr(model, "model", None)
        if (
            not packing_available()
            or not is_llama_family(model)
            or getattr(config, "pretraining_tp", 1) != 1
            or inner is None
            or not all(hasattr(inner, a) for a in ("embed_tokens", "rotary_emb", "norm", "layers"))
            or not packable(getattr(model, "lm_head", None))
            or rms_norm_eps(inner.norm) is None
        ):
            return None
        for layer in inner.layers:
            a, m = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            parts = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
            linears = [getattr(a, p, None) or getattr(m, p, None) for p in parts]
            norms = [layer.input_layernorm, layer.post_attention_layernorm]
            norms += [x for x in (getattr(a, "q_norm", None), getattr(a, "k_norm", None)) if x]
            if (
                not all(packable(x) for x in linears)
                or any(rms_norm_eps(x) is None for x in norms)
                or not hasattr(m, "act_fn")
                or not hasattr(a, "scaling")
            ):
                return None
        with torch.no_grad():
            return cls(model, rows, compute_dtype)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """tokens, positions: (n,). Returns (n, V) logits of the next token."""
        h = self.embed(tokens)  # (n, d)
        cos, sin = self.rotary(h[:, None], positions[:, None])  # (n, 1, D): one per row
        cos, sin = cos.to(h.dtype), sin.to(h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin, cache)
        return self.head(_rms(h, self.norm))
