"""Plain-Python loop versions of every rlvr.algos function, and random-batch builders.

The references use Python floats and explicit loops, written from docs/algorithms.md and not
from the vectorised code, so that a test comparing the two checks the formula itself.
"""

from __future__ import annotations

import math

import torch
from hypothesis import settings

# Small, deterministic property runs: the whole directory must stay within seconds on 2 CPUs.
PROPS = settings(max_examples=20, deadline=None, derandomize=True)


# ---------------------------------------------------------------- advantages


def loop_group_advantages(rewards, group_size, scale="std", std="unbiased", eps=1e-6):
    out = []
    for k in range(0, len(rewards), group_size):
        g = rewards[k : k + group_size]
        mean = sum(g) / len(g)
        ddof = 1 if std == "unbiased" else 0
        sd = math.sqrt(sum((r - mean) ** 2 for r in g) / (len(g) - ddof))
        for r in g:
            if all(x == g[0] for x in g):
                out.append(0.0)
            elif scale == "std":
                out.append((r - mean) / (sd + eps))
            else:
                out.append(r - mean)
    return out


def loop_rloo(rewards, group_size):
    out = []
    for k in range(0, len(rewards), group_size):
        g = rewards[k : k + group_size]
        for i, r in enumerate(g):
            others = [x for j, x in enumerate(g) if j != i]
            out.append(r - sum(others) / len(others))
    return out


# ---------------------------------------------------------------- kl


def loop_kl(logp, ref, kind):
    if kind == "k1":
        return logp - ref
    if kind == "k2":
        return 0.5 * (logp - ref) ** 2
    x = ref - logp
    return math.exp(x) - x - 1.0


# ---------------------------------------------------------------- aggregation


def loop_aggregate(per_token, mask, mode, num_tokens=None, num_sequences=None, norm_constant=None):
    """per_token, mask: lists of lists. Masked entries are never read."""
    rows = len(per_token)
    n_seq = rows if num_sequences is None else num_sequences
    if mode == "sample_mean":
        total = 0.0
        for i in range(rows):
            vals = [per_token[i][t] for t in range(len(mask[i])) if mask[i][t]]
            total += sum(vals) / max(1, len(vals))
        return total / max(1, n_seq)
    vals = [per_token[i][t] for i in range(rows) for t in range(len(mask[i])) if mask[i][t]]
    if mode == "token_mean":
        n_tok = len(vals) if num_tokens is None else num_tokens
        return sum(vals) / max(1, n_tok)
    return sum(vals) / (norm_constant * max(1, n_seq))


# ---------------------------------------------------------------- policy loss


def loop_token_terms(
    logp, old, adv, mask, clip_low, clip_high, dual_clip=None, kl_coef=0.0, ref=None, kl_kind="k3"
):
    """Per-token loss L_it (list of lists; 0.0 at masked positions) for ratio='token'."""
    out = []
    for i in range(len(logp)):
        row = []
        for t in range(len(logp[i])):
            if not mask[i][t]:
                row.append(0.0)
                continue
            a = adv[i][t]
            rho = math.exp(logp[i][t] - old[i][t])
            clipped = min(max(rho, 1 - clip_low), 1 + clip_high)
            term = -min(rho * a, clipped * a)
            if dual_clip is not None and a < 0:
                term = min(term, -dual_clip * a)
            if kl_coef:
                term += kl_coef * loop_kl(logp[i][t], ref[i][t], kl_kind)
            row.append(term)
        out.append(row)
    return out


def loop_gspo_value(logp, old, adv_seq, mask, clip_low, clip_high):
    """GSPO's sequence objective as a loss: mean_i -min(s_i A_i, clip(s_i) A_i)."""
    total = 0.0
    for i in range(len(logp)):
        n = sum(1 for t in range(len(mask[i])) if mask[i][t])
        lr = sum(logp[i][t] - old[i][t] for t in range(len(mask[i])) if mask[i][t])
        s = math.exp(lr / max(1, n))
        if n:
            total += -min(s * adv_seq[i], min(max(s, 1 - clip_low), 1 + clip_high) * adv_seq[i])
    return total / len(logp)


# ---------------------------------------------------------------- shaping / sampling


def loop_soft_overlong(length, max_len, cache_len):
    if length <= max_len - cache_len:
        return 0.0
    if length <= max_len:
        return ((max_len - cache_len) - length) / cache_len
    return -1.0


def loop_keep_groups(correct, group_size):
    out = []
    for k in range(0, len(correct), group_size):
        c = sum(1 for x in correct[k : k + group_size] if x)
        out.append(0 < c < group_size)
    return out


# ---------------------------------------------------------------- random batches


def random_batch(seed, B, T, *, dtype=torch.float64, spread=0.3, empty_rows=True):
    """A (B, T) batch: mask from random lengths (some rows possibly empty), log-probs of
    real probabilities, old and ref log-probs near them, per-sequence advantages."""
    g = torch.Generator().manual_seed(seed)
    low = 0 if empty_rows else 1
    lengths = torch.randint(low, T + 1, (B,), generator=g)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    logp = torch.rand(B, T, generator=g, dtype=dtype).clamp_min(1e-3).log()
    old = logp + spread * torch.randn(B, T, generator=g, dtype=dtype)
    ref = logp + spread * torch.randn(B, T, generator=g, dtype=dtype)
    adv = torch.randn(B, generator=g, dtype=dtype)
    return logp, old, ref, adv, mask


def with_garbage(t, mask, seed):
    """Copy of t with NaN, +-inf and huge values at masked positions."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e30], dtype=t.dtype)
    junk = pool[torch.randint(0, len(pool), t.shape, generator=g)]
    return torch.where(mask, t, junk)


# ---------------------------------------------------------------- batch statistics' stages


def stage_totals(objective, settings, parts, draw_seed=None):
    """The totals an objective's `stages` give over `parts` (LossInputs, one rank), merged as
    the update merges them: sums added, `Largest` rows kept by rank."""
    from dataclasses import replace

    from rlvr.algos.cov import Largest, keep_largest

    totals = {}
    for stage in objective.stages(settings):
        outs = [stage(replace(p, batch_stats=totals, draw_seed=draw_seed), totals) for p in parts]
        merged = {}
        for key in outs[0]:
            values = [o[key] for o in outs]
            if isinstance(values[0], Largest):
                rows = torch.cat([v.rows for v in values])
                merged[key] = keep_largest(rows, values[0].k)
            else:
                merged[key] = sum(v.double() for v in values)
        totals = {**totals, **merged}
    return totals


def loop_cov_selection(logp, adv, mask, key, eligible, k):
    """Plain loops: cov_t over the valid tokens, and the k eligible tokens of largest
    (key(t, cov), row * 2^20 + position) as a set of (row, position)."""
    valid = [(i, t) for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t]]
    n = len(valid)
    mean_a = sum(adv[i][t] for i, t in valid) / n
    mean_l = sum(logp[i][t] for i, t in valid) / n
    cov = {(i, t): (adv[i][t] - mean_a) * (logp[i][t] - mean_l) for i, t in valid}
    ranked = sorted(
        (p for p in valid if eligible(p, cov[p])),
        key=lambda p: (key(p, cov[p]), p[0] * 2**20 + p[1]),
        reverse=True,
    )
    return cov, set(ranked[:k])
