"""How a mini-batch's samples are cut into micro-batches, and what each one computes.

Two rules (`optim.micro_batch_sequences`, `optim.micro_batch_tokens`), three layouts:

    padded    left-padded prompts (width P) + right-padded completions (width T): a
              micro-batch of B rows computes B (P + T) positions
    shared    `optim.share_prompt`: each of the U distinct prompts once, then the B
              completions on its cache: U P + B T positions
    pad_free  `optim.pad_free`: the samples one after another in a single row, positions
              restarting at each and attention kept within each: sum(p_i + c_i) positions

By sequences (the default), a micro-batch holds at most `micro_batch_sequences` samples,
sorted by total length. By tokens (`micro_batch_tokens` > 0), the samples are taken in
order of length (with prompt sharing, each prompt's samples together) and cut into runs
whose positions in their layout stay within the budget, the cut points chosen to minimise
padding plus a small cost per micro-batch (`by_tokens`): similar lengths share a
micro-batch, so padding is small, and its memory is bounded by max(budget, the longest
sample alone) whatever the lengths are. A sample longer than the budget gets a micro-batch of
its own (logged once per process). The loss and its gradient do not depend on the cut: every
micro-batch's loss is normalised by the optimiser step's global counts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rlvr.rollout.base import dedupe
from rlvr.training.batch import Sample

log = logging.getLogger(__name__)
_said_over_budget = False


def positions(samples: Sequence[Sample], layout: str) -> tuple[int, int]:
    """(computed, real) positions of one micro-batch in `layout` ("padded", "shared" or
    "pad_free"): what its forward computes, and the prompt and completion tokens among them
    (a shared prompt counted once). Placeholder rows (group -1) count for nothing."""
    samples = [s for s in samples if s.group >= 0]
    if not samples:
        return 0, 0
    completions = sum(len(s.completion_ids) for s in samples)
    T = max(max(len(s.completion_ids) for s in samples), 1)
    if layout == "shared":
        prompts, _ = dedupe([s.prompt_ids for s in samples])
        real = sum(len(p) for p in prompts) + completions
        return len(prompts) * max(len(p) for p in prompts) + len(samples) * T, real
    real = sum(len(s.prompt_ids) for s in samples) + completions
    if layout == "pad_free":
        return real, real
    P = max(len(s.prompt_ids) for s in samples)
    return len(samples) * (P + T), real


def micro_batches(
    samples: list[Sample], sequences: int, tokens: int = 0, layout: str = "padded"
) -> list[list[int]]:
    """The micro-batches (row indices) of `samples`: by `tokens` per micro-batch when > 0
    (`by_tokens`), else by `sequences` (`by_sequences`)."""
    if tokens > 0:
        return by_tokens(samples, tokens, layout)
    return by_sequences(samples, sequences, layout == "shared")


def by_sequences(samples: list[Sample], size: int, share_prompt: bool = False) -> list[list[int]]:
    """Micro-batches (row indices) of at most `size` sequences. Sorted by total length so each
    pads only to similar lengths; with `share_prompt`, the samples of one prompt stay together
    (a prompt with more than `size` samples is split into chunks, each of which forwards it
    once), and the chunks, sorted by their longest sequence, are packed in order."""
    if not share_prompt:
        order = sorted(range(len(samples)), key=lambda i: _length(samples[i]))
        return [order[i : i + size] for i in range(0, len(order), size)]
    micros: list[list[int]] = []
    for c in _prompt_chunks(samples, size):
        if micros and len(micros[-1]) + len(c) <= size:
            micros[-1] += c
        else:
            micros.append(list(c))
    return micros


def by_tokens(samples: list[Sample], budget: int, layout: str = "padded") -> list[list[int]]:
    """Micro-batches (row indices) whose computed positions in `layout` (`positions`) stay
    within `budget`, a sample over the budget alone. The samples are taken in order of total
    length (shared: each prompt's samples by length, the prompts by their longest) and cut
    into consecutive runs that minimise the positions computed plus `overhead(budget)` for
    each micro-batch (dynamic programming over the cut points): fewer, fuller micro-batches
    where that costs little padding, a cut where a length jumps."""
    if layout == "shared":
        order = [i for chunk in _prompt_chunks(samples, len(samples) or 1) for i in chunk]
    else:
        order = sorted(range(len(samples)), key=lambda i: _length(samples[i]))
    n, extra = len(order), overhead(budget)
    best, start = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for b in range(1, n + 1):
        run = _Run(layout)
        for a in range(b - 1, -1, -1):  # the run order[a:b], grown backwards
            computed = run.add(samples[order[a]])
            if computed > budget and b - a > 1:
                break
            if best[a] + computed + extra < best[b]:
                best[b], start[b] = best[a] + computed + extra, a
    micros, b = [], n
    while b:
        micros.append(order[start[b] : b])
        b = start[b]
    micros.reverse()
    for m in micros:
        if len(m) == 1 and _length(samples[m[0]]) > budget:
            _say_over_budget(_length(samples[m[0]]), budget)
    return micros


def overhead(budget: int) -> float:
    """What one more micro-batch costs, in positions, when `by_tokens` weighs it against
    padding: budget / 32 (128 positions at 4,096). On the CPU a forward and backward of the
    27.6M grid model costs about as much per micro-batch as ~10 positions (its weights read
    again, Python's per-layer calls); a GPU's small micro-batches cost more (kernel launches,
    matrices too narrow to fill it), and budgets there are larger. On bench/packing.py's draw
    at 4,096: 3.3% padding in 10 micro-batches, against 14.8% in 5 without the weighing
    (greedy filling) and 0% in 32 (one sample each)."""
    return budget / 32


class _Run:
    """The positions of a run of samples as it grows, one sample at a time (`positions`)."""

    def __init__(self, layout: str) -> None:
        self.layout = layout
        self.rows = self.P = self.T = self.real = 0
        self.prompts: set[tuple[int, ...]] = set()

    def add(self, s: Sample) -> int:
        """Adds `s`; returns the run's computed positions."""
        p, c = len(s.prompt_ids), len(s.completion_ids)
        self.rows += 1
        self.P, self.T = max(self.P, p), max(self.T, c, 1)
        if self.layout == "shared":
            self.prompts.add(tuple(s.prompt_ids))
            return len(self.prompts) * self.P + self.rows * self.T
        self.real += p + c
        return self.real if self.layout == "pad_free" else self.rows * (self.P + self.T)


def _length(s: Sample) -> int:
    return len(s.prompt_ids) + len(s.completion_ids)


def _prompt_chunks(samples: list[Sample], size: int) -> list[list[int]]:
    """Each prompt's samples sorted by length, in chunks of at most `size`; the chunks sorted
    by their prompt's length plus their longest completion."""
    prompts, index = dedupe([s.prompt_ids for s in samples])
    by_prompt: list[list[int]] = [[] for _ in prompts]
    for i, k in enumerate(index):
        by_prompt[k].append(i)
    chunks = []
    for same in by_prompt:
        same = sorted(same, key=lambda i: len(samples[i].completion_ids))
        chunks += [same[i : i + size] for i in range(0, len(same), size)]
    chunks.sort(key=lambda c: len(samples[c[0]].prompt_ids) + len(samples[c[-1]].completion_ids))
    return chunks


def _say_over_budget(length: int, budget: int) -> None:
    global _said_over_budget
    if not _said_over_budget:
        _said_over_budget = True
        log.warning(
            "optim.micro_batch_tokens=%d: a sample of %d prompt and response tokens is "
            "longer, so it is a micro-batch of its own (said once; memory follows the "
            "longest sample)",
            budget,
            length,
        )
