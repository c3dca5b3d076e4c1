"""What every policy objective is called with (`rlvr.algos.objectives`): one micro-batch's
tensors (`LossInputs`) and the objective's parameters (`LossSettings`, each range checked
here once). The objectives' own modules (`losses`, `cispo`) and their registry import them
from here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor

from .aggregate import AGGREGATIONS, AggMode, Count
from .kl import KL_ESTIMATORS, KLKind

Ratio = Literal["token", "sequence"]


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
    entropy: the live policy's per-token entropy (detached), where computed, else None.
    num_tokens, num_sequences: the loss tokens and the sequences with any, of the whole
        optimiser step (all micro-batches, all ranks): the normalisers.
    norm_constant: Dr. GRPO's constant (the generation budget, max_new_tokens).
    batch_stats: the objective's `stats`, summed over the mini-batch on every rank.
    rollout_weights: rollout correction's detached per-token weights (B, T) (w = pi_old / mu,
        truncated or masked), or None; they multiply the policy term of every objective's
        per-token loss before aggregation (`losses.kl_and_aggregate`), never the KL term.
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
    entropy: Tensor | None = None
    num_tokens: Count | None = None
    num_sequences: Count | None = None
    norm_constant: float | None = None
    batch_stats: Mapping[str, Tensor] = field(default_factory=dict)
    rollout_weights: Tensor | None = None
    row_ids: Tensor | None = None
    draw_seed: int | None = None


@dataclass(frozen=True)
class LossSettings:
    """The objective's parameters (docs/algorithms.md#config-keys), plain values.

    clip_low, clip_high: ratio bounds [1 - clip_low, 1 + clip_high]; 0 <= clip_low <= 1.
    dual_clip: c > 1 capping a negative advantage's loss at -c A, or None.
    agg: the aggregation (sample_mean, token_mean, token_sum_norm).
    kl_coef: the KL penalty's weight in the loss (0 when the KL is in the reward).
    kl_kind: its estimator (k1, k2, k3).
    ratio: "token" or "sequence" (GSPO).
    log_ratio_clamp: |log rho| bound, or None.
    tau_pos, tau_neg: SAPO's gate temperatures for A > 0 and A <= 0 (the paper: 1, 1.05).
    clip_cov_ratio, clip_cov_lb, clip_cov_ub: Clip-Cov's share of tokens cut and its cov
        band (verl: 2e-4, 1, 5).
    kl_cov_ratio, kl_cov_coef: KL-Cov's share of tokens penalised and the penalty's weight
        on |log rho| (verl: 2e-4, 1).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    agg: AggMode = "token_mean"
    kl_coef: float = 0.0
    kl_kind: KLKind = "k3"
    ratio: Ratio = "token"
    log_ratio_clamp: float | None = None
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-4
    kl_cov_coef: float = 1.0

    def __post_init__(self) -> None:
        for name, ok, expected in _RANGES:
            if not ok(self):
                raise ValueError(f"{name}: got {getattr(self, name)!r}, expected {expected}")


# Each setting's range, the one place it is checked (config load and every loss call).
# clip_low = 1 is the bound 0, which a ratio never crosses: no lower clip.
_RANGES: tuple[tuple[str, Callable[[LossSettings], bool], str], ...] = (
    ("clip_low", lambda s: 0.0 <= s.clip_low <= 1.0, "0 <= clip_low <= 1"),
    ("clip_high", lambda s: s.clip_high >= 0.0, ">= 0"),
    ("dual_clip", lambda s: s.dual_clip is None or s.dual_clip > 1.0, "none or > 1 (verl: 3)"),
    ("agg", lambda s: s.agg in AGGREGATIONS, f"one of {sorted(AGGREGATIONS)}"),
    ("kl_coef", lambda s: s.kl_coef >= 0.0, ">= 0"),
    ("kl_kind", lambda s: s.kl_kind in KL_ESTIMATORS, f"one of {sorted(KL_ESTIMATORS)}"),
    ("ratio", lambda s: s.ratio in ("token", "sequence"), "token or sequence"),
    (
        "log_ratio_clamp",
        lambda s: s.log_ratio_clamp is None or s.log_ratio_clamp > 0,
        "none or > 0",
    ),
    ("tau_pos", lambda s: s.tau_pos > 0, "> 0 (the paper: 1)"),
    ("tau_neg", lambda s: s.tau_neg > 0, "> 0 (the paper: 1.05)"),
    ("clip_cov_ratio", lambda s: 0 < s.clip_cov_ratio <= 1, "in (0, 1] (verl: 2e-4)"),
    ("clip_cov_ub", lambda s: s.clip_cov_ub > s.clip_cov_lb, "> clip_cov_lb (verl: 1 and 5)"),
    ("kl_cov_ratio", lambda s: 0 < s.kl_cov_ratio <= 1, "in (0, 1] (verl: 2e-4)"),
    ("kl_cov_coef", lambda s: s.kl_cov_coef >= 0, ">= 0 (verl: 1)"),
)
