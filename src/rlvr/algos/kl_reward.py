"""The per-token reward of PPO for language models and its KL coefficient
(docs/algorithms.md#ppo).

InstructGPT (Ouyang et al. 2022) and Ziegler et al. 2019 (arXiv 1909.08593) put the KL
penalty into the reward, token by token, instead of into the loss as GRPO does:

    r_t  = -beta * KL_t         on every valid token (KL_t estimated from old and ref log-probs)
    r_T += s                    s = the sequence's score, T = its last valid token

beta is fixed, or adapted after each step towards a target KL (`AdaptiveKLController`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .gae import masked_floats
from .kl import KL_ESTIMATORS, KLKind


def last_valid_index(mask: Tensor) -> Tensor:
    """(B,) index of each row's last valid token; -1 for an all-masked row."""
    m = mask if mask.dtype == torch.bool else mask != 0
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)
    return torch.where(m, positions, torch.full_like(positions, -1)).amax(dim=1)


def kl_penalized_rewards(
    scores: Tensor,
    mask: Tensor,
    *,
    log_probs: Tensor | None = None,
    ref_log_probs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind = "k1",
) -> tuple[Tensor, Tensor]:
    """Token rewards r (B, T) and the per-token KL estimate (B, T) they were penalised with.

    Args:
        scores: (B,) sequence scores s (verifier or reward model).
        mask: (B, T) valid tokens.
        log_probs: (B, T) log pi_old of the sampled tokens (the policy that sampled them);
            ref_log_probs: (B, T) log pi_ref. Both or neither; with neither, or kl_coef 0
            and no reference, r is the score alone and the KL is 0.
        kl_coef: beta >= 0.
        kl_kind: estimator from KL_ESTIMATORS; k1 = log pi_old - log pi_ref (verl's and
            OpenRLHF's default "kl" penalty) by default, k3 for a non-negative estimate.

    An all-masked row (e.g. an overlong-filtered response) gets r = 0: it has no token to
    carry its score. Masked positions are 0 in both outputs; garbage there is ignored.
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_kind {kl_kind!r}; valid: {sorted(KL_ESTIMATORS)}")
    if (log_probs is None) != (ref_log_probs is None):
        raise ValueError("give both log_probs and ref_log_probs, or neither")
    if scores.shape != mask.shape[:1]:
        raise ValueError(
            f"scores has shape {tuple(scores.shape)}, expected {tuple(mask.shape[:1])}"
        )
    if not torch.isfinite(scores).all():
        bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
        raise ValueError(f"non-finite score at index {bad[:10]}")
    m = mask if mask.dtype == torch.bool else mask != 0
    if log_probs is None:
        kl = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    else:
        m, (lp, ref) = masked_floats(
            mask, ("log_probs", log_probs), ("ref_log_probs", ref_log_probs)
        )
        kl = torch.where(m, KL_ESTIMATORS[kl_kind](lp, ref), torch.zeros((), dtype=lp.dtype))
    rewards = -kl_coef * kl
    last = last_valid_index(m)
    rows = (last >= 0).nonzero().flatten()
    rewards[rows, last[rows]] += scores[rows].to(rewards.dtype)
    return rewards, kl


@dataclass
class FixedKLController:
    """beta stays `value` for the whole run."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


@dataclass
class AdaptiveKLController:
    """Ziegler et al. 2019's target-KL rule (InstructGPT, verl `AdaptiveKLController`):

        e    = clip(current_kl / target - 1, -0.2, 0.2)
        beta = beta * (1 + e * n_steps / horizon)

    after each rollout step, with current_kl the step's mean KL per valid token and n_steps
    the samples (responses) it held. beta rises when the policy drifts past the target and
    falls below it; the clip bounds each step's relative change to 0.2 * n_steps / horizon.
    """

    value: float
    target: float
    horizon: float

    def __post_init__(self) -> None:
        if not (self.value >= 0 and self.target > 0 and self.horizon > 0):
            raise ValueError(
                f"need kl_coef >= 0, target > 0, horizon > 0; got {self.value}, "
                f"{self.target}, {self.horizon}"
            )

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


KLController = FixedKLController | AdaptiveKLController
