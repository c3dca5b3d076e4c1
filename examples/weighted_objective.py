"""A user's objective with a setting of its own, one module (docs/algorithms.md#adding-an-objective):

    rlvr train --algo.loss=examples/weighted_objective.py:weighted_reinforce --algo.positive_weight=0.1
    rlvr.train(config={"algo.loss": "examples/weighted_objective.py:weighted_reinforce",
                       "algo.positive_weight": 0.1})

W-REINFORCE ("The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning",
Zhu et al. 2025, arXiv 2506.01347): the positive samples' advantages are down-weighted by
lambda, the negative ones kept, inside PPO's clipped surrogate:

    A'_t = positive_weight * A_t  if A_t > 0,  else A_t
    L    = clip objective with A' (its clip bounds, aggregation and KL as configured)

positive_weight = 1 is the clip objective, 0 trains on the negative samples alone (the paper's
NSR); the paper takes 0.1. The setting is declared with its default and range next to the
function, so `algo.positive_weight` is a config key with them, refused under any other loss.

Rollout correction's weights and the off-policy mask act once: the update folds them into
the advantages before the call (the registration's default, `rollout_weights="framework"`) and
hands `clip` none to apply again.
"""

from dataclasses import dataclass, replace

import torch

from rlvr.algos import OBJECTIVES, LossInputs, LossOutput, LossSettings, register_objective, setting


@dataclass(frozen=True)
class WeightedSettings(LossSettings):
    """W-REINFORCE's own setting (the shared ones: LossSettings).

    positive_weight: lambda, the weight of positive advantages (1 = the clip objective, 0 =
        negative samples only; the paper: 0.1).
    """

    positive_weight: float = setting(0.1, lambda v: 0.0 <= v <= 1.0, "in [0, 1] (the paper: 0.1)")


@register_objective("weighted_reinforce", settings=WeightedSettings)
def weighted_reinforce(inputs: LossInputs, settings: WeightedSettings) -> LossOutput:
    adv = inputs.advantages
    weighted = torch.where(adv > 0, settings.positive_weight * adv, adv)
    out = OBJECTIVES["clip"](replace(inputs, advantages=weighted), settings)
    return LossOutput(out.loss, {**out.metrics, "positive_weight": settings.positive_weight})
