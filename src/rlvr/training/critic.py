"""PPO's critic: a scalar value head on a causal LM's backbone, its optimiser and its update
(docs/algorithms.md#ppo).

The backbone is a copy of the policy's starting weights (`model.name_or_path`) by default, or
the causal LM at `critic.model`; its language-model head is dropped and a Linear(hidden, 1)
head (fp32) predicts V for every response token. V_t is read from the hidden state at the
position whose logits score token t (the state before token t was generated), as verl and
OpenRLHF do. `critic.arch=surprise` adds a Linear(2, 1) (fp32, starting at 0) over the
reference model's lowest and mean log-prob of the response's own tokens before t
(`surprise_features`, from the step's reference log-probs). Under LoRA the backbone gets
adapters with the policy's LoRA settings and only they and the heads train. The critic has its own AdamW (`critic.lr`, `critic.weight_decay`),
gradient clipping (`critic.max_grad_norm`), and the policy's mu x mini-batch x micro-batch
schedule with losses normalised by the whole step's token count, so N ranks and any
micro-batching compute the same update.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlvr.algos import surprise_features, value_loss
from rlvr.run.distributed import full_state, gathered, is_sharded
from rlvr.training.batch import Batch, Sample, collate
from rlvr.training.micro_batches import by_tokens
from rlvr.training.settings import CriticContext


class ValueModel(nn.Module):
    """A transformer backbone (no LM head), a scalar value head and, for
    `critic.arch=surprise`, a linear readout of `surprise_features`."""

    def __init__(self, backbone: nn.Module, hidden_size: int, seed: int, surprise: bool = False):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1, dtype=torch.float32)
        self.surprise = nn.Linear(2, 1, dtype=torch.float32) if surprise else None
        if self.surprise is not None:  # a = 0, b = 0: it starts as the plain head
            nn.init.zeros_(self.surprise.weight)
            nn.init.zeros_(self.surprise.bias)
        # Its own generator: the head's initialisation leaves the run's RNG streams alone.
        # Small weights (OpenRLHF's std 1 / (H + 1)) and a zero bias: V starts near 0.
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            w = torch.randn(self.value_head.weight.shape, generator=g) / (hidden_size + 1)
            self.value_head.weight.copy_(w)
            self.value_head.bias.zero_()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        prompt_width: int,
        width: int,
        features: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, width) fp32 values of the response tokens of a `collate`d micro-batch;
        `features`: (B, width, 2) `surprise_features` (with `critic.arch=surprise`)."""
        hidden = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).last_hidden_state
        states = hidden[:, prompt_width - 1 : prompt_width - 1 + width]  # (B, T, H)
        values = self.value_head(states.float()).squeeze(-1)
        if self.surprise is None:
            return values
        if features is None:
            raise RuntimeError("critic.arch=surprise: the value model needs surprise_features")
        return values + self.surprise(features.float()).squeeze(-1)


@dataclass
class Critic:
    """The value model, the module its training forward runs through (DDP-wrapped or
    FSDP2-sharded when distributed) and its optimiser."""

    model: ValueModel
    module: nn.Module
    optimizer: torch.optim.Optimizer

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds (a collective under FSDP2: every rank calls it): the
        trainable weights (the head, and the backbone or its LoRA adapters) and the
        optimiser state, keyed by parameter name."""
        weights, optimizer = full_state(self.model, self.optimizer)
        weights = weights if weights is not None else self.model.state_dict()
        keep = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {
            "weights": {k: v.detach().cpu() for k, v in weights.items() if k in keep},
            "optimizer": optimizer,
        }


def _micro_batches(rows: list[int], samples: list[Sample], c: CriticContext) -> list[list[int]]:
    """The critic's micro-batches of `rows` (padded, `collate`): by optim.micro_batch_tokens
    when set (`rlvr.training.micro_batches.by_tokens`), else by micro_batch_sequences."""
    if c.micro_batch_tokens > 0:
        cut = by_tokens([samples[i] for i in rows], c.micro_batch_tokens)
        return [[rows[k] for k in m] for m in cut]
    size = c.micro_batch_sequences
    order = sorted(rows, key=lambda i: len(samples[i].prompt_ids) + len(samples[i].completion_ids))
    return [order[i : i + size] for i in range(0, len(order), size)]


def _forward(
    module: nn.Module,
    samples: list[Sample],
    c: CriticContext,
    features: torch.Tensor | None = None,
) -> torch.Tensor:
    """Values of `samples` (collated here); `features`: their rows of the step's
    (N, T, 2) `surprise_features`, cut to the micro-batch's width."""
    mb = collate(samples, c.pad_id, c.device)
    width = mb.response_mask.shape[1]
    if features is not None:
        features = features[:, :width].to(c.device)
    return module(mb.input_ids, mb.attention_mask, mb.position_ids, mb.prompt_width, width,
                  features)  # fmt: skip


def critic_features(batch: Batch, c: CriticContext) -> torch.Tensor | None:
    """(N, T, 2) `surprise_features` of the batch's reference log-probs over each
    response's own tokens, for `critic.arch=surprise`; None for the plain head."""
    if not c.surprise:
        return None
    if batch.ref_log_probs is None:
        raise RuntimeError("critic.arch=surprise: the step has no reference log-probs")
    ref = batch.ref_log_probs
    return surprise_features(ref, batch.model_mask(ref.shape[1]))


@torch.no_grad()
def predict_values(
    critic: Critic,
    samples: list[Sample],
    width: int,
    c: CriticContext,
    features: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N, width) V of every response token at rollout time (V_old), 0 past each length;
    `features`: (N, width, 2) from `critic_features` (critic.arch=surprise)."""
    out = torch.zeros(len(samples), width)
    with gathered(critic.model):  # FSDP2: whole weights, so ranks may run different counts
        for rows in _micro_batches(list(range(len(samples))), samples, c):
            f = None if features is None else features[rows]
            v = _forward(critic.model, [samples[i] for i in rows], c, f).float()
            for k, i in enumerate(rows):
                n = len(samples[i].completion_ids)
                out[i, :n] = v[k, :n].cpu()
    return out


@dataclass(frozen=True)
class CriticTargets:
    """Per-row tensors of the step, (N, T) on the CPU: V at rollout time, the GAE returns and
    the tokens that train the critic; (N, T, 2) `surprise_features` for critic.arch=surprise."""

    old_values: torch.Tensor
    returns: torch.Tensor
    mask: torch.Tensor
    features: torch.Tensor | None = None


def critic_update(
    critic: Critic,
    samples: list[Sample],
    num_groups: int,
    targets: CriticTargets,
    c: CriticContext,
) -> dict[str, float]:
    """mu passes x mini-batches (of whole groups, in the step's global group order: one
    optimiser step each) x micro-batches of the clipped value loss. Returns the step's
    critic metrics: vf_loss (mean over optimiser steps), vf_clipfrac (token-weighted),
    grad_norm (mean), optimizer_steps."""
    was_training = critic.module.training
    critic.module.train()
    try:
        return _update(critic, samples, num_groups, targets, c)
    finally:
        critic.module.train(was_training)


def _update(critic, samples, num_groups, targets, c: CriticContext) -> dict[str, float]:
    d = c.d
    per_mini = max(1, math.ceil(num_groups / c.mini_batches))
    loss_sum, clip_tokens, tokens, grad_norms, steps = 0.0, 0.0, 0.0, [], 0
    for _ in range(c.mu):
        for lo in range(0, num_groups, per_mini):
            rows = [i for i, s in enumerate(samples) if lo <= s.group < lo + per_mini]
            (n_tok,) = d.sum([float(targets.mask[rows].sum())])
            micros = _micro_batches(rows, samples, c) or [[]]
            if is_sharded(critic.model):  # every forward is a collective: equal counts
                micros += [[]] * (int(d.max(len(micros))) - len(micros))
            for k, micro in enumerate(micros):
                last = k == len(micros) - 1
                accumulate = d.enabled and not last and hasattr(critic.module, "no_sync")
                with critic.module.no_sync() if accumulate else contextlib.nullcontext():
                    out = _micro_loss(critic, [samples[i] for i in micro], micro, targets,
                                      n_tok, c)  # fmt: skip
                    (out.loss * d.world_size).backward()  # undo DDP's mean: global counts
                loss_sum += out.metrics["vf_loss"]
                clip_tokens += out.metrics["vf_clipfrac"] * out.metrics["num_tokens"]
                tokens += out.metrics["num_tokens"]
            clip = c.max_grad_norm if c.max_grad_norm > 0 else math.inf
            norm = torch.nn.utils.clip_grad_norm_(critic.model.parameters(), clip)
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            if torch.isfinite(norm):
                critic.optimizer.step()
                grad_norms.append(float(norm))
            critic.optimizer.zero_grad(set_to_none=True)
            steps += 1
    loss_sum, clip_tokens, tokens = d.sum([loss_sum, clip_tokens, tokens])
    return {
        "vf_loss": loss_sum / max(steps, 1),
        "vf_clipfrac": clip_tokens / max(tokens, 1.0),
        "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
        "optimizer_steps": float(len(grad_norms)),
    }


def _micro_loss(critic, chosen: list[Sample], micro: list[int], targets, n_tok, c: CriticContext):
    """The micro-batch's value loss normalised by the mini-batch's global token count;
    `chosen`: the samples of the rows `micro` (none: a placeholder with no loss)."""
    device = c.device
    rows = micro or [0]
    batch = chosen if micro else [Sample.placeholder(c.pad_id)]
    idx = torch.tensor(rows, dtype=torch.long)
    features = targets.features
    if features is not None:
        features = features[idx] if micro else torch.zeros(1, 1, features.shape[-1])
    values = _forward(critic.module, batch, c, features)
    T = values.shape[1]

    def cut(t: torch.Tensor) -> torch.Tensor:
        out = t[idx, :T] if len(t) else torch.zeros(1, T)
        return out.to(device) if micro else torch.zeros_like(out, device=device)

    return value_loss(
        values,
        cut(targets.old_values),
        cut(targets.returns),
        cut(targets.mask),
        clip=c.value_clip,
        num_tokens=n_tok,
    )
