"""CISPO (MiniMax-M1, arXiv 2506.13585; docs/algorithms.md#cispo): clip the importance
weight, not the update, so every token keeps its gradient.

Per valid token, with rho = exp(logp - logp_old):

    w_t = sg(clip(rho_t, 1 - clip_low, 1 + clip_high))
    L_t = -w_t * A_t * logp_t                        plus kl_coef * KL_t as in `clip`
    loss = aggregate(L, response_mask, agg)

The gradient is -w_t A_t grad logp_t: a token outside [1 - clip_low, 1 + clip_high] still
learns, with its weight capped (PPO's clip zeroes it). The paper sets no lower bound
("clip_low to a high value"): clip_low = 1 puts it at 0. Token ratio only; no dual clip.
"""

from __future__ import annotations

import torch

from .loss_inputs import LossInputs, LossOutput, LossSettings
from .objectives.registry import register_objective
from .objectives.toolkit import (
    check_inputs,
    kl_and_aggregate,
    log_ratio,
    masked_inputs,
    policy_metrics,
)


@register_objective("cispo", unused=("ratio", "dual_clip"), rollout_weights="own")
def cispo_loss(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """CISPO's loss (module docstring). Metrics as `clip`'s (LossOutput): clip_frac_low /
    clip_frac_high are the shares of valid tokens whose weight the lower / upper bound cut,
    whatever the advantage's sign (their gradient is scaled, not zeroed)."""
    s = settings
    check_inputs(inputs, s.kl_coef)
    logp, old, adv, mask, clean = masked_inputs(inputs)
    log_rho, clamped = log_ratio(logp.detach(), old, mask, "token", s.log_ratio_clamp)
    rho = torch.exp(log_rho)  # (B, T), no graph
    lo, hi = 1.0 - s.clip_low, 1.0 + s.clip_high
    weight = rho.clamp(lo, hi)
    per_token = -weight * adv * logp
    loss, kl3 = kl_and_aggregate(per_token, logp, clean, mask, inputs, s)
    low_hit, high_hit = mask & (rho < lo), mask & (rho > hi)
    metrics = policy_metrics(rho, mask, low_hit, high_hit, torch.zeros_like(mask), kl3, clamped)
    return LossOutput(loss=loss, metrics=metrics)
