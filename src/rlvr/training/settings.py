"""The values of the config that a step reads, taken out once per run: the step's functions
take these small frozen objects, never the whole `Config`.

    CollectSettings  what collection reads: group and batch sizes, the sampling, dynamic
                     sampling's budget, overlap, the logged samples
    UpdateSettings   what the update and its micro-batches read: mu, mini- and micro-batch
                     sizes (sequences or tokens), prompt sharing, padding or none, the forward's precision and logits chunking,
                     overlong filtering, clipping, PPO's per-token reward settings
    CriticContext    PPO's critic update: its schedule and clip, the pad id, device and ranks

`step_context` puts a step's objects (model, pad id, device, CPU backend, the run's
`Algorithm`) beside the `UpdateSettings` in the one `UpdateContext` every micro-batch reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import rlvr.cpu as cpu
from rlvr.algos import AdaptiveKLController, FixedKLController, KLController
from rlvr.config.algorithm import Algorithm
from rlvr.config.schema import Config
from rlvr.rollout import SamplingParams, derive_seed
from rlvr.run.distributed import Dist


@dataclass(frozen=True)
class CollectSettings:
    """What `rlvr.training.collect.collect` reads of the config."""

    group_size: int  # rollout.group_size: G responses per prompt
    prompts_per_step: int  # rollout.prompts_per_step: the groups a step keeps
    params: SamplingParams  # the rollout's sampling; each batch sets its own seeds
    seed: int  # train.seed: the generation seeds derive from it
    seed_per_prompt: bool  # rollout.seed_per_prompt: one random stream per prompt
    dynamic_sampling: bool  # algo.dynamic_sampling: keep only groups with a reward spread
    max_gen_batches: int  # generation batches a step may take (1 without dynamic sampling)
    log_samples: int  # train.log_samples: the examples a step logs
    overlap: str  # reward.overlap: score one part while the next generates

    @classmethod
    def from_config(cls, cfg: Config) -> CollectSettings:
        r, a = cfg.rollout, cfg.algo
        params = SamplingParams(
            n=r.group_size,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            min_new_tokens=r.min_new_tokens,
        )
        return cls(
            group_size=r.group_size,
            prompts_per_step=r.prompts_per_step,
            params=params,
            seed=cfg.train.seed,
            seed_per_prompt=r.seed_per_prompt,
            dynamic_sampling=a.dynamic_sampling,
            max_gen_batches=a.max_gen_batches if a.dynamic_sampling else 1,
            log_samples=cfg.train.log_samples,
            overlap=cfg.reward.overlap,
        )


@dataclass(frozen=True)
class UpdateSettings:
    """What the update (`rlvr.training.update`), its micro-batches (`rlvr.training.micro`)
    and PPO's token advantages (`rlvr.training.ppo`) read of the config."""

    group_size: int  # rollout.group_size: the rows of one group
    mu: int  # algo.mu: passes over the batch
    mini_batches: int  # algo.mini_batches: optimiser steps per pass
    micro_batch_sequences: int  # optim.micro_batch_sequences: rows of one forward
    micro_batch_tokens: int  # optim.micro_batch_tokens: positions of one forward (0: by rows)
    share_prompt: bool  # optim.share_prompt: a group's prompt forwarded once
    pad_free: bool  # optim.pad_free: a micro-batch's samples in one row, nothing padded
    gradient_checkpointing: bool  # optim.gradient_checkpointing
    logits_chunk_tokens: int  # optim.logits_chunk_tokens: tokens whose logits exist at once
    temperature: float  # rollout.temperature: divides the logits before the log-softmax
    autocast: str  # model.autocast: what the forwards compute in
    overlong_filter: bool  # algo.overlong_filter: truncated responses leave the loss
    max_grad_norm: float  # optim.max_grad_norm: the clip (0: none)
    seed: int  # train.seed: the update's random draws derive from it
    kl_kind: str  # algo.kl_kind: the per-token reward's KL estimator (PPO)
    gamma: float  # algo.gamma: GAE's discount
    lam: float  # algo.lam: GAE's lambda

    @classmethod
    def from_config(cls, cfg: Config) -> UpdateSettings:
        a, o = cfg.algo, cfg.optim
        return cls(
            group_size=cfg.rollout.group_size,
            mu=a.mu,
            mini_batches=a.mini_batches,
            micro_batch_sequences=o.micro_batch_sequences,
            micro_batch_tokens=o.micro_batch_tokens,
            share_prompt=o.share_prompt,
            pad_free=o.pad_free,
            gradient_checkpointing=o.gradient_checkpointing,
            logits_chunk_tokens=o.logits_chunk_tokens,
            temperature=cfg.rollout.temperature,
            autocast=cfg.model.autocast,
            overlong_filter=a.overlong_filter,
            max_grad_norm=o.max_grad_norm,
            seed=cfg.train.seed,
            kl_kind=a.kl_kind,
            gamma=a.gamma,
            lam=a.lam,
        )


@dataclass(frozen=True)
class CriticContext:
    """What PPO's critic (`rlvr.training.critic`) reads when it predicts and trains."""

    pad_id: int
    device: object
    d: Dist
    mu: int  # algo.mu: the policy's passes, the critic's too
    mini_batches: int  # algo.mini_batches
    micro_batch_sequences: int  # optim.micro_batch_sequences
    micro_batch_tokens: int  # optim.micro_batch_tokens (0: by sequences)
    value_clip: float  # critic.value_clip: the clipped value loss's bound
    max_grad_norm: float  # critic.max_grad_norm (0: no clip)
    surprise: bool  # critic.arch=surprise: the readout of the reference's log-probs

    @classmethod
    def from_config(cls, cfg: Config, pad_id: int, device, d: Dist) -> CriticContext:
        c = cfg.critic
        return cls(
            pad_id=pad_id,
            device=device,
            d=d,
            mu=cfg.algo.mu,
            mini_batches=cfg.algo.mini_batches,
            micro_batch_sequences=cfg.optim.micro_batch_sequences,
            micro_batch_tokens=cfg.optim.micro_batch_tokens,
            value_clip=c.value_clip,
            max_grad_norm=c.max_grad_norm,
            surprise=c.arch == "surprise",
        )


@dataclass(frozen=True)
class UpdateContext:
    """What every micro-batch of a step reads, built once per step (`step_context`, or
    `Run.step_context` for a run); `num_tokens` and `num_sequences` are set once per
    optimiser step (`dataclasses.replace`)."""

    model: torch.nn.Module  # the policy: its parameters, whether FSDP2 shards it
    module: torch.nn.Module  # what the training forward runs through (DDP-wrapped)
    pad_id: int
    device: object
    backend: cpu.Backend  # the CPU backend's gate, decided once for the run
    algorithm: Algorithm  # the run's objective, advantages and log-prob needs
    settings: UpdateSettings
    d: Dist = field(default_factory=Dist)  # the ranks: sums and maxima over all of them
    # the optimiser step's global loss tokens and sequences with any (all micro-batches, all
    # ranks): every micro-batch's loss is normalised by them
    num_tokens: float = 0.0
    num_sequences: float = 0.0


def step_context(
    cfg: Config, algorithm: Algorithm, model, pad_id: int, device, d: Dist | None = None
) -> UpdateContext:
    """One step's `UpdateContext` of `model` (its own training forward; the CPU backend's gate
    decided from it): `dataclasses.replace` sets a run's DDP module and its backend."""
    return UpdateContext(
        model=model,
        module=model,
        pad_id=pad_id,
        device=device,
        backend=cpu.backend(model),
        algorithm=algorithm,
        settings=UpdateSettings.from_config(cfg),
        d=d or Dist(),
    )


def eval_params(cfg: Config, *, greedy: bool = False, n: int | None = None) -> SamplingParams:
    """The held-out evaluation's sampling: the rollout's settings, `train.eval_samples`
    answers per prompt (or `n`), greedy when asked."""
    r = cfg.rollout
    return SamplingParams(
        n=n or cfg.train.eval_samples,
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        seed=derive_seed("eval"),
        greedy=greedy,
    )


def kl_controller(cfg: Config) -> KLController | None:
    """The per-token reward's beta: adaptive when algo.kl_target is set, else fixed; None
    when the KL is not in the reward."""
    a = cfg.algo
    if not a.kl_in_reward:
        return None
    if a.kl_target is None:
        return FixedKLController(a.kl_coef)
    return AdaptiveKLController(value=a.kl_coef, target=a.kl_target, horizon=a.kl_horizon)
