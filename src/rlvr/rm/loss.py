"""Reward-model losses over a batch of scored responses (logits r_i, rule labels y_i).

pointwise (BCE): mean_i [ -y_i log sigmoid(r_i) - (1 - y_i) log(1 - sigmoid(r_i)) ];
token-level (token_bce): the pointwise loss at every response token, each token's logit (the
    prediction after reading the text up to it) against the response's label, averaged over
    each response's tokens, then over responses (Cobbe et al. 2021, "Training Verifiers to
    Solve Math Word Problems": a verifier trained at every token beats one trained at the
    last; the last token's logit is still the score);
prefix-value (prefix_bce): the same per-token loss against each prefix's Monte Carlo value,
    the share of the prompt's sampled responses that begin with that prefix and are correct
    (Math-Shepherd's soft label, Wang et al. 2023, arXiv 2312.08935, with the group's own
    samples as the completions): a shared opening is worth the group's accuracy, and the
    target falls to 0 at the first token only wrong responses contain, so the loss points at
    the token where a response went wrong. At the last token it is the response's label;
pairwise (Bradley-Terry): over every pair (i, j) of the same group with y_i = 1, y_j = 0,
    mean_(i,j) -log sigmoid(r_i - r_j) (InstructGPT's reward-model loss; a group with no
    such pair contributes nothing).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))


def token_bce_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logits, mask: (B, W), mask 1 on each response's tokens; targets: (B,) labels, one per
    response, or (B, W) per-token targets in [0, 1]."""
    y = targets.to(logits.dtype)
    y = y[:, None].expand_as(logits) if y.dim() == 1 else y
    per_token = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
    m = mask.to(logits.dtype)
    return ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).mean()


def prefix_values(
    responses: list[list[int]], labels: list[bool], groups: list[int]
) -> list[list[float]]:
    """Per response, per token j: the mean label of the same group's responses whose first
    j + 1 tokens equal this one's (the response itself included)."""
    tally: dict[tuple, list[float]] = {}
    for r, y, g in zip(responses, labels, groups, strict=True):
        for j in range(len(r)):
            t = tally.setdefault((g, tuple(r[: j + 1])), [0.0, 0.0])
            t[0] += float(y)
            t[1] += 1.0
    out = []
    for r, g in zip(responses, groups, strict=True):
        out.append([s / n for s, n in (tally[(g, tuple(r[: j + 1]))] for j in range(len(r)))])
    return out


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
    raise ValueError(f"reward-model loss {kind!r}: expected bce, token_bce, prefix_bce or bt")
