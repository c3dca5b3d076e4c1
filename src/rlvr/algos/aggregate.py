"""Reduce a (B, T) per-token loss to the scalar of one optimiser step
(docs/algorithms.md#aggregation).

    sample_mean     (GRPO)     sum_i [ sum_t m L / max(1, sum_t m) ] / num_sequences
    token_mean      (DAPO)     sum_{i,t} m L / num_tokens
    token_sum_norm  (Dr. GRPO) sum_{i,t} m L / (norm_constant * num_sequences)

Micro-batches and ranks: `num_tokens` (valid tokens) and `num_sequences` (rows) default to
the counts of this call's batch. A caller that splits one optimiser step into micro-batches
(or ranks) passes the counts of the *whole* step, and then the sum of the micro-batch
losses equals the whole-batch loss, value and gradient (each term above is a sum over
rows or tokens divided by a global constant). Counts a mode does not use are ignored, so a
caller may always pass both.

Masked positions may hold anything, NaN and inf included: they are replaced with torch.where
before any arithmetic (multiplying by the mask would turn NaN * 0 into NaN), so neither the
value nor the gradient sees them. An all-masked batch gives 0 with zero gradient.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import torch
from torch import Tensor

from .settings import AggMode

Count = int | float | Tensor


def _count(value: Count | None, local: Tensor, name: str) -> Tensor:
    """The denominator: the caller's global count if given, else the local one; at least 1.

    Clamping to 1 only matters when the count is 0, and then every numerator is 0 too, so
    an empty step gives loss 0 instead of 0/0.
    """
    if value is None:
        return local.clamp_min(1)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
        return local.new_tensor(max(float(value), 1.0))
    if isinstance(value, Tensor) and value.numel() == 1:
        return value.reshape(()).to(device=local.device, dtype=local.dtype).clamp_min(1)
    raise TypeError(f"{name} must be a number or a one-element tensor, got {value!r}")


def _masked(per_token: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    if per_token.dim() != 2 or per_token.shape != mask.shape:
        raise ValueError(
            f"per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} must both be (B, T)"
        )
    mask = mask if mask.dtype == torch.bool else mask != 0
    return torch.where(mask, per_token, torch.zeros_like(per_token)), mask


def sample_mean(
    per_token: Tensor, mask: Tensor, *, num_sequences: Count | None = None, **_: object
) -> Tensor:
    """GRPO (DeepSeekMath Eq. 3): each response's token mean, then mean over responses.

    loss = sum_i [ sum_t m_it L_it / max(1, sum_t m_it) ] / num_sequences, num_sequences
    defaulting to B. Every row counts, including all-masked ones (e.g. overlong-filtered),
    which contribute 0, exactly as GRPO's formula; to exclude them pass num_sequences =
    the number of non-empty rows. Each response weighs the same, so a token of a long
    response weighs less (the length bias Dr. GRPO and DAPO remove).
    """
    x, m = _masked(per_token, mask)
    row_len = m.sum(dim=1).to(x.dtype).clamp_min(1)  # (B,)
    rows = x.sum(dim=1) / row_len
    return rows.sum() / _count(num_sequences, x.new_tensor(float(x.shape[0])), "num_sequences")


def token_mean(
    per_token: Tensor, mask: Tensor, *, num_tokens: Count | None = None, **_: object
) -> Tensor:
    """DAPO token-level loss (arXiv 2503.14476 Eq. 12): sum of all valid tokens / their count.

    num_tokens must be the valid-token count of the whole optimiser step (all micro-batches,
    all ranks) for exact gradient accumulation; defaults to this batch's count. Long
    responses weigh in proportion to their length.
    """
    x, m = _masked(per_token, mask)
    return x.sum() / _count(num_tokens, m.sum().to(x.dtype), "num_tokens")


def token_sum_norm(
    per_token: Tensor,
    mask: Tensor,
    *,
    num_sequences: Count | None = None,
    norm_constant: float | None = None,
    **_: object,
) -> Tensor:
    """Dr. GRPO (arXiv 2503.20783): sum over tokens / a constant, then mean over responses.

        loss = sum_{i,t} m_it L_it / (norm_constant * num_sequences)

    Dr. GRPO's code (and TRL's loss_type="dr_grpo") divides each response's token sum by the
    generation budget (max_new_tokens) and averages over responses; dividing by the global
    num_sequences (default B) instead of the local batch size keeps that mean exact under
    micro-batching. No term depends on a response's length, so there is no length bias.
    norm_constant is required: there is no sensible default for a generation budget.
    """
    if norm_constant is None:
        raise ValueError(
            "token_sum_norm needs norm_constant (the generation budget, max_new_tokens)"
        )
    if not norm_constant > 0:
        raise ValueError(f"norm_constant must be > 0, got {norm_constant}")
    x, _m = _masked(per_token, mask)
    seqs = _count(num_sequences, x.new_tensor(float(x.shape[0])), "num_sequences")
    return x.sum() / (seqs * norm_constant)


AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "sample_mean": sample_mean,
    "token_mean": token_mean,
    "token_sum_norm": token_sum_norm,
}
"""Aggregations by name; fn(per_token, mask, *, num_tokens, num_sequences, norm_constant)."""


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: AggMode = "token_mean",
    *,
    num_tokens: Count | None = None,
    num_sequences: Count | None = None,
    norm_constant: float | None = None,
) -> Tensor:
    """Scalar loss from a (B, T) per-token loss and its (B, T) mask (bool or 0/1).

    mode: "sample_mean" (GRPO), "token_mean" (DAPO) or "token_sum_norm" (Dr. GRPO); see
    the module docstring for formulas, micro-batching and masking. Returns a 0-d tensor.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; valid: {sorted(AGGREGATIONS)}")
    return AGGREGATIONS[mode](
        per_token,
        mask,
        num_tokens=num_tokens,
        num_sequences=num_sequences,
        norm_constant=norm_constant,
    )
