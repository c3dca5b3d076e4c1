"""The critic's loss and how well it explains the returns (docs/algorithms.md#ppo)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from .aggregate import AGGREGATIONS, AggMode, Count, aggregate
from .gae import GlobalSum, masked_floats
from .loss_inputs import LossOutput


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None,
    agg: AggMode = "token_mean",
    num_tokens: Count | None = None,
    num_sequences: Count | None = None,
) -> LossOutput:
    """Clipped value loss, verl's `compute_value_loss` convention:

        V_clip = clip(V, V_old - clip, V_old + clip)
        L_V    = 0.5 * agg_t( max( (V - R)^2, (V_clip - R)^2 ) )

    The max keeps the critic from moving its prediction more than `clip` away from the
    rollout-time value V_old in a direction that would reduce the loss (PPO's pessimistic
    bound, applied to the value). vf_clipfrac is the share of valid tokens where the clipped
    term is strictly the larger (verl's count; in float64, V_old + clip can round below a
    value exactly clip away, e.g. 0.7 + 0.2 < 0.9, and such a token counts as clipped).

    Elsewhere: TRL's retired PPOTrainer used the same formula (cliprange_value 0.2);
    OpenRLHF's ValueLoss clips only when `value_clip` is set (default None: plain
    0.5 (V - R)^2); verl's cliprange_value defaults to 0.5.

    Args:
        values: (B, T) current predictions (carry the graph); old_values: (B, T) the
            predictions at rollout time; returns: (B, T) targets R = A + V_old from `gae`.
        mask: (B, T) valid tokens. Masked positions may hold anything.
        clip: the value clip range c > 0, or None for the unclipped loss.
        agg, num_tokens, num_sequences: as in `aggregate` (global counts for exact
            micro-batching); token_sum_norm is not offered (no generation budget here).

    Returns:
        LossOutput with metrics vf_loss (the loss's value), vf_clipfrac, value_mean (mean of
        V over valid tokens), num_tokens; all 0.0 for an all-masked batch.
    """
    if clip is not None and not clip > 0:
        raise ValueError(f"clip must be > 0 or None, got {clip}")
    if agg not in AGGREGATIONS or agg == "token_sum_norm":
        raise ValueError(f"value_loss agg must be 'token_mean' or 'sample_mean', got {agg!r}")
    m, (v, v_old, ret) = masked_floats(
        mask, ("values", values), ("old_values", old_values), ("returns", returns)
    )
    unclipped = (v - ret).square()
    if clip is None:
        per_token, clipped_hit = unclipped, torch.zeros_like(m)
    else:
        v_clip = torch.maximum(torch.minimum(v, v_old + clip), v_old - clip)
        clipped = (v_clip - ret).square()
        per_token = torch.maximum(unclipped, clipped)
        clipped_hit = m & (clipped > unclipped)
    loss = 0.5 * aggregate(per_token, m, agg, num_tokens=num_tokens, num_sequences=num_sequences)
    n = m.sum().to(v.dtype)
    denom = n.clamp_min(1)
    stats = torch.stack(
        [loss.detach(), clipped_hit.sum() / denom, v.detach().sum() / denom, n]
    ).tolist()
    metrics = dict(zip(["vf_loss", "vf_clipfrac", "value_mean", "num_tokens"], stats))
    return LossOutput(loss=loss, metrics=metrics)


def variance_parts(
    values: Tensor, returns: Tensor, mask: Tensor, *, global_sum: GlobalSum | None = None
) -> tuple[float, float, float]:
    """(n, Var(R), Var(R - V)) over the n valid tokens of the batch (all ranks with
    `global_sum`; float64 sums; variances 0 when n is 0). Steps pool by their n-weighted
    variances: over a window, 1 - sum(n Var(R - V)) / sum(n Var(R))."""
    m, (v, ret) = masked_floats(mask, ("values", values), ("returns", returns))
    r64, e64 = ret.double(), (ret - v).double()
    total = global_sum or (lambda vals: vals)
    n, sr, sr2, se, se2 = total(
        [float(m.sum()), float(r64.sum()), float(r64.square().sum()), float(e64.sum()),
         float(e64.square().sum())]
    )  # fmt: skip
    if n < 1:
        return n, 0.0, 0.0
    return n, sr2 / n - (sr / n) ** 2, se2 / n - (se / n) ** 2


def explained_variance(
    values: Tensor, returns: Tensor, mask: Tensor, *, global_sum: GlobalSum | None = None
) -> float:
    """1 - Var(R - V) / Var(R) over the valid tokens of the batch (all ranks with
    `global_sum`; float64 sums). 1: V predicts R exactly; 0: no better than predicting the
    mean return; negative: worse than that. NaN when Var(R) is 0 or there are no tokens
    (the quantity is undefined, and a logged NaN says so rather than a made-up number)."""
    return explained_from_parts(*variance_parts(values, returns, mask, global_sum=global_sum))


def explained_from_parts(n: float, var_r: float, var_e: float) -> float:
    """1 - var_e / var_r from `variance_parts`; NaN with no tokens or Var(R) = 0."""
    return 1.0 - var_e / var_r if n >= 1 and var_r > 0 else float("nan")


def pooled_explained_variance(steps: Iterable[Mapping[str, float]]) -> float:
    """One explained variance for a window of logged PPO steps (metrics.jsonl rows):
    1 - sum(n Var(R - V)) / sum(n Var(R)), from each step's `critic/tokens` (n),
    `critic/error_var` and `critic/return_var` (`variance_parts`; logged in the critic's
    warm-up steps too); NaN when the window has no such step or no spread."""
    rows = [r for r in steps if "critic/return_var" in r]
    spread = sum(r["critic/tokens"] * r["critic/return_var"] for r in rows)
    error = sum(r["critic/tokens"] * r["critic/error_var"] for r in rows)
    return 1.0 - error / spread if spread > 0 else float("nan")


SURPRISE_FLOOR = -10.0  # nats: a stray token's log-prob (-15 and below) caps here


def surprise_features(log_probs: Tensor, mask: Tensor, *, floor: float = SURPRISE_FLOOR) -> Tensor:
    """(N, T, 2) what `critic.arch=surprise` adds to the value head's input at response
    position t: the lowest and the mean of `log_probs` (the reference model's, floored at
    `floor`) over the valid tokens j < t of the row, (0, 0) before the first. V_t is read
    before token t is generated, so token t's own log-prob is not in it.

    On the built-in task these two numbers from the starting model explain 0.43 of the
    return's variance on the ppo run's late responses (a ridge fit; the critic's own hidden
    state: 0.04; docs/ppo_vs_grpo.md)."""
    m = mask.bool()
    lp = torch.where(m, log_probs.float().clamp(min=floor), torch.zeros_like(log_probs.float()))
    zero = torch.zeros_like(lp[:, :1])
    before = torch.cat([zero, lp[:, :-1]], 1)
    seen = torch.cat([torch.zeros_like(m[:, :1]), m[:, :-1]], 1)
    n = seen.cumsum(1)
    low = torch.where(seen, before, torch.full_like(before, float("inf"))).cummin(1).values
    low = torch.where(n > 0, low, torch.zeros_like(low))
    mean = before.cumsum(1) / n.clamp(min=1)
    return torch.stack([low, mean], -1)
