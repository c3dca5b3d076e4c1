"""The update: advantages, old/reference log-probs, and mu x mini-batch x micro-batch steps."""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import torch

from rlvr.algos import off_policy_mask as opm
from rlvr.algos import rollout_correction as rc
from rlvr.algos.advantages import reward_advantages
from rlvr.algos.gae import GlobalSum
from rlvr.config.algorithm import Algorithm
from rlvr.run.distributed import Dist, is_sharded
from rlvr.training.batch import Batch, Sample
from rlvr.training.micro import (
    MicroResult,
    batch_stats,
    computed_positions,
    cut,
    loss_counts,
    micro_log_probs,
    micro_loss,
)
from rlvr.training.micro_batches import by_sequences
from rlvr.training.settings import UpdateContext


def advantages(
    batch: Batch, algorithm: Algorithm, group_size: int, global_sum: GlobalSum | None = None
) -> torch.Tensor:
    """(N,) A_i from each whole group's rewards (never per mini-batch), one per response; under
    GDPO from each sample's reward terms, whitened over the step's tokens on every rank
    (`global_sum`)."""
    rewards = torch.tensor([s.reward for s in batch.samples], dtype=torch.float32)
    if not len(batch):
        return rewards
    if not algorithm.gdpo_terms:
        return algorithm.group_advantages(rewards, group_size)
    return algorithm.group_advantages(
        rewards, group_size, _terms(batch, algorithm), batch.model_mask(), global_sum
    )


def _terms(batch: Batch, algorithm: Algorithm) -> dict[str, torch.Tensor]:
    """GDPO's reward terms (N,) by name, those every sample of the batch has."""
    out = {}
    for name, _ in algorithm.gdpo_terms:
        values = [(s.reward_terms or {}).get(name) for s in batch.samples]
        if all(v is not None for v in values):
            out[name] = torch.tensor(values, dtype=torch.float32)
    return out


def gdpo_metrics(batch: Batch, algorithm: Algorithm, group_size: int) -> dict[str, float]:
    """GDPO's per-reward metrics: the mean |A_k| of each reward's own group advantage over this
    rank's samples (0 where a reward never varies within a group); none for other estimators."""
    if not algorithm.gdpo_terms or not len(batch):
        return {}
    terms = _terms(batch, algorithm)
    names = [name for name, _ in algorithm.gdpo_terms if name in terms]
    if not names:
        return {}
    per = reward_advantages(torch.stack([terms[k] for k in names]), group_size, std=algorithm.std)
    return {f"gdpo/{k}/abs_mean": float(a.abs().mean()) for k, a in zip(names, per)}


def _micro_batches(samples: list[Sample], size: int, share_prompt: bool = False) -> list[list[int]]:
    """Micro-batches of at most `size` sequences (`rlvr.training.micro_batches.by_sequences`)."""
    return by_sequences(samples, size, share_prompt)


@torch.no_grad()
def batch_log_probs(model, batch: Batch, u: UpdateContext) -> torch.Tensor:
    """(N, T) fp32 log-probs of every response token under `model`'s weights (the old policy
    or the reference), 0 past each response's length; T = `batch.width`."""
    out = torch.zeros(len(batch), batch.width)
    for rows in cut(batch.samples, u.settings, model):
        mb, (lp, _) = micro_log_probs(model, [batch.samples[i] for i in rows], u)
        mask = mb.response_mask.bool()
        out[rows, : lp.shape[1]] = torch.where(mask, lp, 0.0).cpu()
    return out


def _dummy(pad_id: int) -> Batch:
    """A one-token, fully masked micro-batch: loss 0, gradient 0. A rank with nothing to
    train in a mini-batch runs it so that every rank joins the gradient all-reduce."""
    return Batch([Sample.placeholder(pad_id)], 0, torch.zeros(1))


def policy_update(batch: Batch, u: UpdateContext, optimizer, scheduler) -> dict[str, float]:
    """mu passes x mini-batches x micro-batches; one optimiser step per mini-batch.

    `batch`: this rank's share of the step's groups, with its advantages (and old and
    reference log-probs where they are needed). Mini-batches split the step's global groups,
    so every rank takes the same optimiser steps. `u`: the step's model, training module
    (DDP-wrapped), pad id, device, CPU backend, algorithm and settings.

    The module is in training mode for the loss forwards (dropout and LoRA dropout act,
    gradient checkpointing recomputes), and back in eval mode after."""
    module = u.module
    was_training = module.training
    module.train()
    try:
        sums = _Sums()
        for epoch in range(u.settings.mu):
            _epoch(u, batch, (optimizer, scheduler), sums, first=epoch == 0)
        return sums.metrics(u.d, scheduler)
    finally:
        module.train(was_training)


class _Sums:
    """What the update's metrics add up over micro-batches, mini-batches and ranks."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.ratio_max, self.diff_max, self.is_max = -math.inf, -math.inf, -math.inf
        self.grad_norms: list[float] = []
        self.nonfinite = self.steps = 0

    def add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value

    def micro(self, r: MicroResult, first: bool) -> None:
        n = r.out.metrics.get("num_tokens", r.loss_tokens)  # the tokens its means are over
        for key, v in r.out.metrics.items():
            if key == "ratio_max":  # an objective's metrics combine as LossOutput documents
                self.ratio_max = max(self.ratio_max, v) if n else self.ratio_max
            elif key in ("log_ratio_clamped", "num_tokens"):
                self.add(key, v)  # counts add up
            else:
                self.add(key, v * n)  # token-weighted mean
        self.add("loss", r.out.loss.item())
        self.add("tokens", n)
        self.add("entropy", r.entropy_sum)
        self.add("entropy_tokens", r.generated_tokens)
        if first:  # every response once, against the policy that sampled it
            diff_sum, diff_max, diff_n, k3_sum = r.logprob_diff or (0.0, -math.inf, 0.0, 0.0)
            self.add("logprob_diff", diff_sum)
            self.add("mismatch_kl_k3", k3_sum)
            self.add("logprob_diff_tokens", diff_n)
            if diff_n:
                self.diff_max = max(self.diff_max, diff_max)
            for key, v in (r.correction or {}).items():  # rollout correction's sums and max
                if key == rc.MAX_KEY:
                    self.is_max = max(self.is_max, v)
                else:
                    self.add(key, v)
        for key, v in (r.masked or {}).items():  # every pass: the mask follows the live policy
            self.add(key, v)

    def metrics(self, d: Dist, scheduler) -> dict[str, float]:
        keys = sorted(self.sums)
        total = dict(zip(keys, d.sum([self.sums[k] for k in keys])))
        tokens = max(total.pop("tokens", 0.0), 1.0)
        entropy = total.pop("entropy", 0.0) / max(total.pop("entropy_tokens", 0.0), 1.0)
        diff_sum, diff_n = total.pop("logprob_diff", 0.0), total.pop("logprob_diff_tokens", 0.0)
        k3_sum = total.pop("mismatch_kl_k3", 0.0)
        computed, real = total.pop("positions", 0.0), total.pop("real_positions", 0.0)
        correction = {k: total.pop(k) for k in list(total) if k.startswith("is/")}
        masked = {k: total.pop(k) for k in list(total) if k.startswith("opsm/")}
        counts = {"loss", "log_ratio_clamped", "num_tokens"}
        out = {k: v / tokens for k, v in total.items() if k not in counts}
        out["entropy"] = entropy
        out["log_ratio_clamped"] = total.get("log_ratio_clamped", 0.0)
        out["loss_tokens"] = total.get("num_tokens", 0.0)
        out["loss"] = total.get("loss", 0.0) / max(self.steps, 1)
        ratio_max = d.max(self.ratio_max)
        out["ratio_max"] = ratio_max if ratio_max > -math.inf else 1.0
        diff_max = d.max(self.diff_max)
        if diff_n > 0:  # the engine reported its log-probs (fast, vllm)
            out["rollout/logprob_diff_mean"] = diff_sum / diff_n
            out["rollout/logprob_diff_max"] = diff_max
            out["rollout/mismatch_kl_k3"] = k3_sum / diff_n
        if correction:  # every rank has these keys when the run corrects
            out.update(rc.correction_metrics(correction, d.max(self.is_max)))
        if masked:  # every rank has these keys when the run masks
            out.update(opm.sequence_mask_metrics(masked))
        norms = self.grad_norms
        out["grad_norm"] = sum(norms) / len(norms) if norms else float("nan")
        out["optimizer_steps"] = self.steps - self.nonfinite
        out["nonfinite_updates"] = self.nonfinite
        out["lr"] = scheduler.get_last_lr()[0]
        # padded positions over all positions the training forwards computed
        out["train/padding_frac"] = 1.0 - real / computed if computed else 0.0
        return out


def _epoch(u: UpdateContext, batch: Batch, optim: tuple, sums: _Sums, first: bool) -> None:
    """One pass over the batch: an optimiser step per mini-batch of the step's groups.
    `optim`: the optimiser and its learning-rate scheduler."""
    optimizer, scheduler = optim
    s, d, model, module = u.settings, u.d, u.model, u.module
    per_mini = max(1, math.ceil(batch.num_groups / s.mini_batches))
    for start in range(0, batch.num_groups, per_mini):
        mini = batch.rows(batch.in_groups(start, start + per_mini))
        num_tokens, num_sequences = d.sum(loss_counts(mini.samples, s.overlong_filter))
        step = replace(u, num_tokens=num_tokens, num_sequences=num_sequences)
        micros = [mini.rows(r) for r in cut(mini.samples, s, model)]
        sums.add("positions", 0.0)  # every rank reduces the same keys, with samples or none
        sums.add("real_positions", 0.0)
        for micro in micros:
            computed, real = computed_positions(micro.samples, s, model)
            sums.add("positions", computed)
            sums.add("real_positions", real)
        micros = micros or [_dummy(u.pad_id)]
        if is_sharded(model):  # FSDP2 communicates in every forward/backward: equal counts
            micros += [_dummy(u.pad_id)] * (int(d.max(len(micros))) - len(micros))
        stats = batch_stats(step, micros, int(getattr(scheduler, "last_epoch", 0)))
        for k, micro in enumerate(micros):
            # DDP all-reduces on the last micro-batch only; the others accumulate locally.
            last = k == len(micros) - 1
            ddp_accumulate = d.enabled and not last and hasattr(module, "no_sync")
            with module.no_sync() if ddp_accumulate else contextlib.nullcontext():
                r = micro_loss(micro, step, stats)
                # The loss is already normalised by global counts: undo DDP's averaging.
                (r.out.loss * d.world_size).backward()
            sums.micro(r, first)
        _optimizer_step(model, s.max_grad_norm, optimizer, scheduler, sums)


def _optimizer_step(model, max_grad_norm: float, optimizer, scheduler, sums: _Sums) -> None:
    """Clip (`max_grad_norm`; 0: no clip), then step, unless the gradient is not finite (on
    any rank): then the update is dropped and the weights kept."""
    clip = max_grad_norm if max_grad_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
        grad_norm = grad_norm.full_tensor()
    if torch.isfinite(grad_norm):
        optimizer.step()
        scheduler.step()  # the schedule counts optimiser steps actually taken
        sums.grad_norms.append(float(grad_norm))
    else:
        sums.nonfinite += 1
    optimizer.zero_grad(set_to_none=True)
    sums.steps += 1
