"""What every policy objective is called with (`rlvr.algos.objectives`): one micro-batch's
tensors (`LossInputs`) and the objective's parameters (`LossSettings`, declared with their
defaults and ranges in `rlvr.algos.settings`); and what it returns (`LossOutput`). The
objectives' own modules (`losses`, `cispo`), their toolkit and their registry import all three
from here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import Tensor

from .aggregate import Count
from .settings import LossSettings, Ratio

__all__ = ["LossInputs", "LossOutput", "LossSettings", "Ratio"]


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch, every tensor (B, T) unless noted, fp32 or the model's dtype.

    log_probs: the live policy's token log-probs (carries the graph).
    old_log_probs: pi_old's, the policy the rollout's update started from (the live ones,
        detached, when they cannot differ: mu = 1 and one mini-batch).
    advantages: (B,) one per response, or (B, T) per token (gae, reinforce_pp).
    response_mask: the tokens of the loss (bool or 0/1).
    ref_log_probs: the reference's, where the run has one (kl_coef > 0), else None.
    behaviour_log_probs: the sampling engine's own, where it reports them, else None.
    behaviour_versions: int64, each token's policy version beside its behaviour log-prob (the
        weights that computed it: a response updated in flight spans versions,
        train.inflight_updates), else None.
    entropy: the live policy's per-token entropy (detached), where computed, else None.
    num_tokens, num_sequences: the loss tokens and the sequences with any, of the whole
        optimiser step (all micro-batches, all ranks): the normalisers.
    norm_constant: Dr. GRPO's constant (the generation budget, max_new_tokens).
    batch_stats: the objective's `stats`, summed over the mini-batch on every rank.
    rollout_weights: rollout correction's detached per-token weights (B, T) (w = pi_old / mu,
        truncated or masked), times the off-policy sequence mask's 0/1 where it is on
        (`off_policy_mask`), or None; they multiply the policy term of every objective's
        per-token loss before aggregation, never the KL term, exactly once: an objective
        that applies them itself (`objectives.toolkit.kl_and_aggregate`) declares so, any
        other is called with them folded into `advantages` and this field None
        (`objectives.registry`).
    row_ids: (B,) int64 each row's id in the optimiser step (its group x 4096 + its place in
        the group), the same however the step is split; None where not known.
    draw_seed: the update's seed for an objective's random choices (run seed, optimiser
        step), or None.
    """

    log_probs: Tensor
    old_log_probs: Tensor
    advantages: Tensor
    response_mask: Tensor
    ref_log_probs: Tensor | None = None
    behaviour_log_probs: Tensor | None = None
    behaviour_versions: Tensor | None = None
    entropy: Tensor | None = None
    num_tokens: Count | None = None
    num_sequences: Count | None = None
    norm_constant: float | None = None
    batch_stats: Mapping[str, Tensor] = field(default_factory=dict)
    rollout_weights: Tensor | None = None
    row_ids: Tensor | None = None
    draw_seed: int | None = None


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
