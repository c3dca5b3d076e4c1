"""Training a reward model on rule-labelled responses.

Batches are whole groups (every response to `batch_groups` prompts), so the Bradley-Terry
pairs of a prompt are always in one batch; the group order of epoch e is a permutation drawn
from (seed, e) alone, so step s of a run is the same computation whether or not the run was
stopped and resumed before it: `fit(..., start_step=s)` with the optimiser state of step s
continues it exactly. One AdamW step per batch, gradients clipped to norm 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from rlvr.rm.loss import prefix_values, rm_loss, token_bce_loss
from rlvr.rm.model import RewardModel
from rlvr.rm.records import Record
from rlvr.rollout import derive_seed


def group_batches(
    records: list[Record], batch_groups: int, seed: int, epoch: int
) -> list[list[int]]:
    """Record indices per batch for one epoch: the groups shuffled by (seed, epoch)."""
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(r.group, []).append(i)
    keys = sorted(groups)
    g = torch.Generator().manual_seed(derive_seed(seed, "rm-batches", epoch))
    order = [keys[int(k)] for k in torch.randperm(len(keys), generator=g)]
    return [
        [i for key in order[b : b + batch_groups] for i in groups[key]]
        for b in range(0, len(order), batch_groups)
    ]


def response_mask(attention_mask: torch.Tensor, starts: list[int]) -> torch.Tensor:
    """(B, W) 1 on each text's response tokens: from its start to its last valid token."""
    cols = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    first = torch.tensor(starts, device=attention_mask.device)[:, None]
    return attention_mask.bool() & (cols[None, :] >= first)


def make_optimizer(rm: RewardModel, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(rm.model.parameters(), lr=lr, weight_decay=0.0)


def steps_per_epoch(records: list[Record], batch_groups: int) -> int:
    return math.ceil(len({r.group for r in records}) / batch_groups)


def fit(
    rm: RewardModel,
    records: list[Record],
    optimizer: torch.optim.Optimizer,
    *,
    loss: str,
    epochs: int,
    batch_groups: int,
    seed: int,
    start_step: int = 0,
    on_step: Callable[[int, dict], bool | None] | None = None,
) -> int:
    """Train from step `start_step` to the end of `epochs`; returns the last step.
    `on_step(step, metrics)` after each optimiser step; returning True stops after it."""
    ids, starts = rm.encode_with_starts([r.prompt for r in records], [r.response for r in records])
    labels = torch.tensor([r.correct for r in records], dtype=torch.float32)
    groups = torch.tensor([r.group for r in records])
    if loss == "prefix_bce":
        values = prefix_values([x[s:] for x, s in zip(ids, starts, strict=True)],
                               [r.correct for r in records], [r.group for r in records])  # fmt: skip
    step = 0
    for epoch in range(epochs):
        for rows in group_batches(records, batch_groups, seed, epoch):
            step += 1
            if step <= start_step:
                continue
            rm.model.train()
            if loss in ("token_bce", "prefix_bce"):
                logits, mask = rm.forward_tokens([ids[i] for i in rows])
                mask = response_mask(mask, [starts[i] for i in rows])
                if loss == "prefix_bce":
                    targets = torch.zeros(logits.shape)
                    for k, i in enumerate(rows):
                        targets[k, starts[i] : len(ids[i])] = torch.tensor(values[i])
                else:
                    targets = labels[rows]
                value = token_bce_loss(logits, targets.to(logits.device), mask)
            else:
                logits = rm.forward([ids[i] for i in rows])
                y = labels[rows].to(logits.device)
                value = rm_loss(loss, logits, y, groups[rows].to(logits.device))
            if value is not None:
                optimizer.zero_grad(set_to_none=True)
                value.backward()
                torch.nn.utils.clip_grad_norm_(rm.model.parameters(), 1.0)
                optimizer.step()
            rm.model.eval()
            row = {"rm/loss": value.item() if value is not None else float("nan"),
                   "rm/epoch": epoch, "rm/batch_responses": len(rows)}  # fmt: skip
            if on_step is not None and on_step(step, row):
                return step
    return step
