"""The pieces every built-in objective is written with, public for a user's own
(docs/algorithms.md#adding-an-objective).

Each is a small pure function over one micro-batch's `LossInputs`. An objective built from
them handles what the built-ins handle: masked positions that hold garbage (NaN included),
half-precision log-probs computed in fp32, advantages (B,) or (B, T), the KL to the reference
added after the policy term, the step's global counts (exact micro-batching), rollout
weights on the policy term only, and metrics that combine over micro-batches and ranks.

    check_inputs(inputs, kl_coef)      the tensors' shapes; ValueError naming the one that is off
    masked_inputs(inputs)              Masked(logp, old, adv, mask, clean): fp32 for half
                                       precision, masked entries 0, advantages (B, T)
    log_ratio(logp, old, mask, ratio, clamp)
                                       log rho per token (or GSPO's per sequence) and how many
                                       log-ratios the clamp cut
    kl_and_aggregate(per_token, logp, clean, mask, inputs, settings)
                                       the shared tail: rollout weights times the policy term,
                                       plus the KL term, aggregated by settings.agg
    policy_metrics(rho, mask, low, high, dual, kl3, clamped)
                                       the metrics `clip` reports (LossOutput documents them)
    weighted_advantages(inputs)        how the update applies the rollout weights to an
                                       objective that does not apply them itself

An objective that ends in `kl_and_aggregate` applies `inputs.rollout_weights` itself and
registers with `rollout_weights="own"` (rlvr.algos.objectives.registry); one that aggregates
by itself leaves the declaration at its default and the update applies them for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

import torch
from torch import Tensor

from ..aggregate import aggregate
from ..kl import KL_ESTIMATORS, kl_k3
from ..loss_inputs import LossInputs, LossSettings, Ratio

__all__ = [
    "Masked",
    "check_inputs",
    "kl_and_aggregate",
    "log_ratio",
    "masked_inputs",
    "policy_metrics",
    "weighted_advantages",
]


def check_inputs(inputs: LossInputs, kl_coef: float) -> None:
    """ValueError unless log_probs is (B, T), old_log_probs, response_mask and ref_log_probs
    have its shape and advantages is (B,) or (B, T); and unless a KL weight kl_coef > 0 comes
    with ref_log_probs. The settings' ranges are LossSettings' own check."""
    log_probs, ref_log_probs = inputs.log_probs, inputs.ref_log_probs
    shape = tuple(log_probs.shape)
    if len(shape) != 2:
        raise ValueError(f"log_probs must be (B, T), got {shape}")
    named = {"old_log_probs": inputs.old_log_probs, "response_mask": inputs.response_mask}
    if ref_log_probs is not None:
        named["ref_log_probs"] = ref_log_probs
    for name, t in named.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
    advantages = inputs.advantages
    if tuple(advantages.shape) not in (shape[:1], shape):
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)}, expected {shape[:1]} or {shape}"
        )
    if kl_coef > 0 and ref_log_probs is None:
        raise ValueError("kl_coef > 0 needs ref_log_probs")


class Masked(NamedTuple):
    """A token objective's inputs, cleaned (`masked_inputs`); unpacks as a 5-tuple."""

    logp: Tensor  # (B, T) live log-probs, with the graph
    old: Tensor  # (B, T) pi_old's
    adv: Tensor  # (B, T) advantages, a (B,) one broadcast over its row
    mask: Tensor  # (B, T) bool, the loss tokens
    clean: Callable[[Tensor], Tensor]  # any other (B, T) input cleaned the same way


def _valid(response_mask: Tensor) -> Tensor:
    return response_mask if response_mask.dtype == torch.bool else response_mask != 0


def masked_inputs(inputs: LossInputs) -> Masked:
    """(logp, old, adv, mask, clean) of a token objective: fp32 for half-precision log-probs,
    masked entries replaced by 0 before any arithmetic (`clean`), advantages as (B, T).

    The replacement comes first because NaN * 0 is NaN, and torch.where's gradient to the
    unused branch is 0 only where that branch's own gradient is finite."""
    mask = _valid(inputs.response_mask)
    lp = inputs.log_probs
    dtype = torch.float32 if lp.dtype in (torch.float16, torch.bfloat16) else lp.dtype

    def clean(t: Tensor) -> Tensor:
        return torch.where(mask, t.to(dtype), torch.zeros((), dtype=dtype, device=t.device))

    logp, old = clean(lp), clean(inputs.old_log_probs)
    adv = inputs.advantages.to(dtype)
    adv = clean(adv.unsqueeze(1).expand_as(logp) if adv.dim() == 1 else adv)
    return Masked(logp, old, adv, mask, clean)


def log_ratio(
    logp: Tensor, old: Tensor, mask: Tensor, ratio: Ratio, clamp: float | None
) -> tuple[Tensor, Tensor]:
    """(B, T) log importance ratio and the number of clamped log-ratios (0-d).

    ratio="token": logp - old per token; clamp = c bounds it to [-c, c] (a clamped token gets
    no gradient). ratio="sequence" (GSPO-token): log s_i = the mean of logp - old over the
    row's valid tokens, detached, on every token, plus logp - sg(logp) so each token keeps the
    gradient of its own logp; the clamp bounds log s_i (the value only). Inputs as
    `masked_inputs` gives them (0 at masked positions)."""
    clamped = torch.zeros((), dtype=logp.dtype, device=logp.device)
    if ratio == "token":
        out = logp - old
        if clamp is not None:
            clamped = ((out.abs() > clamp) & mask).sum().to(logp.dtype)
            out = out.clamp(-clamp, clamp)
        return out, clamped
    lengths = mask.sum(dim=1)
    seq = (logp - old).detach().sum(dim=1) / lengths.clamp_min(1).to(logp.dtype)  # (B,)
    if clamp is not None:
        clamped = ((seq.abs() > clamp) & (lengths > 0)).sum().to(logp.dtype)
        seq = seq.clamp(-clamp, clamp)
    return seq.unsqueeze(1) + logp - logp.detach(), clamped


def kl_and_aggregate(
    per_token: Tensor, logp: Tensor, clean, mask: Tensor, inputs: LossInputs, s: LossSettings
) -> tuple[Tensor, Tensor | None]:
    """An objective's common tail: the loss's KL to the reference added to `per_token` (where
    `s.kl_coef` > 0), aggregated by `s.agg` with the step's global counts; and the k3 estimate
    for the metrics (None without reference log-probs). `clean`: the objective's masking of
    its inputs (`masked_inputs`). Rollout weights (`inputs.rollout_weights`, detached) scale
    the policy term, before the KL joins: an objective ending here applies them itself."""
    if inputs.rollout_weights is not None:
        per_token = per_token * clean(inputs.rollout_weights.detach())
    kl3 = None
    if inputs.ref_log_probs is not None:
        ref = clean(inputs.ref_log_probs)
        if s.kl_coef > 0:
            per_token = per_token + s.kl_coef * KL_ESTIMATORS[s.kl_kind](logp, ref)
        kl3 = kl_k3(logp.detach(), ref)
    loss = aggregate(
        per_token, mask, s.agg, num_tokens=inputs.num_tokens,
        num_sequences=inputs.num_sequences, norm_constant=inputs.norm_constant,
    )  # fmt: skip
    return loss, kl3


def policy_metrics(
    rho: Tensor,
    mask: Tensor,
    clip_low_hit: Tensor,
    clip_high_hit: Tensor,
    dual_hit: Tensor,
    kl3: Tensor | None,
    clamped: Tensor,
) -> dict[str, float]:
    """The metrics `clip` reports (their meaning and how they combine: `LossOutput`): the
    shares of valid tokens each bound hit (bool (B, T) each), rho's mean and max over valid
    tokens, the clamped log-ratios (0-d count), the mean k3 (where `kl3` is given) and
    num_tokens. An empty call reports 0.0 everywhere."""
    rho = rho.detach()
    zero = torch.zeros((), dtype=rho.dtype, device=rho.device)
    n = mask.sum().to(rho.dtype)
    denom = n.clamp_min(1)
    values = {
        "clip_frac_low": clip_low_hit.sum() / denom,
        "clip_frac_high": clip_high_hit.sum() / denom,
        "dual_clip_frac": dual_hit.sum() / denom,
        "ratio_mean": torch.where(mask, rho, zero).sum() / denom,
        "ratio_max": torch.where(mask, rho, zero).amax() if rho.numel() else zero,
        "log_ratio_clamped": clamped,
        "num_tokens": n,
    }
    if kl3 is not None:
        values["kl"] = torch.where(mask, kl3, zero).sum() / denom
    # One device-to-host transfer for all metrics instead of a sync per .item().
    return dict(zip(values, torch.stack(list(values.values())).tolist()))


def weighted_advantages(inputs: LossInputs) -> LossInputs:
    """`inputs` with the rollout weights moved into the advantages: A'_t = w_t A_t on the
    valid tokens ((B, T), 0 elsewhere) and `rollout_weights` None; unchanged without weights.

    This is how the update applies rollout correction's weights and the off-policy mask to
    an objective that does not declare it applies them itself. For an objective whose
    per-token policy term is positively homogeneous in the advantage, f(w A) = w f(A) for
    w >= 0 (-rho A, -clip(rho) A, -sg(w) A log pi and every objective built on them), the
    result is its policy term times w_t, the same as the built-ins' `kl_and_aggregate`; a
    term without the advantage (the KL to the reference) is untouched, and the tokens keep
    their place in the normaliser. The weights are cleared, so an objective that hands its
    inputs on to another (`clip`) cannot apply them a second time."""
    w = inputs.rollout_weights
    if w is None:
        return inputs
    mask = _valid(inputs.response_mask)
    adv = inputs.advantages
    adv = adv.unsqueeze(1).expand(mask.shape) if adv.dim() == 1 else adv
    weighted = adv * w.detach().to(device=adv.device, dtype=adv.dtype)
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    return replace(inputs, advantages=torch.where(mask, weighted, zero), rollout_weights=None)
