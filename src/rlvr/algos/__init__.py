"""The math of GRPO, DAPO and neighbours as pure functions over tensors.

This package imports torch and the standard library only. docs/algorithms.md holds the formulas;
each function's docstring repeats its own, with the paper and the edge cases. Tensors are
(B, T) = responses x completion tokens; a group's G responses are contiguous rows.

One dict per family lists the valid names for the config layer: ADVANTAGES (each entry takes an
AdvantageInputs), KL_ESTIMATORS, AGGREGATIONS, OBJECTIVES (each entry's fn takes LossInputs and
LossSettings; `register_objective` adds one). `clip` covers PPO-clip, GRPO, DAPO and Dr. GRPO
through its settings (clip bounds, `agg`), `gspo` the sequence ratio; `policy_loss` is `clip`
with keyword arguments.
"""

from .advantages import (
    ADVANTAGES,
    TOKEN_LEVEL,
    AdvantageInputs,
    AdvantageScale,
    StdKind,
    dr_grpo_advantages,
    equal_reward_groups,
    gae_advantages,
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from .aggregate import AGGREGATIONS, AggMode, aggregate, sample_mean, token_mean, token_sum_norm
from .gae import GlobalSum, discounted_returns, gae, masked_moments, masked_whiten
from .kl import KL_ESTIMATORS, KLKind, kl_estimate, kl_k1, kl_k2, kl_k3
from .kl_reward import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    kl_penalized_rewards,
    last_valid_index,
)
from .losses import LossOutput, Ratio, policy_loss
from .objectives import OBJECTIVES, LossInputs, LossSettings, Objective, register_objective
from .sampling import (
    DynamicSamplingBuffer,
    DynamicSamplingResult,
    keep_groups,
    keep_groups_with_spread,
    refill_size,
)
from .shaping import overlong_filter_mask, soft_overlong_penalty
from .value import (
    explained_from_parts,
    explained_variance,
    pooled_explained_variance,
    surprise_features,
    value_loss,
    variance_parts,
)

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "OBJECTIVES",
    "TOKEN_LEVEL",
    "AdaptiveKLController",
    "AdvantageInputs",
    "AdvantageScale",
    "AggMode",
    "DynamicSamplingBuffer",
    "DynamicSamplingResult",
    "FixedKLController",
    "GlobalSum",
    "KLController",
    "KLKind",
    "LossInputs",
    "LossOutput",
    "LossSettings",
    "Objective",
    "Ratio",
    "StdKind",
    "aggregate",
    "discounted_returns",
    "dr_grpo_advantages",
    "equal_reward_groups",
    "explained_from_parts",
    "explained_variance",
    "gae",
    "gae_advantages",
    "group_advantages",
    "keep_groups",
    "keep_groups_with_spread",
    "kl_estimate",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalized_rewards",
    "last_valid_index",
    "masked_moments",
    "masked_whiten",
    "overlong_filter_mask",
    "policy_loss",
    "pooled_explained_variance",
    "refill_size",
    "register_objective",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "sample_mean",
    "soft_overlong_penalty",
    "surprise_features",
    "token_mean",
    "token_sum_norm",
    "value_loss",
    "variance_parts",
]
