"""What the CPU backend recognises in a model: the Llama family, its RMSNorms and SiLU MLPs.

Each fast path replaces a piece of the model only where it is the plain piece it was written
and tested for; these are the one place that says what "plain" means.
"""

from __future__ import annotations

from torch import nn

# Decoder-only families whose attention forward is `cache.update`, then RoPE applied by the
# modeling module's `apply_rotary_pos_emb`, then the attention registry's function, with
# nothing else attended to: the layout the lean decoder, the prefix attention and the
# training attention and RoPE passes read.
LLAMA_FAMILY = frozenset({"llama", "qwen2", "qwen3", "mistral"})

SILU = frozenset({"SiLU", "SiLUActivation"})  # torch's and transformers' SiLU modules


def is_llama_family(model: nn.Module) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) in LLAMA_FAMILY


def rms_norm_eps(norm: nn.Module | None) -> float | None:
    """The epsilon of a Llama-family RMSNorm (`weight * x / sqrt(mean(x^2) + eps)` with an
    `nn.Parameter` weight), or None for anything else."""
    if norm is None or not type(norm).__name__.endswith("RMSNorm"):
        return None
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    weight = getattr(norm, "weight", None)
    return float(eps) if eps is not None and isinstance(weight, nn.Parameter) else None


def is_silu_mlp(mlp: nn.Module | None) -> bool:
    """A gated MLP `down(silu(gate(x)) * up(x))` (the Llama family's)."""
    return all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")) and (
        type(mlp.act_fn).__name__ in SILU
    )
