"""GMPO (geometric-mean policy optimisation, arXiv 2507.20673; verl `geo_mean`;
docs/algorithms.md#gmpo): a sequence ratio that is the geometric mean of the token ratios,
each clipped in log space on the side of its advantage's sign.

Per response i, with x_t = logp_t - logp_old_t on its valid tokens and s_t = sign(A_t):

    l_t = s_t * min(s_t x_t, s_t clip(x_t, -clip_low, clip_high))
    R_i = exp(sum_t l_t / |o_i|)                    the clipped geometric mean of rho_t
    A_i = sum_t A_t / |o_i|                         (the response's advantage)
    loss = sum_i -A_i R_i / num_sequences

clip_low / clip_high bound the *log*-ratio (the paper: 0.4 each, rho in [e^-0.4, e^0.4]).
A token whose log-ratio crossed the bound on its advantage's side (A > 0 above clip_high,
A < 0 below -clip_low) drops out of R_i's gradient, as PPO's clip; a token with A = 0 has
l_t = 0. The loss is written per token for the shared tail: every valid token of response
i carries -A_i R_i and `sample_mean` averages it over the response, so rollout correction's
per-token weights w_t scale response i by their arithmetic mean over its tokens (verl: the
geometric mean). Token ratio only; no dual clip, no log-ratio clamp, `agg=sample_mean`.
"""

from __future__ import annotations

import torch

from .loss_inputs import LossInputs, LossOutput, LossSettings
from .objectives.registry import register_objective
from .objectives.toolkit import check_inputs, kl_and_aggregate, masked_inputs, policy_metrics


def check_gmpo(settings: LossSettings) -> None:
    """GMPO's loss is a mean over each response's tokens: the sample mean, nothing else."""
    if settings.agg != "sample_mean":
        raise ValueError(
            f"agg: got {settings.agg!r}, expected sample_mean under gmpo (a sequence objective)"
        )


@register_objective(
    "gmpo",
    unused=("ratio", "dual_clip", "log_ratio_clamp"),
    check=check_gmpo,
    rollout_weights="own",
)
def gmpo_loss(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """GMPO's loss (module docstring). Metrics as `clip`'s (LossOutput): clip_frac_high /
    clip_frac_low are the shares of valid tokens the bound on their advantage's side took out
    of the gradient; ratio_mean / ratio_max are of R_i, per token (as GSPO's s_i)."""
    s = settings
    check_gmpo(s)
    check_inputs(inputs, s.kl_coef)
    logp, old, adv, mask, clean = masked_inputs(inputs)
    x = logp - old  # (B, T), 0 at masked positions
    sign = torch.sign(adv)
    clipped = x.clamp(-s.clip_low, s.clip_high)
    log_r = sign * torch.minimum(sign * x, sign * clipped)
    length = mask.sum(dim=1).to(x.dtype).clamp_min(1)  # (B,)
    ratio = torch.exp(log_r.sum(dim=1) / length)  # R_i, with the graph
    seq_adv = adv.sum(dim=1) / length
    per_token = (-seq_adv * ratio).unsqueeze(1).expand_as(x)
    loss, kl3 = kl_and_aggregate(per_token, logp, clean, mask, inputs, s)
    high_hit = mask & (adv > 0) & (x.detach() > s.clip_high)
    low_hit = mask & (adv < 0) & (x.detach() < -s.clip_low)
    none = torch.zeros_like(mask)
    rho = ratio.detach().unsqueeze(1).expand_as(x)
    metrics = policy_metrics(
        rho, mask, low_hit, high_hit, none, kl3, torch.zeros((), dtype=x.dtype)
    )
    return LossOutput(loss=loss, metrics=metrics)
