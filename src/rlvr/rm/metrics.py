"""A reward model against the rule's labels: accuracy at logit 0 and ROC AUC."""

from __future__ import annotations

import torch


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float | None:
    """P(score of a random correct response > score of a random wrong one), ties counted
    one half (the Mann-Whitney U statistic over the average ranks); None without both kinds."""
    y = labels.bool()
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    s = scores.double()
    order = torch.argsort(s)
    ranks = torch.empty_like(s)
    ranks[order] = torch.arange(1, len(s) + 1, dtype=torch.float64)
    for value in torch.unique(s):  # ties share their average rank
        tied = s == value
        if int(tied.sum()) > 1:
            ranks[tied] = ranks[tied].mean()
    u = float(ranks[y].sum()) - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)


def agreement(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of responses where the reward model's verdict (logit > 0) is the rule's."""
    if len(labels) == 0:
        return float("nan")
    return float(((logits > 0) == labels.bool()).float().mean())


def rm_metrics(logits: torch.Tensor, labels: torch.Tensor, well_formed: torch.Tensor) -> dict:
    """accuracy, auc, and auc_well_formed (among responses that pass the format check, so it
    measures correctness rather than format), with the counts they rest on."""
    wf = well_formed.bool()
    return {
        "accuracy": agreement(logits, labels),
        "auc": auc(logits, labels),
        "auc_well_formed": auc(logits[wf], labels[wf]),
        "responses": len(labels),
        "correct_frac": float(labels.float().mean()) if len(labels) else float("nan"),
        "well_formed": int(wf.sum()),
        "well_formed_correct_frac": float(labels[wf].float().mean()) if wf.any() else float("nan"),
    }
