"""The registry of policy objectives (docs/algorithms.md#adding-an-objective): `Objective`,
`OBJECTIVES` by name, the decorator that adds one (`register_objective`), and the contract
the update calls every objective under (`Objective.__call__`).

An objective is a pure function `fn(inputs: LossInputs, settings: LossSettings) -> LossOutput`
registered under a name where it is defined; `algo.loss` names one, or a user's
`module:function` of the same signature. The update calls it once per micro-batch with that
micro-batch's tensors and the whole optimiser step's counts (`num_tokens`, `num_sequences`),
so an objective that divides by them gives, summed over micro-batches and ranks, the
whole-batch loss and gradient.

Rollout weights. Rollout correction's weights and the off-policy sequence mask reach every
objective as one detached (B, T) tensor, `inputs.rollout_weights` (None when both are off),
that multiplies the per-token policy term, never the KL term. An objective declares how it
takes them (`rollout_weights=` at registration, or a `rollout_weights` attribute of a user's
function):

    "framework"  the default: the update applies them. The objective is called with
                 A'_t = w_t A_t on the valid tokens and `rollout_weights` None
                 (`toolkit.weighted_advantages`): its policy term times w_t wherever that
                 term is positively homogeneous in the advantage (f(w A) = w f(A), w >= 0),
                 as -rho A, -clip(rho) A and -sg(w) A log pi are.
    "own"        it multiplies its per-token policy term by them itself (every built-in does,
                 in `toolkit.kl_and_aggregate`); it is called with them as they are.
    "refused"    it cannot take them: `algo.rollout_correction` and
                 `algo.off_policy_mask_threshold` are refused with it when the config loads.

Either way they act exactly once: an objective that hands its inputs on to another (as
W-REINFORCE hands them to `clip`) hands on inputs whose weights the update already cleared,
or, declaring "own", the weights themselves for the other to apply.

Selections that depend on the whole mini-batch (a covariance, a quantile of the entropy) come
from an objective's optional `stats` function: `stats(inputs) -> dict[str, Tensor]` of sums,
run without gradient over every micro-batch before the loss pass (its inputs carry no
rollout weights); the update adds them up over micro-batches and ranks and hands the totals
to every micro-batch's loss as `inputs.batch_stats`. Sums of per-token quantities (count,
sum, sum of squares, a histogram) compose exactly this way. A selection that needs
statistics of statistics (a covariance centred on the mini-batch's means) declares `stages`
instead: a sequence of `stage(inputs, totals) -> dict`, each run over every micro-batch given
the totals of the ones before it (the first gets {}), their totals merged; a stage's value
may also be `cov.Largest` (its k largest (key, id) rows over micro-batches and ranks, not a
sum). The update also puts its `draw_seed` into the totals (`DRAW_SEED`) for an objective's
random choices.

Each objective declares its settings next to its function: the shared `LossSettings`, or a
subclass with parameters of its own (`SapoSettings`: tau_pos, tau_neg), and the shared ones it
has no use for (`unused`), which are refused away from their defaults, not ignored. The config's
`algo` section takes each objective's own settings as keys (`algo.tau_pos`), with the defaults,
ranges and refusals of the declaration (`rlvr.config.objective`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Literal, get_args

from torch import Tensor

from ..loss_inputs import LossInputs, LossOutput, LossSettings
from ..settings import SHARED, own_fields
from .toolkit import weighted_advantages

DRAW_SEED = "draw_seed"


ObjectiveFn = Callable[[LossInputs, LossSettings], LossOutput]
StatsFn = Callable[[LossInputs], dict[str, Tensor]]
StageFn = Callable[[LossInputs, Mapping[str, Tensor]], dict]
StagesFn = Callable[[LossSettings], tuple[StageFn, ...]]
CheckFn = Callable[[LossSettings], None]
RolloutWeights = Literal["framework", "own", "refused"]


@dataclass(frozen=True)
class Objective:
    """A registered objective: its loss function; its settings class (`LossSettings` or a
    subclass declaring its own parameters) and the shared settings it has no use for; for
    whole-batch selections its sums (or, given the settings, its stages of them); a check
    across settings beyond their ranges (ValueError "field: got ..., expected ..."); and how
    it takes rollout weights (module docstring). Call it, not its `fn`, for the contract."""

    name: str
    fn: ObjectiveFn
    stats: StatsFn | None = None
    check: CheckFn | None = None
    stages: StagesFn | None = None
    settings: type[LossSettings] = LossSettings
    unused: tuple[str, ...] = ()
    rollout_weights: RolloutWeights = "framework"

    def __post_init__(self) -> None:
        if self.rollout_weights not in get_args(RolloutWeights):
            raise ValueError(
                f"objective {self.name!r}: rollout_weights: got {self.rollout_weights!r}, "
                f"expected one of {list(get_args(RolloutWeights))}"
            )

    def __call__(self, inputs: LossInputs, settings: LossSettings) -> LossOutput:
        """The objective's loss on one micro-batch, `inputs.rollout_weights` applied exactly
        once: by the objective itself ("own"), or folded into the advantages first."""
        if inputs.rollout_weights is None or self.rollout_weights == "own":
            return self.fn(inputs, settings)
        if self.rollout_weights == "refused":
            raise ValueError(f"objective {self.name!r} declares it cannot take rollout weights")
        return self.fn(weighted_advantages(inputs), settings)

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
    """The objectives rlvr registers itself, by name (a user's module may have added more)."""
    return sorted(
        (o for o in OBJECTIVES.values() if o.fn.__module__.startswith("rlvr.algos.")),
        key=lambda o: o.name,
    )


def register_objective(
    name: str,
    *,
    settings: type[LossSettings] = LossSettings,
    unused: tuple[str, ...] = (),
    stats: StatsFn | None = None,
    check: CheckFn | None = None,
    stages: StagesFn | None = None,
    rollout_weights: RolloutWeights = "framework",
):
    """Decorator: `@register_objective("name", settings=MySettings)` over fn(inputs, settings)
    -> LossOutput, where `settings` is an instance of MySettings (a frozen dataclass
    subclassing LossSettings whose fields are declared with `rlvr.algos.settings.setting`).
    `rollout_weights`: "framework" (the update applies them), "own" or "refused" (module
    docstring).
    A name is registered once: registering it again from another function is an error, not an
    override (the same module's same function, imported again or a notebook cell run again,
    replaces it), and so is an own setting another registered objective declares."""

    def add(fn: ObjectiveFn) -> ObjectiveFn:
        if name in OBJECTIVES and not _same_definition(OBJECTIVES[name].fn, fn):
            raise ValueError(f"objective {name!r} is already registered")
        objective = Objective(
            name, fn, stats, check, stages, settings, tuple(unused), rollout_weights
        )
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
