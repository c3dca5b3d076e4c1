"""The math of GRPO, DAPO and neighbours as pure functions over tensors.

This package imports torch and the standard library only, each module when one of its names
is first asked for: `rlvr.algos.settings`, which the config layer reads for the objectives'
defaults, imports no torch. docs/algorithms.md holds the formulas; each function's docstring
repeats its own, with the paper and the edge cases. Tensors are (B, T) = responses x
completion tokens; a group's G responses are contiguous rows.

One dict per family lists the valid names for the config layer: ADVANTAGES (each entry takes an
AdvantageInputs), KL_ESTIMATORS, AGGREGATIONS, OBJECTIVES (each entry's fn takes LossInputs and
its settings, LossSettings or the subclass declaring its own; `register_objective` adds one).
`clip` covers PPO-clip, GRPO, DAPO and Dr. GRPO through its settings (clip bounds, `agg`),
`gspo` the sequence ratio; `policy_loss` is `clip` with keyword arguments.
"""

from __future__ import annotations

import importlib
import sys
import types

# Each public name and the module that defines it, imported on first use.
_WHERE = {
    "AdaptiveKLController": "kl_reward",
    "AdvantageInputs": "advantages",
    "ADVANTAGES": "advantages",
    "AdvantageScale": "advantages",
    "AggMode": "settings",
    "aggregate": "aggregate",
    "AGGREGATIONS": "aggregate",
    "ClipCovSettings": "cov",
    "discounted_returns": "gae",
    "distill_advantages": "distill",
    "distill_sums": "distill",
    "DistillSums": "distill",
    "dr_grpo_advantages": "advantages",
    "binary_kl": "dppo",
    "dppo_loss": "dppo",
    "DynamicSamplingBuffer": "sampling",
    "DynamicSamplingResult": "sampling",
    "equal_reward_groups": "advantages",
    "explained_from_parts": "value",
    "explained_variance": "value",
    "FixedKLController": "kl_reward",
    "gae": "gae",
    "gae_advantages": "advantages",
    "gdpo_advantages": "advantages",
    "GlobalSum": "gae",
    "group_advantages": "advantages",
    "keep_groups": "sampling",
    "keep_groups_with_spread": "sampling",
    "kl_estimate": "kl",
    "KL_ESTIMATORS": "kl",
    "kl_k1": "kl",
    "kl_k2": "kl",
    "kl_k3": "kl",
    "kl_penalized_rewards": "kl_reward",
    "KLController": "kl_reward",
    "KLCovSettings": "cov",
    "KLKind": "settings",
    "last_valid_index": "kl_reward",
    "LossInputs": "objectives",
    "LossOutput": "loss_inputs",
    "LossSettings": "settings",
    "masked_moments": "gae",
    "masked_whiten": "gae",
    "Objective": "objectives",
    "OBJECTIVES": "objectives",
    "off_policy_keep": "off_policy_mask",
    "overlong_filter_mask": "shaping",
    "policy_loss": "losses",
    "pooled_explained_variance": "value",
    "Ratio": "settings",
    "refill_size": "sampling",
    "register_objective": "objectives",
    "reinforce_pp_advantages": "advantages",
    "rloo_advantages": "advantages",
    "sample_mean": "aggregate",
    "SapoSettings": "sapo",
    "setting": "settings",
    "soft_overlong_penalty": "shaping",
    "StdKind": "advantages",
    "surprise_features": "value",
    "TOKEN_LEVEL": "advantages",
    "token_mean": "aggregate",
    "token_sum_norm": "aggregate",
    "value_loss": "value",
    "variance_parts": "value",
}

__all__ = sorted(_WHERE)


class _Package(types.ModuleType):
    """The package, whose `gae` and `aggregate` are the functions of those names: the import
    system binds a submodule as the package's attribute when it is imported, which would
    hide the function; that binding is skipped for these names (the module stays in
    sys.modules)."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and _WHERE.get(name) == name:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
