"""GDPO (group reward-decoupled normalisation policy optimisation, arXiv 2601.05242; verl's
`gdpo` estimator; docs/algorithms.md#gdpo): with several rewards, each is normalised within its
group before they are combined, so one reward's scale cannot swamp another's.

For rewards k = 1..K with weights w_k, on response i of a group g:

    A_k,i = (r_k,i - mean_g(r_k)) / (std_g(r_k) + eps)     GRPO's advantage of reward k alone
    S_i   = sum_k w_k A_k,i
    A_i   = (S_i - mean(S)) / sqrt(var(S) + 1e-8)          over the valid tokens of the batch

GRPO normalises the weighted sum sum_k w_k r_k instead: a format reward of +-0.1 next to an
accuracy reward of +-1 then moves the advantage by about a tenth of what accuracy does, and a
group whose answers differ only in format gets a format-sized advantage that the std divides
up to +-1. Under GDPO every reward that varies within a group contributes advantages of unit
scale, times its weight. The last step is verl's `masked_whiten` over the batch's valid tokens
(each response weighs its length; unbiased variance, 1e-8 under the root): the whole step's
batch, all ranks (`global_sum`). A group whose reward k is all equal gets A_k = 0 exactly (as
`group_advantages`); a batch whose S is all equal, or with fewer than two valid tokens, gets
A = 0. std: "unbiased" (torch.std, verl's) or "population"; eps: verl's 1e-6.

This module is the combination (S and its whitening); `rlvr.algos.advantages` holds the whole
estimator (`gdpo_advantages`: each reward's group advantage, then `gdpo_combine`) and its
registry entry.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .gae import GlobalSum, masked_moments

WHITEN_EPS = 1e-8  # verl's masked_whiten


def gdpo_combine(
    per_reward: Tensor,
    weights: Sequence[float],
    response_mask: Tensor,
    *,
    global_sum: GlobalSum | None = None,
) -> Tensor:
    """(N,) A from each reward's group advantage `per_reward` (K, N) and their `weights` (K,):
    S = sum_k w_k A_k whitened over the valid tokens of `response_mask` (N, T), every rank's
    through `global_sum` (module docstring); 0 for a batch whose S has no spread."""
    if len(weights) != per_reward.shape[0]:
        raise ValueError(f"{len(weights)} weights for {per_reward.shape[0]} rewards")
    w = torch.tensor(list(weights), dtype=per_reward.dtype, device=per_reward.device)
    summed = (w[:, None] * per_reward).sum(dim=0)  # (N,)
    mask = response_mask.bool()
    tokens = summed.unsqueeze(1).expand(mask.shape)
    mean, var, n = masked_moments(tokens, mask, global_sum=global_sum)
    if var == 0.0 or n < 2:  # S - mean is rounding noise: the batch has no spread
        return torch.zeros_like(summed)
    return ((summed.double() - mean) / (var + WHITEN_EPS) ** 0.5).to(summed.dtype)
