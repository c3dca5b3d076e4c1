"""The parameters an objective is called with, each declared once: its default, its range and
its documentation in one place (docs/algorithms.md#adding-an-objective).

`LossSettings` holds the settings every objective shares (the ratio's clip bounds, the
aggregation, the loss's KL). An objective with parameters of its own declares them in a
subclass next to its function (`SapoSettings` in `rlvr.algos.sapo`) and registers the two
together (`rlvr.algos.objectives.register_objective`); the config's `algo` section, its
defaults, its ranges and its refusals all derive from these declarations. A field is declared
with `setting(default, ok, expected)`: `ok(value)` is its range test and `expected` what an
error says was expected; a check across fields is the class's `check` method.

This module imports no torch: the config layer reads the defaults from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Literal, get_args

AggMode = Literal["sample_mean", "token_mean", "token_sum_norm"]
KLKind = Literal["k1", "k2", "k3"]
Ratio = Literal["token", "sequence"]


def setting(default: Any, ok: Callable[[Any], bool] | None = None, expected: str = "") -> Any:
    """A settings field: its default, the test `ok(value)` its value passes (None: any value
    of its type), and the range an error names ("clip_low: got 2.0, expected 0 <= clip_low
    <= 1")."""
    return field(default=default, metadata={"ok": ok, "expected": expected})


def one_of(kind: Any) -> Callable[[Any], bool]:
    """The range test of a Literal-typed setting: one of its values."""
    return lambda v: v in get_args(kind)


def default_of(f: Field) -> Any:
    """A settings field's declared default."""
    return f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]


@dataclass(frozen=True)
class LossSettings:
    """The objective's parameters (docs/algorithms.md#config-keys), plain values.

    clip_low: ratio bounds [1 - clip_low, 1 + clip_high]; 0 <= clip_low <= 1 (1: no lower bound).
    clip_high: the upper bound's eps (DAPO's clip-higher: 0.28).
    dual_clip: c > 1 capping a negative advantage's loss at -c A, or None.
    agg: the aggregation (sample_mean, token_mean, token_sum_norm).
    kl_coef: the KL penalty's weight in the loss (0 when the KL is in the reward).
    kl_kind: its estimator (k1, k2, k3).
    ratio: "token" or "sequence" (GSPO).
    log_ratio_clamp: |log rho| bound, or None.
    """

    clip_low: float = setting(0.2, lambda v: 0.0 <= v <= 1.0, "0 <= clip_low <= 1")
    clip_high: float = setting(0.2, lambda v: v >= 0.0, ">= 0")
    dual_clip: float | None = setting(None, lambda v: v is None or v > 1.0, "none or > 1 (verl: 3)")
    agg: AggMode = setting("token_mean", one_of(AggMode), f"one of {sorted(get_args(AggMode))}")
    kl_coef: float = setting(0.0, lambda v: v >= 0.0, ">= 0")
    kl_kind: KLKind = setting("k3", one_of(KLKind), f"one of {sorted(get_args(KLKind))}")
    ratio: Ratio = setting("token", one_of(Ratio), "token or sequence")
    log_ratio_clamp: float | None = setting(None, lambda v: v is None or v > 0, "none or > 0")

    def __post_init__(self) -> None:
        for f in fields(self):
            ok, value = f.metadata.get("ok"), getattr(self, f.name)
            if ok is not None and not ok(value):
                raise ValueError(f"{f.name}: got {value!r}, expected {f.metadata['expected']}")
        self.check()

    def check(self) -> None:
        """A check across fields, after each field's range (a subclass's own); raises
        ValueError "field: got ..., expected ..."."""


SHARED = frozenset(f.name for f in fields(LossSettings))
"""The settings every objective is called with; the rest of a subclass's fields are its own."""


def own_fields(settings: type[LossSettings]) -> tuple[Field, ...]:
    """The fields a settings class declares beyond the shared ones."""
    return tuple(f for f in fields(settings) if f.name not in SHARED)
