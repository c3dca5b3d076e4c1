"""One micro-batch of the update: its loss tokens, its log-probs (shared prompts or not), the
objective's inputs and loss with what the step's metrics sum over it, and the objective's
whole-mini-batch statistics (`stats`) summed over micro-batches and ranks."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

import rlvr.cpu as cpu
from rlvr.algos import LossOutput, kl_k3, overlong_filter_mask
from rlvr.algos import off_policy_mask as opm
from rlvr.algos import rollout_correction as rc
from rlvr.algos.cov import Largest, keep_largest
from rlvr.algos.objectives import DRAW_SEED, LossInputs
from rlvr.models import autocast
from rlvr.rollout.base import derive_seed
from rlvr.run.distributed import is_sharded
from rlvr.training.batch import (
    Batch,
    Sample,
    collate,
    collate_shared,
    shared_token_log_probs,
    to_width,
    token_log_probs,
)
from rlvr.training.micro_batches import micro_batches, positions
from rlvr.training.pad_free import collate_flat, flat_token_log_probs
from rlvr.training.settings import UpdateContext, UpdateSettings


def generated_mask(response_mask: torch.Tensor, samples: list[Sample]) -> torch.Tensor:
    """The generated tokens of real rows (a placeholder row has none)."""
    real = [s.group >= 0 for s in samples]
    return (
        response_mask
        * torch.tensor(real, dtype=torch.float32, device=response_mask.device)[:, None]
    )


def loss_mask(
    response_mask: torch.Tensor, samples: list[Sample], overlong_filter: bool
) -> torch.Tensor:
    """The tokens that enter the loss: the generated ones, minus every token of a truncated
    response under overlong filtering (it leaves the normaliser too, docs/algorithms.md)."""
    mask = generated_mask(response_mask, samples)
    if overlong_filter:
        truncated = [s.truncated for s in samples]
        truncated = torch.tensor(truncated, dtype=torch.bool, device=mask.device)  # [] too
        mask = overlong_filter_mask(mask, truncated)
    return mask


def loss_counts(samples: list[Sample], overlong_filter: bool) -> list[float]:
    """Loss tokens and sequences with any (the normalisers) of these samples; tool tokens
    are not loss tokens."""
    width = max((len(s.completion_ids) for s in samples), default=0)
    response = (
        torch.stack([s.model_mask(width) for s in samples]).float()
        if samples
        else (torch.zeros((0, 0)))
    )
    per_row = loss_mask(response, samples, overlong_filter).sum(1)
    return [float(per_row.sum()), float((per_row > 0).sum())]


def shares_prompt(settings: UpdateSettings, model) -> bool:
    """Prompt sharing runs one or two forwards per micro-batch depending on its lengths; under
    FSDP2 every forward is a collective that all ranks must join, so there it stays off. It
    also needs the prompt's KV cache, which gradient checkpointing turns off."""
    s = settings
    return s.share_prompt and not s.gradient_checkpointing and not is_sharded(model)


def layout(settings: UpdateSettings, model) -> str:
    """How `model`'s micro-batches are laid out (`rlvr.training.micro_batches`): "pad_free"
    (optim.pad_free), else "shared" where the prompt is shared (`shares_prompt`), else
    "padded"."""
    if settings.pad_free:
        return "pad_free"
    return "shared" if shares_prompt(settings, model) else "padded"


_LAYOUTS = {
    "padded": (collate, token_log_probs),
    "shared": (collate_shared, shared_token_log_probs),
    "pad_free": (collate_flat, flat_token_log_probs),
}


def cut(samples: list[Sample], settings: UpdateSettings, model) -> list[list[int]]:
    """The micro-batches (row indices) of `samples` for `model`'s forwards: by tokens
    (optim.micro_batch_tokens) or sequences, in its `layout`."""
    s = settings
    return micro_batches(samples, s.micro_batch_sequences, s.micro_batch_tokens, layout(s, model))


def computed_positions(micro: list[Sample], settings: UpdateSettings, model) -> tuple[int, int]:
    """(computed, real) positions of one micro-batch (`micro_batches.positions`)."""
    return positions(micro, layout(settings, model))


def micro_log_probs(model, micro: list[Sample], u: UpdateContext, with_entropy: bool = False):
    """The micro-batch collated, and its token log-probs under `model` (the training module,
    the old policy or the reference) in its `layout`."""
    s = u.settings
    collate_in, score = _LAYOUTS[layout(s, model)]
    mb = collate_in(micro, u.pad_id, u.device)
    # The CPU backend's native passes (rlvr.cpu.fused), where its gate is on. Not under
    # gradient checkpointing: its recomputation runs in the backward, after this block, with
    # the modules' own forwards.
    backend = cpu.OFF if s.gradient_checkpointing else u.backend
    with autocast(s.autocast, u.device), backend.training_ops(model):
        return mb, score(
            model,
            mb,
            temperature=s.temperature,
            with_entropy=with_entropy,
            chunk=s.logits_chunk_tokens,
        )


@dataclass
class MicroResult:
    """One micro-batch's loss and what the step's metrics sum over it."""

    out: LossOutput
    loss_tokens: float
    entropy_sum: float  # over generated tokens (overlong-filtered responses too)
    generated_tokens: float
    # |engine - trainer|: sum, max, tokens; and the sum of k3 of KL(engine || trainer)
    logprob_diff: tuple[float, float, float, float] | None
    correction: dict[str, float] | None = None  # rollout correction's sums (rollout_correction)
    masked: dict[str, float] | None = None  # off-policy sequence masking's sums (off_policy_mask)


def micro_inputs(
    micro: Batch, u: UpdateContext, batch_stats: dict[str, torch.Tensor] | None = None
):
    """The objective's inputs for one micro-batch, with its entropy and generated tokens."""
    device, algo = u.device, u.algorithm
    mb, (log_probs, entropy) = micro_log_probs(u.module, micro.samples, u, with_entropy=True)
    T = mb.response_mask.shape[1]
    # dummies, filtered rows: no loss
    mask = loss_mask(mb.response_mask, micro.samples, u.settings.overlong_filter)
    # With mu = 1 and one mini-batch pi_old is the live policy: rho = 1 exactly
    # (docs/algorithms.md), and the detached log-probs save a forward pass.
    old = to_width(micro.old_log_probs, T, device)
    behaviour = micro.sampling_log_probs(T)
    versions = micro.token_versions(T)
    old = rc.bypass_old_log_probs(behaviour, mask, device) if algo.bypass else old
    old = old if old is not None else log_probs.detach()
    inputs = LossInputs(
        log_probs=log_probs,
        old_log_probs=old,
        advantages=to_width(micro.advantages, T, device),
        response_mask=mask,
        # a dummy has no reference; with the KL in the reward (PPO) the loss has none
        ref_log_probs=to_width(micro.ref_log_probs, T, device),
        behaviour_log_probs=behaviour.to(device) if behaviour is not None else None,
        behaviour_versions=versions.to(device) if versions is not None else None,
        entropy=entropy.detach(),
        num_tokens=u.num_tokens,
        num_sequences=u.num_sequences,
        norm_constant=algo.norm_constant,
        batch_stats=batch_stats or {},
        row_ids=micro.numbered(),
        draw_seed=int(batch_stats[DRAW_SEED]) if batch_stats and DRAW_SEED in batch_stats else None,
    )
    return inputs, entropy, generated_mask(mb.response_mask, micro.samples)


def micro_loss(
    micro: Batch, u: UpdateContext, batch_stats: dict[str, torch.Tensor] | None = None
) -> MicroResult:
    """The loss of one micro-batch (normalised by the optimiser step's global counts in `u`)
    and its sums."""
    algo = u.algorithm
    inputs, entropy, generated = micro_inputs(micro, u, batch_stats)
    inputs, correction = rc.with_rollout_weights(inputs, algo.correction)
    inputs, masked = opm.with_sequence_mask(inputs, algo.sequence_mask)
    out = algo.loss(inputs)
    # under bypass pi_old is the engine's: the mismatch is measured against the live policy
    trainer = inputs.log_probs.detach() if algo.bypass else inputs.old_log_probs
    return MicroResult(
        out=out,
        loss_tokens=float(inputs.response_mask.sum()),
        entropy_sum=float((entropy * generated).sum()),
        generated_tokens=float(generated.sum()),
        logprob_diff=logprob_diff(inputs.behaviour_log_probs, trainer, generated),
        correction=correction,
        masked=masked,
    )


@torch.no_grad()
def batch_stats(u: UpdateContext, micros: list[Batch], step: int):
    """The objective's `stats` (or each of its `stages` in turn, given the totals before it)
    summed over the mini-batch's micro-batches and every rank, or None when it has none.
    One no-grad forward per micro-batch, shared by the stages. `step`: the optimiser steps
    taken (the scheduler's), which with the run's seed makes the update's random draws."""
    objective = u.algorithm.objective
    if objective.stats is None and objective.stages is None:
        return None
    every = [micro_inputs(micro, u)[0] for micro in micros]
    if objective.stages is None:
        return _summed(u, [objective.stats(inputs) for inputs in every])
    # the update's seed for random choices: the run's seed and the optimiser step (resumed
    # with the scheduler's state), the same on every rank
    draw = torch.tensor(float(derive_seed(u.settings.seed, "draw", step)), dtype=torch.float64)
    totals: dict[str, torch.Tensor] = {DRAW_SEED: draw.to(u.device)}
    for stage in objective.stages(u.algorithm.settings):
        every = [replace(inputs, batch_stats=totals, draw_seed=int(draw)) for inputs in every]
        parts = [stage(inputs, totals) for inputs in every]
        top = {k for part in parts for k, v in part.items() if isinstance(v, Largest)}
        sums = [{k: v for k, v in part.items() if k not in top} for part in parts]
        totals = {**totals, **(_summed(u, sums) if any(sums) else {}), **_largest(u, parts, top)}
    return totals


def _summed(u: UpdateContext, parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The micro-batches' dicts of sums, added up here and over ranks (float64)."""
    total: dict[str, torch.Tensor] = {}
    for part in parts:
        for key, value in part.items():
            value = value.detach().double().cpu()
            total[key] = total[key] + value if key in total else value
    keys = sorted(total)
    shapes = [total[k].shape for k in keys]
    flat = torch.cat([total[k].reshape(-1) for k in keys]) if keys else torch.zeros(0)
    summed = torch.tensor(u.d.sum(flat.tolist()), dtype=torch.float64) if keys else flat
    out, i = {}, 0
    for k, shape in zip(keys, shapes):
        n = int(torch.Size(shape).numel())
        out[k] = summed[i : i + n].reshape(shape).to(u.device)
        i += n
    return out


def _largest(u: UpdateContext, parts: list[dict], keys: set[str]) -> dict[str, torch.Tensor]:
    """Each `Largest` key's k best rows over the micro-batches here and every rank."""
    out = {}
    for key in sorted(keys):
        got = [p[key] for p in parts if key in p]
        k = got[0].k
        here = keep_largest(torch.cat([g.rows for g in got]), k)
        everywhere = torch.tensor(
            [row for part in u.d.gather(here.tolist()) for row in part], dtype=torch.float64
        )
        out[key] = keep_largest(everywhere.reshape(-1, 2), k).to(u.device)
    return out


def logprob_diff(engine: torch.Tensor | None, trainer: torch.Tensor, valid: torch.Tensor):
    """|engine log-prob - trainer log-prob| over the valid tokens: (sum, max, count, k3 sum),
    or None where the engine reports no log-probs. `trainer`: pi_old's (the policy that
    sampled). k3 estimates KL(engine || trainer) from the engine's own samples:
    exp(x) - x - 1 with x = trainer - engine (`kl_k3(engine, trainer)`)."""
    if engine is None:
        return None
    engine = engine.to(trainer.device)
    valid = valid.bool()
    diff = (engine - trainer).abs()[valid]
    if diff.numel() == 0:
        return 0.0, 0.0, 0.0, 0.0
    k3 = kl_k3(engine[valid].double(), trainer[valid].double())
    return float(diff.sum()), float(diff.max()), float(diff.numel()), float(k3.sum())
