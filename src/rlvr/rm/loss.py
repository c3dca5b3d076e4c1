"""Reward-model losses over a batch of scored responses (logits r_i, rule labels y_i).

pointwise (BCE): mean_i [ -y_i log sigmoid(r_i) - (1 - y_i) log(1 - sigmoid(r_i)) ];
pairwise (Bradley-Terry): over every pair (i, j) of the same group with y_i = 1, y_j = 0,
    mean_(i,j) -log sigmoid(r_i - r_j) (InstructGPT's reward-model loss; a group with no
    such pair contributes nothing).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))


def pair_mask(labels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """(B, B) bool: [i, j] when i and j share a group, i is correct and j is not."""
    y = labels.bool()
    return (groups[:, None] == groups[None, :]) & y[:, None] & ~y[None, :]


def bradley_terry_loss(
    logits: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor
) -> torch.Tensor | None:
    """The mean pairwise loss, or None when the batch holds no (correct, wrong) pair."""
    mask = pair_mask(labels, groups)
    if not mask.any():
        return None
    diff = logits[:, None] - logits[None, :]
    return F.softplus(-diff)[mask].mean()  # -log sigmoid(x) = softplus(-x)


def rm_loss(kind: str, logits, labels, groups) -> torch.Tensor | None:
    if kind == "bce":
        return bce_loss(logits, labels)
    if kind == "bt":
        return bradley_terry_loss(logits, labels, groups)
    raise ValueError(f"reward-model loss {kind!r}: expected bce or bt")
