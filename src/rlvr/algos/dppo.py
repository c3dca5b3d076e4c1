"""DPPO (divergence proximal policy optimisation, "Rethinking the Trust Region in LLM
Reinforcement Learning", arXiv 2602.04879; docs/algorithms.md#dppo): PPO's ratio clip replaced
by a mask from a direct estimate of how far the token's probability moved.

Per valid token, with p = pi_theta(o_t), p_old = pi_old(o_t), rho = p / p_old and the
thresholds delta_low = clip_low, delta_high = clip_high (verl reads its clip_ratio_low / high
the same way under DPPO):

    binary TV (dppo_tv):  D = p - p_old                                   (signed)
        kept when A > 0:  D <= delta_high        kept when A <= 0:  D >= -delta_low
    binary KL (dppo_kl):  D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        kept when A > 0:  D <= delta_high or p <= p_old
        kept when A <= 0: D <= delta_low  or p >= p_old
    w_t = sg(min(rho_t, C))                       C = dual_clip (verl's clip_ratio_c); none: no cap
    L_t = -A_t * w_t * logp_t * keep_t            plus kl_coef * KL_t as in `clip`
    loss = aggregate(L, response_mask, agg)       a dropped token stays in the normaliser

The gradient of a kept token is -A min(rho, C) grad logp: PPO's unclipped gradient. A dropped
token is one whose update already moved its probability past the threshold in the advantage's
direction; a move against it is never blocked. Unlike the ratio, the divergence does not
explode for a rare token (p_old 1e-5 -> 1e-3 is rho = 100 but D = 0.001) and does not stay small
for a likely one (0.99 -> 0.8 is rho = 0.81 but D = -0.19). The paper's thresholds: 0.15 for
TV, 0.05 for KL; its recipe leaves the ratio uncapped (verl's example: C = 10000).
The 1e-8 in the binary KL is verl's (it keeps log finite at p = 1). Token ratio only.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .loss_inputs import LossInputs, LossOutput, LossSettings
from .objectives.registry import register_objective
from .objectives.toolkit import (
    check_inputs,
    kl_and_aggregate,
    log_ratio,
    masked_inputs,
    policy_metrics,
)

Divergence = Literal["tv", "kl"]
EPS_KL = 1e-8  # verl's, inside the binary KL's second log


def binary_kl(old_log_probs: Tensor, log_probs: Tensor) -> Tensor:
    """KL(Bernoulli(p_old) || Bernoulli(p)) per token from the two log-probs (>= 0)."""
    p_old, p = torch.exp(old_log_probs), torch.exp(log_probs)
    rest = torch.log((1.0 - p_old + EPS_KL) / (1.0 - p + EPS_KL))
    return p_old * (old_log_probs - log_probs) + (1.0 - p_old) * rest


def dropped(
    logp: Tensor, old: Tensor, adv: Tensor, settings: LossSettings, divergence: Divergence
) -> tuple[Tensor, Tensor]:
    """(B, T) bool: the tokens DPPO drops with A > 0 (probability rose past delta_high) and
    with A <= 0 (fell past delta_low), from detached log-probs (module docstring)."""
    p, p_old = torch.exp(logp), torch.exp(old)
    if divergence == "tv":
        rose, fell = p - p_old > settings.clip_high, p - p_old < -settings.clip_low
    else:
        d = binary_kl(old, logp)
        rose = (d > settings.clip_high) & (p > p_old)
        fell = (d > settings.clip_low) & (p < p_old)
    positive = adv > 0
    return positive & rose, ~positive & fell


def dppo_loss(inputs: LossInputs, settings: LossSettings, divergence: Divergence) -> LossOutput:
    """DPPO's loss (module docstring). Metrics as `clip`'s (LossOutput): clip_frac_high and
    clip_frac_low are the shares of valid tokens dropped with A > 0 and with A <= 0,
    dppo_masked_frac their sum (verl's pg_clipfrac), dual_clip_frac the share of kept tokens
    whose weight the cap C cut (verl's pg_clipfrac_lower)."""
    s = settings
    check_inputs(inputs, s.kl_coef)
    logp, old, adv, mask, clean = masked_inputs(inputs)
    log_rho, clamped = log_ratio(logp.detach(), old, mask, "token", s.log_ratio_clamp)
    rho = torch.exp(log_rho)  # (B, T), no graph
    high, low = dropped(logp.detach(), old, adv, s, divergence)
    high, low = high & mask, low & mask
    keep = ~(high | low)
    capped = torch.zeros_like(mask)
    weight = rho
    if s.dual_clip is not None:
        capped = mask & keep & (rho > s.dual_clip)
        weight = rho.clamp(max=s.dual_clip)
    per_token = -adv * weight * logp * keep.to(logp.dtype)
    loss, kl3 = kl_and_aggregate(per_token, logp, clean, mask, inputs, s)
    metrics = policy_metrics(rho, mask, low, high, capped, kl3, clamped)
    metrics["dppo_masked_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
    return LossOutput(loss=loss, metrics=metrics)


@register_objective("dppo_tv", unused=("ratio",), rollout_weights="own")
def dppo_tv(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """DPPO-Binary-TV (arXiv 2602.04879): -A sg(min(rho, C)) logp where |p - p_old| is
    within the threshold on the advantage's side, 0 elsewhere."""
    return dppo_loss(inputs, settings, "tv")


@register_objective("dppo_kl", unused=("ratio",), rollout_weights="own")
def dppo_kl(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """DPPO-Binary-KL (arXiv 2602.04879): as dppo_tv with the binary KL of p_old and p."""
    return dppo_loss(inputs, settings, "kl")
