"""The update: advantages, old/reference log-probs, and mu x mini-batch x micro-batch steps."""

from __future__ import annotations

import math

import torch

from rlvr.algos import ADVANTAGES, group_advantages, policy_loss
from rlvr.batching import Sample, collate, token_log_probs
from rlvr.config import Config


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
    filtering (it leaves the normaliser too, ALGORITHMS.md §5.5)."""
    return 0 if (cfg.algo.overlong_filter and s.truncated) else len(s.completion_ids)


def _micro_batches(samples: list[Sample], size: int) -> list[list[Sample]]:
    # Sorted by total length so each micro-batch pads only to similar lengths.
    order = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
    return [order[i : i + size] for i in range(0, len(order), size)]


@torch.no_grad()
def fill_log_probs(
    model, samples: list[Sample], cfg: Config, pad_id: int, device, attr: str
) -> None:
    """Store per-sample log-probs under the given weights (old policy or reference)."""
    for micro in _micro_batches(samples, cfg.optim.micro_batch_sequences):
        mb = collate(micro, pad_id, device)
        lp, _ = token_log_probs(model, mb, temperature=cfg.rollout.temperature)
        for s, row in zip(micro, lp.cpu()):
            setattr(s, attr, row[: len(s.completion_ids)].clone())


def policy_update(
    model, samples: list[Sample], cfg: Config, optimizer, scheduler, pad_id: int, device
) -> dict[str, float]:
    """mu passes x mini-batches x micro-batches; one optimiser step per mini-batch."""
    a = cfg.algo
    G = cfg.rollout.group_size
    groups = [samples[i : i + G] for i in range(0, len(samples), G)]
    per_mini = max(1, math.ceil(len(groups) / a.mini_batches))
    stats: dict[str, float] = {}
    tokens_seen = 0
    nonfinite = steps = 0
    grad_norms, ent_sum, ent_tokens = [], 0.0, 0
    for _ in range(a.mu):
        for start in range(0, len(groups), per_mini):
            mini = [s for g in groups[start : start + per_mini] for s in g]
            num_tokens = sum(_valid_tokens(s, cfg) for s in mini)
            num_sequences = sum(1 for s in mini if _valid_tokens(s, cfg) > 0)
            bad = False
            for micro in _micro_batches(mini, cfg.optim.micro_batch_sequences):
                mb = collate(micro, pad_id, device)
                mask = mb.response_mask
                if a.overlong_filter:
                    mask = (
                        mask
                        * torch.tensor(
                            [not s.truncated for s in micro], dtype=mask.dtype, device=device
                        )[:, None]
                    )
                log_probs, entropy = token_log_probs(
                    model, mb, temperature=cfg.rollout.temperature, with_entropy=True
                )
                # With mu = 1 and one mini-batch pi_old is the live policy: rho = 1 exactly
                # (ALGORITHMS.md §3.5), and the detached log-probs save a forward pass.
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
                    kl_coef=a.kl_coef,
                    ref_log_probs=mb.ref_log_probs,
                    kl_kind=a.kl_kind,
                    ratio=a.ratio,
                    log_ratio_clamp=a.log_ratio_clamp,
                )
                if not torch.isfinite(out.loss):
                    bad = True
                    break
                out.loss.backward()
                n_local = float(mask.sum())
                tokens_seen += n_local
                for k, v in out.metrics.items():
                    if k == "ratio_max":
                        stats[k] = max(stats.get(k, -math.inf), v)
                    elif k in ("log_ratio_clamped", "num_tokens"):
                        stats[k] = stats.get(k, 0.0) + v  # counts add up
                    else:
                        stats[k] = stats.get(k, 0.0) + v * n_local  # token-weighted mean
                stats["loss"] = stats.get("loss", 0.0) + out.loss.item()
                ent_sum += float((entropy * mb.response_mask).sum())
                ent_tokens += int(mb.response_mask.sum())
            clip = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else math.inf
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if bad or not torch.isfinite(grad_norm):
                nonfinite += 1  # a NaN/inf loss or gradient: drop this update, keep the weights
            else:
                optimizer.step()
                scheduler.step()  # the schedule counts optimiser steps actually taken
                grad_norms.append(float(grad_norm))
            optimizer.zero_grad(set_to_none=True)
            steps += 1
    counts = ("ratio_max", "loss", "log_ratio_clamped", "num_tokens")
    out_metrics = {k: v / max(tokens_seen, 1) for k, v in stats.items() if k not in counts}
    out_metrics["log_ratio_clamped"] = stats.get("log_ratio_clamped", 0.0)
    out_metrics["loss_tokens"] = stats.get("num_tokens", 0.0)
    out_metrics["ratio_max"] = stats.get("ratio_max", 1.0)
    out_metrics["loss"] = stats.get("loss", 0.0) / max(steps, 1)
    out_metrics["entropy"] = ent_sum / max(ent_tokens, 1)
    out_metrics["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
    out_metrics["optimizer_steps"] = steps - nonfinite
    out_metrics["nonfinite_updates"] = nonfinite
    out_metrics["lr"] = scheduler.get_last_lr()[0]
    return out_metrics
