"""The clipped policy-gradient loss of PPO, GRPO, DAPO and GSPO
(docs/algorithms.md#clipped-surrogate).

Per valid token, with rho = exp(logp - logp_old) and bounds [1 - clip_low, 1 + clip_high]:

    L_t = max(-rho A, -clip(rho, 1 - clip_low, 1 + clip_high) A)     (= -min(rho A, clip(rho) A))
          then, if dual_clip = c and A < 0:  L_t = min(L_t, -c A)
          plus kl_coef * KL_t                                        (KL enters with +beta)
    loss = aggregate(L, response_mask, agg)

Which bound zeroes a token's gradient: the upper only when A > 0 and rho > 1 + clip_high,
the lower only when A < 0 and rho < 1 - clip_low; dual clip only when A < 0 and rho > c.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .aggregate import AggMode, Count, aggregate
from .kl import KL_ESTIMATORS, KLKind, kl_k3
from .loss_inputs import LossInputs, LossSettings, Ratio


@dataclass(frozen=True)
class LossOutput:
    """What policy_loss and every objective (rlvr.algos.objectives) return.

    loss: 0-d tensor to minimise (carries the graph back to log_probs).
    metrics: floats about this call's valid tokens (all 0.0 when there are none):
        clip_frac_low, clip_frac_high  fraction of valid tokens whose gradient the lower /
                                       upper bound zeroed
        dual_clip_frac                 fraction zeroed by the dual clip (0 if off)
        ratio_mean, ratio_max          of rho over valid tokens (GSPO: of s_i, per token)
        kl                             mean k3 over valid tokens; present only when
                                       ref_log_probs is given (also with kl_coef = 0).
                                       Always k3 whatever kl_kind, so runs stay comparable.
        log_ratio_clamped              how many log-ratios log_ratio_clamp cut (tokens for
                                       ratio="token", sequences for ratio="sequence")
        num_tokens                     valid tokens in this call
      Combining micro-batches / ranks exactly: the fractions, ratio_mean and kl are means
      over valid tokens, so their num_tokens-weighted mean is the whole step's value;
      ratio_max combines by max (0.0, the value of an empty call, is neutral);
      log_ratio_clamped and num_tokens by sum (they are counts, not means).
    """

    loss: Tensor
    metrics: dict[str, float]


def _check(inputs: LossInputs, kl_coef: float) -> None:
    """The tensors' shapes (the settings' ranges are LossSettings' own check)."""
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


def masked_inputs(inputs: LossInputs):
    """(logp, old, adv, mask, clean) of a token objective: fp32 for half-precision log-probs,
    masked entries replaced by 0 before any arithmetic (`clean`), advantages as (B, T)."""
    m = inputs.response_mask
    mask = m if m.dtype == torch.bool else m != 0
    lp = inputs.log_probs
    dtype = torch.float32 if lp.dtype in (torch.float16, torch.bfloat16) else lp.dtype

    def clean(t: Tensor) -> Tensor:
        return torch.where(mask, t.to(dtype), torch.zeros((), dtype=dtype, device=t.device))

    logp, old = clean(lp), clean(inputs.old_log_probs)
    adv = inputs.advantages.to(dtype)
    adv = clean(adv.unsqueeze(1).expand_as(logp) if adv.dim() == 1 else adv)
    return logp, old, adv, mask, clean


def _log_ratio(
    logp: Tensor, old: Tensor, mask: Tensor, ratio: Ratio, clamp: float | None
) -> tuple[Tensor, Tensor]:
    """(B, T) log importance ratio and the number of clamped log-ratios (0-d)."""
    clamped = torch.zeros((), dtype=logp.dtype, device=logp.device)
    if ratio == "token":
        log_ratio = logp - old
        if clamp is not None:
            clamped = ((log_ratio.abs() > clamp) & mask).sum().to(logp.dtype)
            log_ratio = log_ratio.clamp(-clamp, clamp)
        return log_ratio, clamped
    lengths = mask.sum(dim=1)
    seq = (logp - old).detach().sum(dim=1) / lengths.clamp_min(1).to(logp.dtype)  # (B,)
    if clamp is not None:
        clamped = ((seq.abs() > clamp) & (lengths > 0)).sum().to(logp.dtype)
        seq = seq.clamp(-clamp, clamp)
    # GSPO-token: value log s_i on every token, gradient that of logp_t alone.
    return seq.unsqueeze(1) + logp - logp.detach(), clamped


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


def clipped_surrogate_loss(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """The registered `clip` objective (`rlvr.algos.objectives`); `policy_loss` documents it."""
    s = settings
    _check(inputs, s.kl_coef)
    response_mask = inputs.response_mask
    log_probs = inputs.log_probs
    mask = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    dtype = torch.float32 if log_probs.dtype in (torch.float16, torch.bfloat16) else log_probs.dtype

    def clean(t: Tensor) -> Tensor:
        # Replace masked entries *before* any arithmetic: NaN * 0 is NaN, and torch.where's
        # gradient to the unused branch is 0 only if that branch's own gradient is finite.
        return torch.where(mask, t.to(dtype), torch.zeros((), dtype=dtype, device=t.device))

    logp, old = clean(log_probs), clean(inputs.old_log_probs)
    adv = inputs.advantages.to(dtype)
    adv = clean(adv.unsqueeze(1).expand_as(logp) if adv.dim() == 1 else adv)  # (B, T)

    log_ratio, clamped = _log_ratio(logp, old, mask, s.ratio, s.log_ratio_clamp)
    rho = torch.exp(log_ratio)  # (B, T)
    per_token, low_hit, high_hit, dual_hit = _clipped_surrogate(
        rho, adv, mask, 1.0 - s.clip_low, 1.0 + s.clip_high, s.dual_clip
    )
    loss, kl3 = kl_and_aggregate(per_token, logp, clean, mask, inputs, s)
    metrics = _metrics(rho, mask, low_hit, high_hit, dual_hit, kl3, clamped)
    return LossOutput(loss=loss, metrics=metrics)


def kl_and_aggregate(
    per_token: Tensor, logp: Tensor, clean, mask: Tensor, inputs: LossInputs, s: LossSettings
) -> tuple[Tensor, Tensor | None]:
    """An objective's common tail: the loss's KL to the reference added to `per_token` (where
    `s.kl_coef` > 0), aggregated by `s.agg`; and the k3 estimate for the metrics (None without
    reference log-probs). `clean`: the objective's masking of its inputs. Rollout correction's
    weights (`inputs.rollout_weights`, detached) scale the policy term, before the KL joins."""
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


def _metrics(
    rho: Tensor,
    mask: Tensor,
    clip_low_hit: Tensor,
    clip_high_hit: Tensor,
    dual_hit: Tensor,
    kl3: Tensor | None,
    clamped: Tensor,
) -> dict[str, float]:
    rho = rho.detach()
    zero = torch.zeros((), dtype=rho.dtype, device=rho.device)
    n = mask.sum().to(rho.dtype)
    denom = n.clamp_min(1)  # an empty call reports 0.0 everywhere
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
