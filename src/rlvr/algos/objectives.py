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
    dppo_tv, dppo_kl  DPPO's mask from the binary total-variation or KL divergence of each
          token's probability (thresholds clip_low / clip_high, as verl reads them), with the
          plain policy gradient on the kept tokens (`rlvr.algos.dppo`)

Each objective declares its settings next to its function: the shared `LossSettings`, or a
subclass with parameters of its own (`SapoSettings`: tau_pos, tau_neg), and the shared ones it
has no use for (`unused`), which are refused away from their defaults, not ignored. The config's
`algo` section takes each objective's own settings as keys (`algo.tau_pos`), with the defaults,
ranges and refusals of the declaration (`rlvr.config.objective`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace

from torch import Tensor

from .cispo import cispo_loss
from .cov import (
    ClipCovSettings,
    KLCovSettings,
    clip_cov_loss,
    clip_cov_stages,
    kl_cov_loss,
    kl_cov_stages,
)
from .dppo import dppo_loss
from .gmpo import check_gmpo, gmpo_loss
from .loss_inputs import LossInputs, LossSettings
from .losses import LossOutput, clipped_surrogate_loss
from .sapo import SapoSettings, sapo_loss
from .settings import SHARED, own_fields

DRAW_SEED = "draw_seed"


ObjectiveFn = Callable[[LossInputs, LossSettings], LossOutput]
StatsFn = Callable[[LossInputs], dict[str, Tensor]]
StageFn = Callable[[LossInputs, Mapping[str, Tensor]], dict]
StagesFn = Callable[[LossSettings], tuple[StageFn, ...]]
CheckFn = Callable[[LossSettings], None]


@dataclass(frozen=True)
class Objective:
    """A registered objective: its loss function; its settings class (`LossSettings` or a
    subclass declaring its own parameters) and the shared settings it has no use for; for
    whole-batch selections its sums (or, given the settings, its stages of them); and a check
    across settings beyond their ranges (ValueError "field: got ..., expected ...")."""

    name: str
    fn: ObjectiveFn
    stats: StatsFn | None = None
    check: CheckFn | None = None
    stages: StagesFn | None = None
    settings: type[LossSettings] = LossSettings
    unused: tuple[str, ...] = ()

    def check_settings(self, settings: LossSettings) -> None:
        """ValueError "field: got ..., expected ..." for a shared setting this objective has
        no use for set away from its default, then the objective's own check."""
        for name in self.unused:
            value, default = getattr(settings, name), getattr(LossSettings, name)
            if value != default:
                raise ValueError(unused_message(name, value, default, self.name))
        if self.check is not None:
            self.check(settings)


def unused_message(name: str, value: object, default: object, objective: str) -> str:
    """ "field: got 2.0, expected 1.0 (unused by clip)": a setting `objective` ignores."""
    if default is None:
        return f"{name}: got {value!r}, expected none under {objective}"
    want = default if isinstance(default, str) else repr(default)
    return f"{name}: got {value!r}, expected {want} (unused by {objective})"


OBJECTIVES: dict[str, Objective] = {}
"""Objectives by name (`algo.loss`); each entry's fn(LossInputs, LossSettings) -> LossOutput."""


def builtin_objectives() -> list[Objective]:
    """The objectives rlvr registers itself (a user's module may have added more)."""
    return [o for o in OBJECTIVES.values() if o.fn.__module__.startswith("rlvr.algos.")]


def register_objective(
    name: str,
    *,
    settings: type[LossSettings] = LossSettings,
    unused: tuple[str, ...] = (),
    stats: StatsFn | None = None,
    check: CheckFn | None = None,
    stages: StagesFn | None = None,
):
    """Decorator: `@register_objective("name", settings=MySettings)` over fn(inputs, settings)
    -> LossOutput, where `settings` is an instance of MySettings (a frozen dataclass
    subclassing LossSettings whose fields are declared with `rlvr.algos.settings.setting`).
    A name is registered once: registering it again from another function is an error, not an
    override (the same module's same function, imported again or a notebook cell run again,
    replaces it), and so is an own setting another registered objective declares."""

    def add(fn: ObjectiveFn) -> ObjectiveFn:
        if name in OBJECTIVES and not _same_definition(OBJECTIVES[name].fn, fn):
            raise ValueError(f"objective {name!r} is already registered")
        objective = Objective(name, fn, stats, check, stages, settings, tuple(unused))
        _check_declaration(objective)
        OBJECTIVES[name] = objective
        return fn

    return add


def _same_definition(a: ObjectiveFn, b: ObjectiveFn) -> bool:
    def where(fn):
        return getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)

    return where(a) == where(b)


def _check_declaration(objective: Objective) -> None:
    """A registration's settings class and unused names, checked against the registry."""
    cls, name = objective.settings, objective.name
    if not (isinstance(cls, type) and issubclass(cls, LossSettings)):
        raise TypeError(f"objective {name!r}: settings must subclass LossSettings, got {cls!r}")
    bad = [u for u in objective.unused if u not in SHARED]
    if bad:
        raise ValueError(f"objective {name!r}: unused {bad} are not shared settings")
    for f in fields(cls):
        if f.name in SHARED and getattr(cls, f.name) != getattr(LossSettings, f.name):
            raise ValueError(f"objective {name!r}: {cls.__name__} redeclares shared {f.name!r}")
    for other in OBJECTIVES.values():
        if other.settings is cls or other.name == name:
            continue
        clash = {f.name for f in own_fields(cls)} & {f.name for f in own_fields(other.settings)}
        if clash:
            raise ValueError(f"objective {name!r}: settings {sorted(clash)} are {other.name}'s")


_TOKEN_ONLY = ("ratio", "dual_clip")
_NO_CLAMP = ("ratio", "dual_clip", "log_ratio_clamp")
_NO_CLIP = ("clip_low", "clip_high")


@register_objective("clip")
def clip(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """PPO's clipped surrogate with DAPO's decoupled bounds, per settings.ratio."""
    return clipped_surrogate_loss(inputs, settings)


@register_objective("gspo")
def gspo(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """GSPO (arXiv 2507.18071): the clipped surrogate over the sequence ratio s_i."""
    return clipped_surrogate_loss(inputs, replace(settings, ratio="sequence"))


@register_objective("cispo", unused=_TOKEN_ONLY)
def cispo(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(clip(rho)) A log pi on every token."""
    return cispo_loss(inputs, settings)


@register_objective("sapo", settings=SapoSettings, unused=_NO_CLIP + _TOKEN_ONLY)
def sapo(inputs: LossInputs, settings: SapoSettings) -> LossOutput:
    """SAPO (arXiv 2511.20347): -sigmoid(tau (rho - 1)) 4 / tau A per token, no clip."""
    return sapo_loss(inputs, settings)


@register_objective("gmpo", unused=_NO_CLAMP, check=check_gmpo)
def gmpo(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """GMPO (arXiv 2507.20673): -A_i exp(mean_t clipped log rho_t) per response."""
    return gmpo_loss(inputs, settings)


@register_objective("clip_cov", settings=ClipCovSettings, unused=_NO_CLAMP, stages=clip_cov_stages)
def clip_cov(inputs: LossInputs, settings: ClipCovSettings) -> LossOutput:
    """Clip-Cov (arXiv 2505.22617): PPO's clipped loss, k random high-cov tokens cut."""
    return clip_cov_loss(inputs, settings)


@register_objective(
    "kl_cov", settings=KLCovSettings, unused=_NO_CLIP + _NO_CLAMP, stages=kl_cov_stages
)
def kl_cov(inputs: LossInputs, settings: KLCovSettings) -> LossOutput:
    """KL-Cov (arXiv 2505.22617): -A rho, plus k |log rho| on the top-k tokens by cov."""
    return kl_cov_loss(inputs, settings)


@register_objective("dppo_tv", unused=("ratio",))
def dppo_tv(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """DPPO-Binary-TV (arXiv 2602.04879): -A sg(min(rho, C)) logp where |p - p_old| is
    within the threshold on the advantage's side, 0 elsewhere."""
    return dppo_loss(inputs, settings, "tv")


@register_objective("dppo_kl", unused=("ratio",))
def dppo_kl(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """DPPO-Binary-KL (arXiv 2602.04879): as dppo_tv with the binary KL of p_old and p."""
    return dppo_loss(inputs, settings, "kl")
