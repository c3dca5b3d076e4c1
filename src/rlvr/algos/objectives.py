"""The registry of policy objectives (docs/algorithms.md#adding-an-objective).

An objective is a pure function `fn(inputs: LossInputs, settings: LossSettings) -> LossOutput`
registered under a name; `algo.loss` names one, or a user's `module:function` of the same
signature. The update calls it once per micro-batch with that micro-batch's tensors and the
whole optimiser step's counts (`num_tokens`, `num_sequences`), so an objective that divides by
them gives, summed over micro-batches and ranks, the whole-batch loss and gradient.

Selections that depend on the whole mini-batch (a covariance, a quantile of the entropy) come
from an objective's optional `stats` function: `stats(inputs) -> dict[str, Tensor]` of sums,
run without gradient over every micro-batch before the loss pass; the update adds them up over
micro-batches and ranks and hands the totals to every micro-batch's loss as
`inputs.batch_stats`. Sums of per-token quantities (count, sum, sum of squares, a histogram)
compose exactly this way.

Registered here:
    clip  the clipped surrogate of PPO, GRPO, DAPO (clip-higher) and Dr. GRPO (its
          normaliser is `agg="token_sum_norm"`), token ratio, optional dual clip and
          log-ratio clamp (`rlvr.algos.losses`)
    gspo  the same with GSPO's sequence ratio (`settings.ratio` is "sequence" for it)
    cispo CISPO's clipped stop-gradient importance weight on every token (`rlvr.algos.cispo`)
    sapo  SAPO's soft gate sigmoid(tau (rho - 1)) 4 / tau instead of a clip (`rlvr.algos.sapo`)
    gmpo  GMPO's clipped geometric mean of the token ratios per response (`rlvr.algos.gmpo`)

Each objective refuses the settings it has no use for (its `check`): an off-by-default one
(dual_clip, ratio=sequence) when it is on, a valued one (the clip bounds, SAPO's taus) when it
differs from its default (`unused_at_default`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from torch import Tensor

from .aggregate import AGGREGATIONS, AggMode, Count
from .cispo import check_cispo, cispo_loss
from .gmpo import check_gmpo, gmpo_loss
from .kl import KL_ESTIMATORS, KLKind
from .losses import LossOutput, Ratio, clipped_surrogate_loss
from .sapo import check_sapo, sapo_loss


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
)


def unused_at_default(settings: LossSettings, fields: tuple[str, ...], objective: str) -> None:
    """ValueError "field: got ..., expected <default> (unused by <objective>)" for the first of
    `fields` that differs from LossSettings' default: a setting the objective ignores."""
    default = LossSettings()
    for name in fields:
        value = getattr(settings, name)
        if value != getattr(default, name):
            want = getattr(default, name)
            raise ValueError(f"{name}: got {value!r}, expected {want!r} (unused by {objective})")


_TAUS = ("tau_pos", "tau_neg")


ObjectiveFn = Callable[[LossInputs, LossSettings], LossOutput]
StatsFn = Callable[[LossInputs], dict[str, Tensor]]


CheckFn = Callable[[LossSettings], None]


@dataclass(frozen=True)
class Objective:
    """A registered objective: its loss function, for whole-batch selections its sums, and
    a check of the settings it refuses (ValueError "field: got ..., expected ...")."""

    name: str
    fn: ObjectiveFn
    stats: StatsFn | None = None
    check: CheckFn | None = None


OBJECTIVES: dict[str, Objective] = {}
"""Objectives by name (`algo.loss`); each entry's fn(LossInputs, LossSettings) -> LossOutput."""


def register_objective(name: str, *, stats: StatsFn | None = None, check: CheckFn | None = None):
    """Decorator: `@register_objective("name")` over fn(inputs, settings) -> LossOutput.
    A name is registered once; a second registration is an error, not an override."""

    def add(fn: ObjectiveFn) -> ObjectiveFn:
        if name in OBJECTIVES:
            raise ValueError(f"objective {name!r} is already registered")
        OBJECTIVES[name] = Objective(name, fn, stats, check)
        return fn

    return add


def _only(objective: str, fields: tuple[str, ...], own: CheckFn | None = None) -> CheckFn:
    """The check of `objective`: its own refusals, then `fields` at their defaults."""

    def check(settings: LossSettings) -> None:
        if own is not None:
            own(settings)
        unused_at_default(settings, fields, objective)

    return check


@register_objective("clip", check=_only("clip", _TAUS))
def clip(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """PPO's clipped surrogate with DAPO's decoupled bounds, per settings.ratio."""
    return clipped_surrogate_loss(inputs, settings)


@register_objective("gspo", check=_only("gspo", _TAUS))
def gspo(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """GSPO (arXiv 2507.18071): the clipped surrogate over the sequence ratio s_i."""
    return clipped_surrogate_loss(inputs, replace(settings, ratio="sequence"))


@register_objective("cispo", check=_only("cispo", _TAUS, check_cispo))
def cispo(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(clip(rho)) A log pi on every token."""
    return cispo_loss(inputs, settings)


@register_objective("sapo", check=_only("sapo", ("clip_low", "clip_high"), check_sapo))
def sapo(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """SAPO (arXiv 2511.20347): -sigmoid(tau (rho - 1)) 4 / tau A per token, no clip."""
    return sapo_loss(inputs, settings)


@register_objective("gmpo", check=_only("gmpo", _TAUS, check_gmpo))
def gmpo(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """GMPO (arXiv 2507.20673): -A_i exp(mean_t clipped log rho_t) per response."""
    return gmpo_loss(inputs, settings)
