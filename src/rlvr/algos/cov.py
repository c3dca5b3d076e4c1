"""Clip-Cov and KL-Cov (the entropy-mechanism paper, arXiv 2505.22617; verl `clip_cov`,
`kl_cov`; docs/algorithms.md#clip-cov-and-kl-cov): a few tokens of high covariance between
advantage and log-probability, the ones that drive the entropy down, get their update cut.

Per valid token of the mini-batch (every micro-batch, every rank), rho = exp(logp - logp_old):

    cov_t = (A_t - mean A) * (logp_t - mean sg(logp))       means over the mini-batch's tokens
    Clip-Cov: of the tokens PPO's clip left alone (-clip(rho) A <= -rho A) with
              clip_cov_lb < cov_t < clip_cov_ub, k = max(1, floor(clip_cov_ratio N)) chosen at
              random lose loss term and gradient; every other token has PPO's clipped loss
    KL-Cov:   the k = max(1, floor(kl_cov_ratio N)) tokens of largest cov_t get
              -A rho + kl_cov_coef |log rho|, the others the unclipped -A rho
    loss = aggregate(L, response_mask, agg)         (the cut tokens stay in the normaliser)

N is the mini-batch's loss tokens. The selection needs the whole mini-batch, in two stages of
the registry's batch statistics (`rlvr.algos.objectives`): first the sums for the means
(tokens, sum of A, sum of logp), then, given them, each micro-batch's k best candidates
(`Largest`), of which the update keeps the k best over all micro-batches and ranks. The
result is exact: the k selected tokens are the same however the mini-batch is split.

The ranking key: KL-Cov's is cov_t; Clip-Cov's is a uniform draw per token from a generator
seeded with (the update's `draw_seed`, the token's row id), so the choice is a uniform random
k-subset of the candidates, a pure function of the run's seed, the optimiser step and the
token's place in the step (resume replays it). Ties on the key are broken by the token's
unique id (row id, position), so exactly min(k, candidates) tokens are selected; identical
responses of one group, whose cov_t are equal, are told apart this way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .loss_inputs import LossOutput
from .objectives.registry import register_objective
from .objectives.toolkit import check_inputs, kl_and_aggregate, masked_inputs, policy_metrics
from .settings import LossSettings, setting

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .loss_inputs import LossInputs

N, SUM_ADV, SUM_LOGP, TOP = "cov/tokens", "cov/sum_adv", "cov/sum_logp", "cov/top"
POSITIONS = 1 << 20  # a token's id: row id * POSITIONS + position (exact in float64)


@dataclass(frozen=True)
class ClipCovSettings(LossSettings):
    """Clip-Cov's own settings (the shared ones: `LossSettings`; PPO's clip bounds apply).

    clip_cov_ratio: Clip-Cov's share of the mini-batch's loss tokens cut (verl: 2e-4).
    clip_cov_lb: Clip-Cov's band's lower end: only tokens with lb < cov < ub are cut (verl: 1).
    clip_cov_ub: Clip-Cov's band's upper end (verl: 5).
    """

    clip_cov_ratio: float = setting(2e-4, lambda v: 0 < v <= 1, "in (0, 1] (verl: 2e-4)")
    clip_cov_lb: float = setting(1.0)
    clip_cov_ub: float = setting(5.0)

    def check(self) -> None:
        if not self.clip_cov_ub > self.clip_cov_lb:
            raise ValueError(
                f"clip_cov_ub: got {self.clip_cov_ub!r}, expected > clip_cov_lb (verl: 1 and 5)"
            )


@dataclass(frozen=True)
class KLCovSettings(LossSettings):
    """KL-Cov's own settings (the shared ones: `LossSettings`).

    kl_cov_ratio: KL-Cov's share of loss tokens, those of largest cov, penalised (verl: 2e-4).
    kl_cov_coef: KL-Cov's weight of |log rho| on those tokens (verl's ppo_kl_coef: 1).
    """

    kl_cov_ratio: float = setting(2e-4, lambda v: 0 < v <= 1, "in (0, 1] (verl: 2e-4)")
    kl_cov_coef: float = setting(1.0, lambda v: v >= 0, ">= 0 (verl: 1)")


@dataclass(frozen=True)
class Largest:
    """A batch statistic kept by rank, not summed: `rows` (n, 2) of (key, id) pairs; over
    micro-batches and ranks the update keeps the `k` lexicographically largest, padded with
    (-inf, -inf) to exactly k rows (`keep_largest`)."""

    rows: Tensor
    k: int


def keep_largest(rows: Tensor, k: int) -> Tensor:
    """The k lexicographically largest (key, id) rows of `rows`, in descending order, padded
    with (-inf, -inf) rows to k."""
    pad = torch.full((k, 2), -torch.inf, dtype=torch.float64)
    rows = torch.cat([rows.to(torch.float64).cpu(), pad])
    by_id = rows[torch.argsort(rows[:, 1], descending=True, stable=True)]
    ranked = by_id[torch.argsort(by_id[:, 0], descending=True, stable=True)]
    return ranked[:k]


def row_seed(draw_seed: int, row: int) -> int:
    """A row's generator seed: 31 bits of sha256 of (draw_seed, row), as the run's other
    draws (`rlvr.rollout.base.derive_seed`)."""
    digest = hashlib.sha256(f"{draw_seed}:clip_cov:{row}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _valid(inputs: LossInputs) -> Tensor:
    m = inputs.response_mask
    return m if m.dtype == torch.bool else m != 0


def mean_sums(inputs: LossInputs, totals: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Stage 1: the mini-batch's loss tokens, sum of A and sum of logp over them (float64)."""
    _, _, adv, mask, _ = masked_inputs(inputs)
    logp = torch.where(mask, inputs.log_probs.detach().double(), 0.0)
    return {
        N: mask.sum().double(),
        SUM_ADV: adv.detach().double().sum(),
        SUM_LOGP: logp.sum(),
    }


def covariance(inputs: LossInputs, totals: Mapping[str, Tensor]) -> Tensor:
    """(B, T) cov_t = (A_t - mean A) (logp_t - mean logp) over the mini-batch (0 if masked)."""
    _, _, adv, mask, _ = masked_inputs(inputs)
    n = totals[N].clamp_min(1).to(adv.device)
    mean_adv = (totals[SUM_ADV].to(adv.device) / n).to(adv.dtype)
    mean_logp = (totals[SUM_LOGP].to(adv.device) / n).to(adv.dtype)
    logp = inputs.log_probs.detach().to(adv.dtype)
    return torch.where(mask, (adv - mean_adv) * (logp - mean_logp), 0.0)


def token_ids(inputs: LossInputs) -> Tensor:
    """(B, T) float64 unique ids of the step's tokens: row id * POSITIONS + position."""
    T = inputs.response_mask.shape[1]
    if inputs.row_ids is None:
        raise ValueError("the covariance objectives need the rows' ids (LossInputs.row_ids)")
    rows = inputs.row_ids.to(torch.float64).cpu()
    return rows[:, None] * POSITIONS + torch.arange(T, dtype=torch.float64)[None, :]


def uniform_keys(inputs: LossInputs) -> Tensor:
    """(B, T) float64 uniform draws, row i from a generator seeded (draw_seed, row id): the
    first T draws of a row are the same whatever the micro-batch's width."""
    if inputs.draw_seed is None or inputs.row_ids is None:
        raise ValueError("clip_cov needs the update's draw_seed and the rows' ids")
    T = inputs.response_mask.shape[1]
    rows = []
    for row in inputs.row_ids.tolist():
        g = torch.Generator().manual_seed(row_seed(inputs.draw_seed, int(row)))
        rows.append(torch.rand(T, generator=g, dtype=torch.float64))
    return torch.stack(rows) if rows else torch.zeros((0, T), dtype=torch.float64)


def _count(totals: Mapping[str, Tensor], ratio: float) -> int:
    """k = max(1, floor(ratio N)) as verl takes it."""
    return max(int(ratio * float(totals[N])), 1)


def _clip_parts(inputs: LossInputs, s: LossSettings):
    """Clip-Cov's per-token pieces: (logp, old, adv, mask, clean, rho, pg1, pg2)."""
    logp, old, adv, mask, clean = masked_inputs(inputs)
    rho = torch.exp(logp - old)
    pg1 = -adv * rho
    pg2 = -adv * rho.clamp(1.0 - s.clip_low, 1.0 + s.clip_high)
    return logp, old, adv, mask, clean, rho, pg1, pg2


def clip_cov_eligible(inputs: LossInputs, totals: Mapping[str, Tensor], s: ClipCovSettings):
    """Clip-Cov's candidates: valid, not clipped by PPO's clip, lb < cov < ub."""
    _, _, _, mask, _, _, pg1, pg2 = _clip_parts(inputs, s)
    cov = covariance(inputs, totals)
    by_clip = (pg2 > pg1).detach() & mask
    return mask & ~by_clip & (cov > s.clip_cov_lb) & (cov < s.clip_cov_ub)


def _top_stage(eligible: Tensor, key: Tensor, ids: Tensor, k: int) -> dict[str, Largest]:
    cpu = eligible.cpu()
    rows = torch.stack([key.cpu().double()[cpu], ids[cpu]], dim=1)
    return {TOP: Largest(keep_largest(rows, k), k)}


def selected(eligible: Tensor, key: Tensor, ids: Tensor, top: Tensor) -> Tensor:
    """The eligible tokens at or above the k-th best (key, id) pair `top[-1]`."""
    last_key, last_id = float(top[-1, 0]), float(top[-1, 1])
    key, ids = key.cpu().double(), ids
    above = (key > last_key) | ((key == last_key) & (ids >= last_id))
    return eligible & above.to(eligible.device)


def clip_cov_stages(settings: ClipCovSettings):
    """Clip-Cov's two statistics stages: the means' sums, then the k best uniform keys."""

    def candidates(inputs: LossInputs, totals: Mapping[str, Tensor]) -> dict[str, Largest]:
        eligible = clip_cov_eligible(inputs, totals, settings)
        k = _count(totals, settings.clip_cov_ratio)
        return _top_stage(eligible, uniform_keys(inputs), token_ids(inputs), k)

    return (mean_sums, candidates)


def kl_cov_stages(settings: KLCovSettings):
    """KL-Cov's two statistics stages: the means' sums, then the k largest cov values."""

    def candidates(inputs: LossInputs, totals: Mapping[str, Tensor]) -> dict[str, Largest]:
        k = _count(totals, settings.kl_cov_ratio)
        cov = covariance(inputs, totals)
        return _top_stage(_valid(inputs), cov, token_ids(inputs), k)

    return (mean_sums, candidates)


def _finish(per_token, logp, clean, mask, inputs, s, rho, low, high, cut):
    loss, kl3 = kl_and_aggregate(per_token, logp, clean, mask, inputs, s)
    none = torch.zeros((), dtype=logp.dtype, device=logp.device)
    metrics = policy_metrics(rho, mask, low, high, torch.zeros_like(mask), kl3, none)
    n = max(metrics["num_tokens"], 1.0)
    metrics["cov_frac"] = float(cut.sum()) / n
    return LossOutput(loss=loss, metrics=metrics)


@register_objective(
    "clip_cov",
    settings=ClipCovSettings,
    unused=("ratio", "dual_clip", "log_ratio_clamp"),
    stages=clip_cov_stages,
    rollout_weights="own",
)
def clip_cov_loss(inputs: LossInputs, settings: ClipCovSettings) -> LossOutput:
    """Clip-Cov's loss (module docstring); `inputs.batch_stats` holds both stages' totals.
    Metrics as `clip`'s, plus cov_frac: the share of loss tokens Clip-Cov cut (verl's
    pg_clipfrac under clip_cov)."""
    s, totals = settings, inputs.batch_stats
    check_inputs(inputs, s.kl_coef)
    logp, _, adv, mask, clean, rho, pg1, pg2 = _clip_parts(inputs, s)
    eligible = clip_cov_eligible(inputs, totals, s)
    cut = selected(eligible, uniform_keys(inputs), token_ids(inputs), totals[TOP])
    per_token = torch.where(cut, 0.0, torch.maximum(pg1, pg2))
    lo, hi = 1.0 - s.clip_low, 1.0 + s.clip_high
    low = mask & (adv < 0) & (rho.detach() < lo)
    high = mask & (adv > 0) & (rho.detach() > hi)
    return _finish(per_token, logp, clean, mask, inputs, s, rho, low, high, cut)


@register_objective(
    "kl_cov",
    settings=KLCovSettings,
    unused=("clip_low", "clip_high", "ratio", "dual_clip", "log_ratio_clamp"),
    stages=kl_cov_stages,
    rollout_weights="own",
)
def kl_cov_loss(inputs: LossInputs, settings: KLCovSettings) -> LossOutput:
    """KL-Cov's loss (module docstring). Metrics as `clip`'s (no bound fires: clip_frac_*
    are 0), plus cov_frac: the share of loss tokens given the |log rho| penalty."""
    s, totals = settings, inputs.batch_stats
    check_inputs(inputs, s.kl_coef)
    logp, old, adv, mask, clean = masked_inputs(inputs)
    log_ratio = logp - old
    rho = torch.exp(log_ratio)
    cov = covariance(inputs, totals)
    chosen = selected(mask, cov, token_ids(inputs), totals[TOP])
    per_token = -adv * rho + torch.where(chosen, s.kl_cov_coef * log_ratio.abs(), 0.0)
    none = torch.zeros_like(mask)
    return _finish(per_token, logp, clean, mask, inputs, s, rho, none, none, chosen)
