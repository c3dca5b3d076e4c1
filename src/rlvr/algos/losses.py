"""The clipped policy-gradient loss of PPO, GRPO, DAPO and GSPO
(docs/algorithms.md#clipped-surrogate).

Per valid token, with rho = exp(logp - logp_old) and bounds [1 - clip_low, 1 + clip_high]:

    L_t = max(-rho A, -clip(rho, 1 - clip_low, 1 + clip_high) A)     (= -min(rho A, clip(rho) A))
          then, if dual_clip = c and A < 0:  L_t = min(L_t, -c A)
          plus kl_coef * KL_t                                        (KL enters with +beta)
    loss = aggregate(L, response_mask, agg)

Which bound zeroes a token's gradient: the upper only when A > 0 and rho > 1 + clip_high,
the lower only when A < 0 and rho < 1 - clip_low; dual clip only when A < 0 and rho > c.

Registered here: `clip` (the token ratio, or GSPO's with `ratio="sequence"`; its normaliser
`agg="token_sum_norm"` is Dr. GRPO) and `gspo` (the sequence ratio whatever `ratio` says).
`policy_loss` is `clip` with keyword arguments.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from .aggregate import AggMode, Count
from .kl import KLKind
from .loss_inputs import LossInputs, LossOutput, LossSettings, Ratio
from .objectives.registry import register_objective
from .objectives.toolkit import (
    check_inputs,
    kl_and_aggregate,
    log_ratio,
    masked_inputs,
    policy_metrics,
)


def _clipped_surrogate(
    rho: Tensor, adv: Tensor, mask: Tensor, lo: float, hi: float, dual_clip: float | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-token -min(rho A, clip(rho) A) (dual-clipped) and where each bound fired."""
    pg = torch.maximum(-rho * adv, -rho.clamp(lo, hi) * adv)
    low_hit = mask & (adv < 0) & (rho < lo)
    high_hit = mask & (adv > 0) & (rho > hi)
    dual_hit = torch.zeros_like(mask)
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual_hit = mask & (adv < 0) & (pg > cap)
        pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)
    return pg, low_hit, high_hit, dual_hit


def policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = LossSettings.clip_low,
    clip_high: float = LossSettings.clip_high,
    dual_clip: float | None = LossSettings.dual_clip,
    agg: AggMode = LossSettings.agg,
    num_tokens: Count | None = None,
    num_sequences: Count | None = None,
    norm_constant: float | None = None,
    kl_coef: float = LossSettings.kl_coef,
    ref_log_probs: Tensor | None = None,
    kl_kind: KLKind = LossSettings.kl_kind,
    ratio: Ratio = LossSettings.ratio,
    log_ratio_clamp: float | None = LossSettings.log_ratio_clamp,
) -> LossOutput:
    """Clipped surrogate loss (formula in the module docstring) aggregated by `agg`.

    Shapes: log_probs, old_log_probs, response_mask, ref_log_probs (B, T); advantages (B,)
    (one per response, broadcast over its tokens) or (B, T). Masked positions of every input
    may hold garbage, NaN included: they are replaced before any arithmetic, so they reach
    neither the loss nor the gradient. bf16/fp16 log-probs are computed in fp32.

    Settings, by paper:
      GRPO (DeepSeekMath): clip_low = clip_high = 0.2, agg="sample_mean", kl_coef 0.04.
      DAPO (arXiv 2503.14476): clip_low 0.2, clip_high 0.28 ("clip-higher"), agg="token_mean",
        kl_coef 0.
      Dr. GRPO: agg="token_sum_norm" with norm_constant = max_new_tokens.
      Dual clip (Ye et al. 2020, arXiv 1912.09729; verl clip_ratio_c = 3): for A < 0 the loss
        is capped at -dual_clip * A, so a huge rho cannot blow up a negative-advantage token.
        Must be > 1.
      GSPO (arXiv 2507.18071), ratio="sequence": s_i = exp(sum_t m (logp - logp_old) / |o_i|);
        tokens use the paper's GSPO-token ratio s_it = sg[s_i] * pi_t / sg[pi_t], equal to
        s_i in value with gradient s_i * grad logp_t; clipping acts on s_i with the same
        bounds (the paper uses clip_low 3e-4, clip_high 4e-4). With sequence advantages and
        agg="sample_mean" this is exactly GSPO's gradient.

    kl_coef > 0 needs ref_log_probs; the KL term is kl_coef * KL_ESTIMATORS[kl_kind] per token,
    added before aggregation. The policy and KL gradients (docs/algorithms.md#kl-penalty):
    per token -(w A rho) + w kl_coef (1 - pi_ref / pi_theta) for weight w of `agg`.

    log_ratio_clamp = c clamps the log-ratio to [-c, c] before exp (verl uses 20) and counts
    the clamped ones in the metrics. ratio="token": logp - logp_old per token, and a clamped
    token gets no gradient. ratio="sequence": log s_i, which bounds the value s_i only; the
    tokens keep their GSPO-token gradient sg[s_i] * grad logp_t. Default None: no clamp
    (never a silent one).

    num_tokens / num_sequences / norm_constant go to `aggregate` (global counts for exact
    micro-batching). Returns LossOutput; its metrics are documented there.
    """
    settings = LossSettings(
        clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, agg=agg, kl_coef=kl_coef,
        kl_kind=kl_kind, ratio=ratio, log_ratio_clamp=log_ratio_clamp,
    )  # fmt: skip
    inputs = LossInputs(
        log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages,
        response_mask=response_mask, ref_log_probs=ref_log_probs, num_tokens=num_tokens,
        num_sequences=num_sequences, norm_constant=norm_constant,
    )  # fmt: skip
    return clipped_surrogate_loss(inputs, settings)


@register_objective("clip", rollout_weights="own")
def clipped_surrogate_loss(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """The `clip` objective: PPO's clipped surrogate with DAPO's decoupled bounds, per
    settings.ratio; `policy_loss` documents it."""
    s = settings
    check_inputs(inputs, s.kl_coef)
    logp, old, adv, mask, clean = masked_inputs(inputs)
    log_rho, clamped = log_ratio(logp, old, mask, s.ratio, s.log_ratio_clamp)
    rho = torch.exp(log_rho)  # (B, T)
    per_token, low_hit, high_hit, dual_hit = _clipped_surrogate(
        rho, adv, mask, 1.0 - s.clip_low, 1.0 + s.clip_high, s.dual_clip
    )
    loss, kl3 = kl_and_aggregate(per_token, logp, clean, mask, inputs, s)
    metrics = policy_metrics(rho, mask, low_hit, high_hit, dual_hit, kl3, clamped)
    return LossOutput(loss=loss, metrics=metrics)


@register_objective("gspo", rollout_weights="own")
def gspo_loss(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """GSPO (arXiv 2507.18071): the clipped surrogate over the sequence ratio s_i."""
    return clipped_surrogate_loss(inputs, replace(settings, ratio="sequence"))
