"""Off-policy sequence masking (DeepSeek-V3.2, arXiv 2512.02556, eq. 9; TRL's
`off_policy_mask_threshold`; docs/algorithms.md#off-policy-sequence-masking): a response with a
negative advantage whose sampling policy has drifted too far from the live one is left out of
the policy loss. It applies to any objective.

Per response i with valid tokens m_t, mu the policy that sampled it (the engine's log-probs,
or pi_old's where the engine reports none) and pi_theta the live policy (detached):

    kl_i = sum_t m_t (log mu(o_t) - log pi_theta(o_t)) / max(1, sum_t m_t)
    keep_{i,t} = A_{i,t} >= 0  or  kl_i <= delta                       delta = the threshold

kl_i is the k1 estimate of KL(mu || pi_theta) on mu's own samples. A token log-prob that is NaN
(one the engine could not score) counts 0 in the sum, as in TRL. The keep mask multiplies the
policy term of the per-token loss, beside rollout correction's weights (`rollout_weights`);
a dropped response keeps its tokens in the normaliser and its KL-to-reference term, as TRL
does. Negative advantages are the ones masked: pushing down a response the live policy would
no longer produce is the update that destabilises (the paper), while a positive one only
reinforces. Per-token advantages (gae) are tested per token. The decision is per response, so
it is the same however a batch is split into micro-batches.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from .loss_inputs import LossInputs

SUM_KEYS = ("opsm/sequences", "opsm/masked", "opsm/kl_sum")


def sequence_kl(behaviour_log_probs: Tensor, log_probs: Tensor, mask: Tensor) -> Tensor:
    """(B,) the mean over each row's valid tokens of log mu - log pi_theta (0 for an empty
    row); masked positions may hold garbage."""
    mask = mask.bool()
    diff = torch.nan_to_num(behaviour_log_probs.to(log_probs.dtype) - log_probs.detach(), nan=0.0)
    diff = torch.where(mask, diff, torch.zeros((), dtype=diff.dtype, device=diff.device))
    return diff.sum(dim=1) / mask.sum(dim=1).clamp_min(1).to(diff.dtype)


def off_policy_keep(advantages: Tensor, seq_kl: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """(B, T) bool: the tokens kept (module docstring), False off the mask. `advantages`:
    (B,) per response or (B, T) per token."""
    mask = mask.bool()
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    keep = (adv >= 0) | (seq_kl.unsqueeze(1) <= threshold)
    return keep.expand_as(mask) & mask


def with_sequence_mask(
    inputs: LossInputs, threshold: float | None
) -> tuple[LossInputs, dict[str, float] | None]:
    """`inputs` with the keep mask folded into `rollout_weights` (created as 0/1 weights where
    rollout correction is off), and this call's sums (SUM_KEYS: rows with valid tokens, rows
    masked, the sum of their kl_i); unchanged and None when `threshold` is None."""
    if threshold is None:
        return inputs, None
    mask = inputs.response_mask.bool()
    behaviour = inputs.behaviour_log_probs
    behaviour = inputs.old_log_probs if behaviour is None else behaviour.to(mask.device)
    seq_kl = sequence_kl(behaviour, inputs.log_probs, mask)
    keep = off_policy_keep(inputs.advantages.to(seq_kl.dtype), seq_kl, mask, threshold)
    rows = mask.any(dim=1)
    masked = rows & (mask & ~keep).any(dim=1)
    w = keep.to(seq_kl.dtype)
    if inputs.rollout_weights is not None:
        w = w * inputs.rollout_weights.detach().to(w.dtype)
    sums = torch.stack(
        [rows.sum().double(), masked.sum().double(), seq_kl[rows].double().sum()]
    ).tolist()
    return replace(inputs, rollout_weights=w.detach()), dict(zip(SUM_KEYS, sums))


def sequence_mask_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The step's metrics from SUM_KEYS summed over micro-batches and ranks: the share of
    responses masked and the mean kl_i (0 without responses)."""
    n = sums.get("opsm/sequences", 0.0)
    if n <= 0:
        return {"rollout/off_policy_masked_frac": 0.0, "rollout/off_policy_seq_kl": 0.0}
    return {
        "rollout/off_policy_masked_frac": sums.get("opsm/masked", 0.0) / n,
        "rollout/off_policy_seq_kl": sums.get("opsm/kl_sum", 0.0) / n,
    }
