"""Training on the top-entropy share of tokens ("Beyond the 80/20 rule", arXiv 2506.01939;
TRL's `top_entropy_quantile`; docs/algorithms.md#top-entropy-tokens): an option on any
objective, not an objective of its own.

Of the whole mini-batch's loss tokens (every micro-batch, every rank) only those whose
entropy under the policy is in the top q share stay in the loss; the others leave the loss
*and* its normalisers (the paper's code multiplies the response mask by the selection, so
`token_mean` divides by the kept tokens and `sample_mean` averages each response over its
kept tokens, then over the responses with any). The paper keeps q = 0.2.

The share is taken over a fixed grid, so that it composes over micro-batches and ranks as
the objective registry's `stats` require: entropies fall into NBINS bins of width H_MAX /
NBINS (2^-9 nats; entropy / width is exact in floating point), each micro-batch returns its
histogram of loss tokens and of each response's highest bin, and the summed histograms give
every micro-batch the same threshold: the highest bin edge with at least ceil(q N) of the N
loss tokens at or above it. The kept share is therefore at least q and exceeds it by at most
the tokens of the boundary bin (tokens whose entropies agree to 2^-9 nats), never the
token-exact top-k of a one-batch `topk`; the selection is the same however the mini-batch is
split. Entropies above H_MAX (16 nats, a vocabulary of 8.9M) share the top bin.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .loss_inputs import LossOutput

if TYPE_CHECKING:
    from .objectives import LossInputs, LossSettings, Objective

NBINS = 8192
H_MAX = 16.0
WIDTH = H_MAX / NBINS
TOKENS, ROWS = "top_entropy/tokens", "top_entropy/rows"


def entropy_bins(entropy: Tensor) -> Tensor:
    """Each token's bin, floor(H / WIDTH) clamped to [0, NBINS - 1] (long)."""
    return torch.floor(entropy.double() / WIDTH).clamp(0, NBINS - 1).long()


def entropy_stats(inputs: LossInputs) -> dict[str, Tensor]:
    """This micro-batch's histograms: loss tokens per entropy bin, and responses per bin of
    their highest-entropy loss token (a response has a kept token iff that bin is kept)."""
    if inputs.entropy is None:
        raise ValueError("top_entropy_quantile needs the policy's per-token entropy")
    m = inputs.response_mask
    mask = m if m.dtype == torch.bool else m != 0
    bins = entropy_bins(inputs.entropy)
    tokens = torch.bincount(bins[mask], minlength=NBINS).double()
    top = torch.where(mask, bins, torch.full_like(bins, -1))
    top = top.amax(dim=1) if top.shape[1] else top.new_full(top.shape[:1], -1)
    rows = torch.bincount(top[top >= 0], minlength=NBINS).double()
    return {TOKENS: tokens, ROWS: rows}


def threshold_bin(tokens: Tensor, q: float) -> int:
    """The highest bin k with at least ceil(q N) tokens in bins >= k; NBINS when N = 0."""
    n = float(tokens.sum())
    if n == 0:
        return NBINS
    want = max(1, math.ceil(q * n - 1e-9))  # 0.2 * 10 is 2.0000000000000004 in floats
    at_or_above = torch.flip(torch.cumsum(torch.flip(tokens, (0,)), 0), (0,))
    return int((at_or_above >= want).nonzero().max())


def with_top_entropy(objective: Objective, q: float) -> Objective:
    """`objective` on the top-q entropy share of the mini-batch's loss tokens (module
    docstring). Its metrics are over the kept tokens (their `num_tokens`), plus
    top_entropy_kept_frac (kept / loss tokens of the mini-batch) and top_entropy_threshold
    (the entropy, in nats, from which tokens are kept)."""
    if objective.stats is not None or objective.stages is not None:
        raise ValueError(
            f"top_entropy_quantile: got {q!r}, expected 1 with {objective.name!r}, whose own "
            "batch statistics would count the dropped tokens"
        )

    def fn(inputs: LossInputs, settings: LossSettings) -> LossOutput:
        tokens, rows = inputs.batch_stats[TOKENS], inputs.batch_stats[ROWS]
        k = threshold_bin(tokens, q)
        m = inputs.response_mask
        mask = m if m.dtype == torch.bool else m != 0
        keep = mask & (entropy_bins(inputs.entropy) >= k)
        kept = tokens[k:].sum()
        inner = replace(
            inputs, response_mask=keep, num_tokens=kept, num_sequences=rows[k:].sum(),
            batch_stats={},
        )  # fmt: skip
        out = objective.fn(inner, settings)
        extra = {
            "top_entropy_kept_frac": float(kept / tokens.sum().clamp_min(1)),
            "top_entropy_threshold": k * WIDTH,
        }
        return LossOutput(loss=out.loss, metrics={**out.metrics, **extra})

    return replace(objective, fn=fn, stats=entropy_stats)
