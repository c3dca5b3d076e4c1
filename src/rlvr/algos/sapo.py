"""SAPO (soft adaptive policy optimisation, arXiv 2511.20347; docs/algorithms.md#sapo): a
smooth gate on the token ratio instead of PPO's hard clip.

Per valid token, with rho = exp(logp - logp_old):

    tau_t = tau_pos if A_t > 0 else tau_neg
    f(rho, tau) = sigmoid(tau (rho - 1)) * 4 / tau
    L_t = -f(rho_t, tau_t) * A_t                     plus kl_coef * KL_t as in `clip`
    loss = aggregate(L, response_mask, agg)          the paper's: sample_mean

The gate's slope is 4 sigmoid' = sech^2(tau (rho - 1) / 2): 1 at rho = 1, so near on-policy
the gradient is the plain policy gradient A grad logp; it decays smoothly as rho leaves 1,
faster for the larger tau. The paper (and verl's defaults) take tau_pos = 1, tau_neg = 1.05:
negative-advantage tokens, whose updates spread probability over the whole vocabulary, are
damped sooner. A_t = 0 takes tau_neg (as verl's `A > 0` test); its loss is 0 either way.
Token ratio only; no clip bounds, no dual clip.
"""

from __future__ import annotations

from dataclasses import dataclass

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
from .settings import setting


@dataclass(frozen=True)
class SapoSettings(LossSettings):
    """SAPO's own settings (the shared ones: `LossSettings`).

    tau_pos: SAPO's gate temperature for tokens with A > 0 (the paper: 1).
    tau_neg: SAPO's gate temperature for tokens with A <= 0 (the paper: 1.05).
    """

    tau_pos: float = setting(1.0, lambda v: v > 0, "> 0 (the paper: 1)")
    tau_neg: float = setting(1.05, lambda v: v > 0, "> 0 (the paper: 1.05)")


def sapo_gate(rho, tau):
    """f(rho, tau) = sigmoid(tau (rho - 1)) * 4 / tau: value 2 / tau and slope 1 at rho = 1."""
    return torch.sigmoid(tau * (rho - 1.0)) * (4.0 / tau)


@register_objective(
    "sapo",
    settings=SapoSettings,
    unused=("clip_low", "clip_high", "ratio", "dual_clip"),
    rollout_weights="own",
)
def sapo_loss(inputs: LossInputs, settings: SapoSettings) -> LossOutput:
    """SAPO's loss (module docstring). Metrics as `clip`'s (LossOutput); nothing is clipped,
    so the clip fractions are 0."""
    s = settings
    check_inputs(inputs, s.kl_coef)
    logp, old, adv, mask, clean = masked_inputs(inputs)
    log_rho, clamped = log_ratio(logp, old, mask, "token", s.log_ratio_clamp)
    rho = torch.exp(log_rho)  # (B, T), with the graph
    taus = torch.tensor([s.tau_neg, s.tau_pos], dtype=rho.dtype, device=rho.device)
    tau = taus[(adv > 0).long()]  # in rho's dtype: 1.05 is not a float32 number
    per_token = -sapo_gate(rho, tau) * adv
    loss, kl3 = kl_and_aggregate(per_token, logp, clean, mask, inputs, s)
    none = torch.zeros_like(mask)
    metrics = policy_metrics(rho, mask, none, none, none, kl3, clamped)
    return LossOutput(loss=loss, metrics=metrics)
