"""The update: advantages, old/reference log-probs, and mu x mini-batch x micro-batch steps."""

from __future__ import annotations

import contextlib
import math

import torch

from rlvr import cpu
from rlvr.algos import ADVANTAGES, group_advantages, policy_loss
from rlvr.config import Config
from rlvr.models import autocast
from rlvr.run.distributed import Dist, is_sharded
from rlvr.train.batch import (
    Sample,
    collate,
    collate_shared,
    shared_token_log_probs,
    token_log_probs,
)


def assign_advantages(samples: list[Sample], cfg: Config) -> None:
    """A_i from each whole group's rewards (never per mini-batch), broadcast to its tokens."""
    if not samples:
        return
    G = cfg.rollout.group_size
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    a = cfg.algo
    if a.advantage == "grpo":
        adv = group_advantages(rewards, G, std=a.std)
    else:
        adv = ADVANTAGES[a.advantage](rewards, G)
    for s, v in zip(samples, adv.tolist()):
        s.advantage = v


def _valid_tokens(s: Sample, cfg: Config) -> int:
    """Tokens of a response that enter the loss: none for a truncated one under overlong
    filtering (it leaves the normaliser too, docs/algorithms.md#overlong-filtering)."""
    return 0 if (cfg.algo.overlong_filter and s.truncated) else len(s.completion_ids)


def _micro_batches(
    samples: list[Sample], size: int, share_prompt: bool = False
) -> list[list[Sample]]:
    """Micro-batches of at most `size` sequences. Sorted by total length so each pads only to
    similar lengths; with `share_prompt`, the samples of one prompt stay together (a prompt
    with more than `size` samples is split into chunks, each of which forwards it once), and
    the chunks, sorted by their longest sequence, are packed in order."""
    if not share_prompt:
        order = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
        return [order[i : i + size] for i in range(0, len(order), size)]
    by_prompt: dict[tuple[int, ...], list[Sample]] = {}
    for s in samples:
        by_prompt.setdefault(tuple(s.prompt_ids), []).append(s)
    chunks = []
    for same in by_prompt.values():
        same = sorted(same, key=lambda s: len(s.completion_ids))
        chunks += [same[i : i + size] for i in range(0, len(same), size)]
    chunks.sort(key=lambda c: len(c[0].prompt_ids) + len(c[-1].completion_ids))
    micros: list[list[Sample]] = []
    for c in chunks:
        if micros and len(micros[-1]) + len(c) <= size:
            micros[-1] += c
        else:
            micros.append(list(c))
    return micros


def _share(cfg: Config, model) -> bool:
    """Prompt sharing runs one or two forwards per micro-batch depending on its lengths; under
    FSDP2 every forward is a collective that all ranks must join, so there it stays off. It
    also needs the prompt's KV cache, which gradient checkpointing turns off."""
    o = cfg.optim
    return o.share_prompt and not o.gradient_checkpointing and not is_sharded(model)


def _log_probs(model, micro: list[Sample], cfg: Config, pad_id: int, device, backend, **kw):
    """The micro-batch collated, and its token log-probs (shared prompts or not)."""
    share = _share(cfg, model)
    mb = (collate_shared if share else collate)(micro, pad_id, device)
    score = shared_token_log_probs if share else token_log_probs
    # The CPU backend's native passes (rlvr.cpu.fused), where its gate is on. Not under
    # gradient checkpointing: its recomputation runs in the backward, after this block, with
    # the modules' own forwards.
    backend = cpu.OFF if cfg.optim.gradient_checkpointing else backend
    with autocast(cfg.model.autocast, device), backend.training_ops(model):
        return mb, score(model, mb, temperature=cfg.rollout.temperature, **kw)


@torch.no_grad()
def fill_log_probs(
    model, samples: list[Sample], cfg: Config, pad_id: int, device, attr: str, backend=None
) -> None:
    """Store per-sample log-probs under the given weights (old policy or reference)."""
    o = cfg.optim
    backend = cpu.backend(model) if backend is None else backend
    for micro in _micro_batches(samples, o.micro_batch_sequences, _share(cfg, model)):
        _, (lp, _) = _log_probs(model, micro, cfg, pad_id, device, backend)
        for s, row in zip(micro, lp.cpu()):
            setattr(s, attr, row[: len(s.completion_ids)].clone())


def _as_groups(batch: list, G: int) -> list[list[Sample] | None]:
    """Groups in global order (None: held by another rank); a flat sample list is chunked."""
    if batch and isinstance(batch[0], Sample):
        return [batch[i : i + G] for i in range(0, len(batch), G)]
    return list(batch)


def _dummy(pad_id: int) -> list[Sample]:
    """A one-token, fully masked micro-batch: loss 0, gradient 0. A rank with nothing to
    train in a mini-batch runs it so that every rank joins the gradient all-reduce."""
    return [Sample([pad_id], [pad_id], True, 0.0, False, -1)]


def _micro_loss(
    module,
    micro: list[Sample],
    cfg: Config,
    pad_id: int,
    device,
    num_tokens: float,
    num_sequences: float,
    backend: cpu.Backend | None = None,
):
    """The loss of one micro-batch (normalised by the step's global counts), its number of
    loss tokens, and the policy entropy summed over its generated tokens (and their count)."""
    a = cfg.algo
    backend = cpu.backend(module) if backend is None else backend
    mb, (log_probs, entropy) = _log_probs(
        module, micro, cfg, pad_id, device, backend, with_entropy=True
    )
    real = torch.tensor([s.group >= 0 for s in micro], dtype=torch.float32, device=device)
    kept = torch.tensor(
        [_valid_tokens(s, cfg) > 0 for s in micro], dtype=torch.float32, device=device
    )
    mask = mb.response_mask * (real * kept)[:, None]  # dummies and filtered rows: no loss
    # With mu = 1 and one mini-batch pi_old is the live policy: rho = 1 exactly
    # (docs/algorithms.md#old-and-reference-log-probs), and the detached log-probs save a
    # forward pass.
    old = mb.old_log_probs if mb.old_log_probs is not None else log_probs.detach()
    out = policy_loss(
        log_probs,
        old,
        mb.advantages,
        mask,
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        dual_clip=a.dual_clip,
        agg=a.agg,
        num_tokens=num_tokens,
        num_sequences=num_sequences,
        norm_constant=float(cfg.rollout.max_new_tokens),
        kl_coef=a.kl_coef if mb.ref_log_probs is not None else 0.0,  # a dummy has no reference
        ref_log_probs=mb.ref_log_probs,
        kl_kind=a.kl_kind,
        ratio=a.ratio,
        log_ratio_clamp=a.log_ratio_clamp,
    )
    generated = mb.response_mask * real[:, None]  # entropy also of overlong-filtered responses
    return out, float(mask.sum()), float((entropy * generated).sum()), float(generated.sum())


def policy_update(
    model,
    batch: list,
    cfg: Config,
    optimizer,
    scheduler,
    pad_id: int,
    device,
    *,
    d: Dist | None = None,
    module=None,
    backend: cpu.Backend | None = None,
) -> dict[str, float]:
    """mu passes x mini-batches x micro-batches; one optimiser step per mini-batch.

    `batch`: this rank's samples, or the step's groups in global order with None for groups
    of other ranks. `module`: what the training forward runs through (DDP-wrapped model).
    `backend`: the CPU backend's gate (by default decided from `model`).

    The module is in training mode for the loss forwards (dropout and LoRA dropout act,
    gradient checkpointing recomputes), and back in eval mode after."""
    module = module if module is not None else model
    backend = cpu.backend(model) if backend is None else backend
    was_training = module.training
    module.train()
    try:
        return _policy_update(
            model, batch, cfg, optimizer, scheduler, pad_id, device, d, module, backend
        )
    finally:
        module.train(was_training)


def _policy_update(model, batch, cfg, optimizer, scheduler, pad_id, device, d, module, backend):
    a, d = cfg.algo, d or Dist()
    groups = _as_groups(batch, cfg.rollout.group_size)
    per_mini = max(1, math.ceil(len(groups) / a.mini_batches))
    sums: dict[str, float] = {}
    ratio_max, grad_norms, nonfinite, steps = -math.inf, [], 0, 0

    def add(key: str, value: float) -> None:
        sums[key] = sums.get(key, 0.0) + value

    for _ in range(a.mu):
        for start in range(0, len(groups), per_mini):
            mine = [s for g in groups[start : start + per_mini] if g is not None for s in g]
            num_tokens, num_sequences = d.sum(
                [
                    sum(_valid_tokens(s, cfg) for s in mine),
                    sum(1 for s in mine if _valid_tokens(s, cfg) > 0),
                ]
            )
            o = cfg.optim
            micros = _micro_batches(mine, o.micro_batch_sequences, _share(cfg, model))
            micros = micros or [_dummy(pad_id)]
            if is_sharded(model):  # FSDP2 communicates in every forward/backward: equal counts
                micros += [_dummy(pad_id)] * (int(d.max(len(micros))) - len(micros))
            for k, micro in enumerate(micros):
                # DDP all-reduces on the last micro-batch only; the others accumulate locally.
                last = k == len(micros) - 1
                ddp_accumulate = d.enabled and not last and hasattr(module, "no_sync")
                sync = module.no_sync() if ddp_accumulate else contextlib.nullcontext()
                with sync:
                    out, n_local, ent_sum, ent_n = _micro_loss(
                        module, micro, cfg, pad_id, device, num_tokens, num_sequences, backend
                    )
                    # The loss is already normalised by global counts: undo DDP's averaging.
                    (out.loss * d.world_size).backward()
                for key, v in out.metrics.items():
                    if key == "ratio_max":
                        ratio_max = max(ratio_max, v) if n_local else ratio_max
                    elif key in ("log_ratio_clamped", "num_tokens"):
                        add(key, v)  # counts add up
                    else:
                        add(key, v * n_local)  # token-weighted mean
                add("loss", out.loss.item())
                add("tokens", n_local)
                add("entropy", ent_sum)
                add("entropy_tokens", ent_n)
            clip = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else math.inf
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
                grad_norm = grad_norm.full_tensor()
            if torch.isfinite(grad_norm):
                optimizer.step()
                scheduler.step()  # the schedule counts optimiser steps actually taken
                grad_norms.append(float(grad_norm))
            else:  # a NaN/inf loss or gradient (on any rank): drop this update, keep the weights
                nonfinite += 1
            optimizer.zero_grad(set_to_none=True)
            steps += 1
    keys = sorted(sums)
    total = dict(zip(keys, d.sum([sums[k] for k in keys])))
    tokens = max(total.pop("tokens", 0.0), 1.0)
    entropy = total.pop("entropy", 0.0) / max(total.pop("entropy_tokens", 0.0), 1.0)
    counts = {"loss", "log_ratio_clamped", "num_tokens"}
    out_metrics = {k: v / tokens for k, v in total.items() if k not in counts}
    out_metrics["entropy"] = entropy
    out_metrics["log_ratio_clamped"] = total.get("log_ratio_clamped", 0.0)
    out_metrics["loss_tokens"] = total.get("num_tokens", 0.0)
    out_metrics["loss"] = total.get("loss", 0.0) / max(steps, 1)
    ratio_max = d.max(ratio_max)
    out_metrics["ratio_max"] = ratio_max if ratio_max > -math.inf else 1.0
    out_metrics["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
    out_metrics["optimizer_steps"] = steps - nonfinite
    out_metrics["nonfinite_updates"] = nonfinite
    out_metrics["lr"] = scheduler.get_last_lr()[0]
    return out_metrics
