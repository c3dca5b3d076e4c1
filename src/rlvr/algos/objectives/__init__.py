"""The policy objectives (docs/algorithms.md#adding-an-objective): what an objective is called
with and returns, the registry, and the toolkit the built-ins are written with.

    registry.py   Objective, OBJECTIVES, register_objective, and the contract: rollout
                  correction's weights and the off-policy mask act on every objective exactly
                  once, applied by the objective ("own") or by the update ("framework"), or
                  refused with it at config time ("refused")
    toolkit.py    the public pieces of an objective: check_inputs, masked_inputs, log_ratio,
                  kl_and_aggregate, policy_metrics, weighted_advantages

Each built-in is registered in the module that defines it:
    clip  the clipped surrogate of PPO, GRPO, DAPO (clip-higher) and Dr. GRPO (its
          normaliser is `agg="token_sum_norm"`), token ratio, optional dual clip and
          log-ratio clamp (`rlvr.algos.losses`)
    gspo  the same with GSPO's sequence ratio (`rlvr.algos.losses`)
    cispo CISPO's clipped stop-gradient importance weight on every token (`rlvr.algos.cispo`)
    sapo  SAPO's soft gate sigmoid(tau (rho - 1)) 4 / tau instead of a clip (`rlvr.algos.sapo`)
    gmpo  GMPO's clipped geometric mean of the token ratios per response (`rlvr.algos.gmpo`)
    clip_cov, kl_cov  the entropy-mechanism paper's covariance-selected tokens: cut at random
          from PPO's clipped loss, or given a |log rho| penalty (`rlvr.algos.cov`)
    dppo_tv, dppo_kl  DPPO's mask from the binary total-variation or KL divergence of each
          token's probability (thresholds clip_low / clip_high, as verl reads them), with the
          plain policy gradient on the kept tokens (`rlvr.algos.dppo`)
Importing this package registers them all.
"""

from __future__ import annotations

# Each built-in module registers its own objectives when imported.
from .. import cispo, cov, dppo, gmpo, losses, sapo
from ..loss_inputs import LossInputs, LossOutput, LossSettings
from .registry import (
    DRAW_SEED,
    OBJECTIVES,
    CheckFn,
    Objective,
    ObjectiveFn,
    RolloutWeights,
    StageFn,
    StagesFn,
    StatsFn,
    builtin_objectives,
    register_objective,
    unused_message,
)

__all__ = [
    "DRAW_SEED",
    "OBJECTIVES",
    "CheckFn",
    "LossInputs",
    "LossOutput",
    "LossSettings",
    "Objective",
    "ObjectiveFn",
    "RolloutWeights",
    "StageFn",
    "StagesFn",
    "StatsFn",
    "builtin_objectives",
    "register_objective",
    "unused_message",
]

del cispo, cov, dppo, gmpo, losses, sapo
