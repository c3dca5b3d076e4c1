"""The math of GRPO, DAPO and neighbours as pure functions over tensors.

This package imports torch and the standard library only. docs/algorithms.md holds the formulas;
each function's docstring repeats its own, with the paper and the edge cases. Tensors are
(B, T) = responses x completion tokens; a group's G responses are contiguous rows.

One dict per family lists the valid names for the config layer: ADVANTAGES, KL_ESTIMATORS,
AGGREGATIONS. There is no POLICY_LOSSES dict: the one loss, `policy_loss`, covers PPO-clip,
GRPO, DAPO, Dr. GRPO and GSPO through its keyword arguments (`ratio`, `agg`, clip bounds).
"""

from .advantages import (
    ADVANTAGES,
    AdvantageScale,
    StdKind,
    dr_grpo_advantages,
    equal_reward_groups,
    group_advantages,
    rloo_advantages,
)
from .aggregate import AGGREGATIONS, AggMode, aggregate, sample_mean, token_mean, token_sum_norm
from .kl import KL_ESTIMATORS, KLKind, kl_estimate, kl_k1, kl_k2, kl_k3
from .losses import LossOutput, Ratio, policy_loss
from .sampling import DynamicSamplingBuffer, DynamicSamplingResult, keep_groups, refill_size
from .shaping import overlong_filter_mask, soft_overlong_penalty

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "AdvantageScale",
    "AggMode",
    "DynamicSamplingBuffer",
    "DynamicSamplingResult",
    "KLKind",
    "LossOutput",
    "Ratio",
    "StdKind",
    "aggregate",
    "dr_grpo_advantages",
    "equal_reward_groups",
    "group_advantages",
    "keep_groups",
    "kl_estimate",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "overlong_filter_mask",
    "policy_loss",
    "refill_size",
    "rloo_advantages",
    "sample_mean",
    "soft_overlong_penalty",
    "token_mean",
    "token_sum_norm",
]
