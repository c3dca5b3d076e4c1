"""Token-level advantages from per-token rewards: GAE (PPO) and discounted returns
(REINFORCE++), and the masked whitening both are normalised with (docs/algorithms.md#ppo).

Tensors are (B, T) = responses x completion tokens with a (B, T) mask of valid tokens. A
response's valid tokens need not be contiguous: masked positions inside a row (tool output,
filtered tokens) are skipped, so the recursion runs over the valid tokens only and never
bootstraps past a response's last valid token (V_{T+1} = 0). Masked positions of every input
may hold anything, NaN included; they are replaced before any arithmetic and the outputs are 0
there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

GlobalSum = Callable[[list[float]], list[float]]
"""Sums a list of floats over every process that holds part of the batch (torch.distributed
all-reduce); None means the tensors given are the whole batch."""


def masked_floats(mask: Tensor, *named: tuple[str, Tensor]) -> tuple[Tensor, list[Tensor]]:
    """The bool mask and each tensor as float (>= fp32) with masked entries set to 0."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be (B, T), got shape {tuple(mask.shape)}")
    m = mask if mask.dtype == torch.bool else mask != 0
    out = []
    for name, t in named:
        if tuple(t.shape) != tuple(m.shape):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(m.shape)}")
        dtype = t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float32
        out.append(torch.where(m, t.to(dtype), torch.zeros((), dtype=dtype, device=t.device)))
    return m, out


def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438) per response.

    Over the valid tokens t of each row, with t' the next valid token (none after the last):

        delta_t = r_t + gamma * V_t' - V_t            (V_t' = 0 after the last valid token)
        A_t     = delta_t + gamma * lam * A_t'        (A_t' = 0 after the last valid token)
        R_t     = A_t + V_t                           (the critic's regression target)

    lam = 1 gives Monte Carlo returns minus V (high variance, no bias from V); lam = 0 the
    one-step TD error. No whitening here (`masked_whiten` does that over the whole batch);
    returns are taken before it, as verl's `compute_gae_advantage_return` does.

    Args:
        token_rewards, values, mask: (B, T); mask bool or 0/1.
        gamma: discount in [0, 1]; lam: GAE lambda in [0, 1].

    Returns:
        (advantages, returns), both (B, T) in the inputs' float dtype (at least fp32), 0 at
        masked positions; an all-masked row is all 0.
    """
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"need gamma and lam in [0, 1], got gamma={gamma}, lam={lam}")
    m, (r, v) = masked_floats(mask, ("token_rewards", token_rewards), ("values", values))
    B, T = m.shape
    next_value = r.new_zeros(B)
    next_adv = r.new_zeros(B)
    adv = torch.zeros_like(r)
    for t in reversed(range(T)):  # vectorised over rows; T steps
        delta = r[:, t] + gamma * next_value - v[:, t]
        a_t = delta + gamma * lam * next_adv
        valid = m[:, t]
        # A masked token passes the next valid token's value and advantage through unchanged.
        next_adv = torch.where(valid, a_t, next_adv)
        next_value = torch.where(valid, v[:, t], next_value)
        adv[:, t] = torch.where(valid, a_t, torch.zeros_like(a_t))
    returns = torch.where(m, adv + v, torch.zeros_like(adv))
    return adv, returns


def discounted_returns(token_rewards: Tensor, mask: Tensor, *, gamma: float) -> Tensor:
    """G_t = sum_{k >= t, k valid} gamma^(n(t, k)) r_k over each row's valid tokens, n(t, k)
    counting the valid tokens between t and k; REINFORCE++'s return (OpenRLHF
    `get_cumulative_returns`). Equal to `gae` with values 0 and lam 1. (B, T), 0 where masked.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"need gamma in [0, 1], got {gamma}")
    m, (r,) = masked_floats(mask, ("token_rewards", token_rewards))
    out = torch.zeros_like(r)
    running = r.new_zeros(m.shape[0])
    for t in reversed(range(m.shape[1])):
        running = torch.where(m[:, t], r[:, t] + gamma * running, running)
        out[:, t] = torch.where(m[:, t], running, torch.zeros_like(running))
    return out


def masked_moments(
    x: Tensor, mask: Tensor, *, unbiased: bool = True, global_sum: GlobalSum | None = None
) -> tuple[float, float, float]:
    """(mean, variance, count) of x over the valid entries of the whole batch (all ranks when
    `global_sum` is given; two reductions, in float64). The variance is 0 for fewer than two
    entries (unbiased) or none."""
    m, (v,) = masked_floats(mask, ("x", x))
    total = global_sum or (lambda vals: vals)
    s, n = total([float(v.double().sum()), float(m.sum())])
    mean = s / n if n > 0 else 0.0
    centred = torch.where(m, v.double() - mean, torch.zeros((), dtype=torch.float64))
    (ss,) = total([float(centred.square().sum())])
    dof = n - 1 if unbiased else n
    return mean, (ss / dof if dof > 0 else 0.0), n


def masked_whiten(
    x: Tensor,
    mask: Tensor,
    shift_mean: bool = True,
    *,
    unbiased: bool = True,
    eps: float = 1e-8,
    global_sum: GlobalSum | None = None,
) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the valid entries of the batch (verl `masked_whiten`:
    unbiased variance, eps 1e-8); with shift_mean=False the mean is added back, so only the
    scale changes. `unbiased=False` divides the variance by n (OpenRLHF's REINFORCE++
    normalisation). `global_sum` makes the mean and variance those of every rank's batch.
    Masked entries are 0 in the output; a batch whose valid entries are all equal (or a
    single entry) has variance 0, and with shift_mean its output is exactly 0."""
    mean, var, _ = masked_moments(x, mask, unbiased=unbiased, global_sum=global_sum)
    m, (v,) = masked_floats(mask, ("x", x))
    if var == 0.0 and shift_mean:  # x - mean is rounding noise here; eps would magnify it
        return torch.zeros_like(v)
    out = (v - mean) * (var + eps) ** -0.5
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros_like(out))
