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
compose exactly this way. A selection that needs statistics of statistics (a covariance
centred on the mini-batch's means) declares `stages` instead: a sequence of
`stage(inputs, totals) -> dict`, each run over every micro-batch given the totals of the ones
before it (the first gets {}), their totals merged; a stage's value may also be
`cov.Largest` (its k largest (key, id) rows over micro-batches and ranks, not a sum). The
update also puts its `draw_seed` into the totals (`DRAW_SEED`) for an objective's random
choices.

Registered here:
    clip  the clipped surrogate of PPO, GRPO, DAPO (clip-higher) and Dr. GRPO (its
          normaliser is `agg="token_sum_norm"`), token ratio, optional dual clip and
          log-ratio clamp (`rlvr.algos.losses`)
    gspo  the same with GSPO's sequence ratio (`settings.ratio` is "sequence" for it)
    cispo CISPO's clipped stop-gradient importance weight on every token (`rlvr.algos.cispo`)
    sapo  SAPO's soft gate sigmoid(tau (rho - 1)) 4 / tau instead of a clip (`rlvr.algos.sapo`)
    gmpo  GMPO's clipped geometric mean of the token ratios per response (`rlvr.algos.gmpo`)
    clip_cov, kl_cov  the entropy-mechanism paper's covariance-selected tokens: cut at random
          from PPO's clipped loss, or given a |log rho| penalty (`rlvr.algos.cov`)

Each objective refuses the settings it has no use for (its `check`): an off-by-default one
(dual_clip, ratio=sequence) when it is on, a valued one (the clip bounds, SAPO's taus) when it
differs from its default (`unused_at_default`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from torch import Tensor

from .cispo import check_cispo, cispo_loss
from .cov import check_cov, clip_cov_loss, clip_cov_stages, kl_cov_loss, kl_cov_stages
from .gmpo import check_gmpo, gmpo_loss
from .loss_inputs import LossInputs, LossSettings
from .losses import LossOutput, clipped_surrogate_loss
from .sapo import check_sapo, sapo_loss


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
_CLIP_COV = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")
_KL_COV = ("kl_cov_ratio", "kl_cov_coef")
_COV = _CLIP_COV + _KL_COV
DRAW_SEED = "draw_seed"


ObjectiveFn = Callable[[LossInputs, LossSettings], LossOutput]
StatsFn = Callable[[LossInputs], dict[str, Tensor]]
StageFn = Callable[[LossInputs, Mapping[str, Tensor]], dict]
StagesFn = Callable[[LossSettings], tuple[StageFn, ...]]


CheckFn = Callable[[LossSettings], None]


@dataclass(frozen=True)
class Objective:
    """A registered objective: its loss function, for whole-batch selections its sums (or,
    given the settings, its stages of them), and a check of the settings it refuses
    (ValueError "field: got ..., expected ...")."""

    name: str
    fn: ObjectiveFn
    stats: StatsFn | None = None
    check: CheckFn | None = None
    stages: StagesFn | None = None


OBJECTIVES: dict[str, Objective] = {}
"""Objectives by name (`algo.loss`); each entry's fn(LossInputs, LossSettings) -> LossOutput."""


def register_objective(
    name: str,
    *,
    stats: StatsFn | None = None,
    check: CheckFn | None = None,
    stages: StagesFn | None = None,
):
    """Decorator: `@register_objective("name")` over fn(inputs, settings) -> LossOutput.
    A name is registered once; a second registration is an error, not an override."""

    def add(fn: ObjectiveFn) -> ObjectiveFn:
        if name in OBJECTIVES:
            raise ValueError(f"objective {name!r} is already registered")
        OBJECTIVES[name] = Objective(name, fn, stats, check, stages)
        return fn

    return add


def _only(objective: str, fields: tuple[str, ...], own: CheckFn | None = None) -> CheckFn:
    """The check of `objective`: its own refusals, then `fields` at their defaults."""

    def check(settings: LossSettings) -> None:
        if own is not None:
            own(settings)
        unused_at_default(settings, fields, objective)

    return check


@register_objective("clip", check=_only("clip", _TAUS + _COV))
def clip(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """PPO's clipped surrogate with DAPO's decoupled bounds, per settings.ratio."""
    return clipped_surrogate_loss(inputs, settings)


@register_objective("gspo", check=_only("gspo", _TAUS + _COV))
def gspo(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """GSPO (arXiv 2507.18071): the clipped surrogate over the sequence ratio s_i."""
    return clipped_surrogate_loss(inputs, replace(settings, ratio="sequence"))


@register_objective("cispo", check=_only("cispo", _TAUS + _COV, check_cispo))
def cispo(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(clip(rho)) A log pi on every token."""
    return cispo_loss(inputs, settings)


@register_objective("sapo", check=_only("sapo", ("clip_low", "clip_high", *_COV), check_sapo))
def sapo(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """SAPO (arXiv 2511.20347): -sigmoid(tau (rho - 1)) 4 / tau A per token, no clip."""
    return sapo_loss(inputs, settings)


@register_objective("gmpo", check=_only("gmpo", _TAUS + _COV, check_gmpo))
def gmpo(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """GMPO (arXiv 2507.20673): -A_i exp(mean_t clipped log rho_t) per response."""
    return gmpo_loss(inputs, settings)


def _cov_check(name: str):
    return lambda settings: check_cov(settings, name)


@register_objective(
    "clip_cov",
    check=_only("clip_cov", _TAUS + _KL_COV, _cov_check("clip_cov")),
    stages=clip_cov_stages,
)
def clip_cov(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """Clip-Cov (arXiv 2505.22617): PPO's clipped loss, k random high-cov tokens cut."""
    return clip_cov_loss(inputs, settings)


@register_objective(
    "kl_cov",
    check=_only("kl_cov", ("clip_low", "clip_high", *_TAUS, *_CLIP_COV), _cov_check("kl_cov")),
    stages=kl_cov_stages,
)
def kl_cov(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """KL-Cov (arXiv 2505.22617): -A rho, plus k |log rho| on the top-k tokens by cov."""
    return kl_cov_loss(inputs, settings)
