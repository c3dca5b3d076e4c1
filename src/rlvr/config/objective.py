"""An objective's settings in the config (docs/algorithms.md#adding-an-objective).

The shared settings (`rlvr.algos.settings.LossSettings`: clip bounds, aggregation, the loss's
KL) are keys of the `algo` section with the same names. An objective's own settings, declared
in its settings class (`SapoSettings.tau_pos`), are keys of the `algo` section too
(`algo.tau_pos`), read into `AlgoConfig.loss_settings` with the declared type; their defaults
and ranges are the declaration's. Another objective's setting is accepted at its default (a
stored config that lists it) and refused away from it, naming the objective that ignores it.

These functions import the objectives (torch) only when a key beyond the section's own fields,
or a user's objective, asks for them.
"""

from __future__ import annotations

import contextlib
import typing
from dataclasses import Field, replace
from typing import TYPE_CHECKING, Any

from rlvr.config.schema import AlgoConfig, Config, ConfigError

if TYPE_CHECKING:
    from rlvr.algos.objectives import Objective
    from rlvr.algos.settings import LossSettings

OWN = "loss_settings"  # the AlgoConfig field holding an objective's own settings


def import_objective(loss: str, python_path: tuple[str, ...] = ()) -> None:
    """A user's objective ("module:function") imported, so the settings its module registers
    are known before the config's keys are read; a failure is left for `resolve_objective`,
    which names `algo.loss`."""
    if ":" not in loss:
        return
    from rlvr.config.callables import extend_sys_path, load_callable

    extend_sys_path(python_path)
    with contextlib.suppress(ValueError):
        load_callable(loss, "algo.loss")


def declared(key: str) -> tuple[str, Field, Any] | None:
    """(objective, field, type) of the registered objective whose settings declare `key` as
    their own, or None."""
    from rlvr.algos.objectives import OBJECTIVES
    from rlvr.algos.settings import own_fields

    for objective in OBJECTIVES.values():
        for f in own_fields(objective.settings):
            if f.name == key:
                return objective.name, f, typing.get_type_hints(objective.settings)[key]
    return None


def declared_names() -> list[str]:
    """Every registered objective's own settings, for a near miss's suggestion."""
    from rlvr.algos.objectives import OBJECTIVES
    from rlvr.algos.settings import own_fields

    return sorted({f.name for o in OBJECTIVES.values() for f in own_fields(o.settings)})


def resolve_objective(name: str, ratio: str = "token") -> Objective:
    """The registered objective `name` (`clip` with `ratio=sequence` is `gspo`), or the one a
    "module:function" names: registered by its module (with its settings), or a bare function
    of the shared settings (its `stats` / `check` / `rollout_weights` attributes taken)."""
    from rlvr.algos.objectives import OBJECTIVES, Objective

    if name in OBJECTIVES:
        return OBJECTIVES["gspo" if name == "clip" and ratio == "sequence" else name]
    if ":" not in name:
        raise ConfigError(
            f"algo.loss: got {name!r}, expected one of {sorted(OBJECTIVES)} or "
            "'module:function' / 'path/to/file.py:function'"
        )
    from rlvr.config.callables import load_callable

    try:
        fn = load_callable(name, "algo.loss")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for objective in OBJECTIVES.values():
        if objective.fn is fn:
            return objective
    weights = getattr(fn, "rollout_weights", "framework")
    try:
        return Objective(
            name, fn, getattr(fn, "stats", None), getattr(fn, "check", None),
            rollout_weights=weights,
        )  # fmt: skip
    except ValueError as e:
        raise ConfigError(f"algo.loss: {e}") from None


def loss_settings(objective: Objective, algo: AlgoConfig, kl_coef: float) -> LossSettings:
    """The objective's settings from the `algo` section: the shared ones from its fields
    (`kl_coef`: the loss's), its own from `algo.loss_settings` or their declared defaults.
    A ConfigError names the key out of range, or another objective's setting set away from
    its default."""
    from rlvr.algos.objectives import unused_message
    from rlvr.algos.settings import SHARED, default_of, own_fields

    own = {f.name for f in own_fields(objective.settings)}
    values = {name: getattr(algo, name) for name in SHARED} | {"kl_coef": kl_coef}
    for key, value in getattr(algo, OWN).items():
        if key in own:
            values[key] = value
            continue
        found = declared(key)
        if found is None:
            raise ConfigError(f"algo.{key}: no objective declares it (algo.loss={algo.loss})")
        default = default_of(found[1])
        if value != default:
            raise ConfigError("algo." + unused_message(key, value, default, objective.name))
    try:
        return objective.settings(**values)
    except ValueError as e:
        raise ConfigError(f"algo.{e}") from None


def with_declared_defaults(cfg: Config) -> Config:
    """`cfg` with every own setting of its objective present, the declared default where the
    config did not set it: what `rlvr config show` prints and config.yaml records."""
    from rlvr.algos.settings import default_of, own_fields

    objective = resolve_objective(cfg.algo.loss, cfg.algo.ratio)
    own = {f.name: default_of(f) for f in own_fields(objective.settings)}
    given = getattr(cfg.algo, OWN)
    return replace(cfg, algo=replace(cfg.algo, **{OWN: {**own, **given}}))
