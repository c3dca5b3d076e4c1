"""The rows still decoding in the fast engine's batched loop, with tools or without
(`FastEngine._decode`, `rlvr.rollout.fast_tools`): one implementation of how finished rows
are retired and of what a decoding step feeds the rows that remain."""

from __future__ import annotations

import torch

from rlvr.rollout.streams import select_rows


class LiveRows:
    """The live batch of a decoding loop.

    row_ids: live row -> output row. alive: (live,) rows not finished (a finished row stays
    in the batch, writing padding, until it is retired). mask: (live, P + T) the 2D attention
    mask, built once: the prompt's padding, then ones on every generation slot (the causal
    mask already hides the slots not written yet). next_pos: (live,) each row's position of
    its first new token (the trainer's: counting from the prompt's first real token).
    streams: the rows' RNG streams (`rlvr.rollout.fast.row_generators`), or None. masked:
    False where the CPU backend's prefix attention masks the prompts' padding itself.
    """

    def __init__(self, prompt_mask: torch.Tensor, expand: torch.Tensor, T: int, plan, streams):
        B, self.P, device = expand.shape[0], prompt_mask.shape[1], prompt_mask.device
        self.mask = torch.ones((B, self.P + T), dtype=prompt_mask.dtype, device=device)
        self.mask[:, : self.P] = prompt_mask.index_select(0, expand)
        self.next_pos = prompt_mask.sum(-1).index_select(0, expand)
        self.masked = plan is None or plan.layout is None
        self.row_ids = torch.arange(B, device=device)
        self.alive = torch.ones(B, dtype=torch.bool, device=device)
        self.streams = streams

    def compact(
        self, tokens: torch.Tensor, n_alive: int | None, fraction: float | None, cache, plan
    ) -> torch.Tensor:
        """Retire the finished rows once at least `fraction` of the live batch has finished
        (each compaction copies the whole KV cache, so it is not done every step): the cache,
        the CPU backend plan's rows, the mask, positions and streams index-selected down to
        the unfinished rows. `n_alive`: the unfinished rows, None where they were not counted
        this step (nothing retired); `fraction` None never retires. Returns the kept rows'
        `tokens`."""
        live = self.alive.shape[0]
        if fraction is None or n_alive is None or live - n_alive < fraction * live:
            return tokens
        keep = self.alive.nonzero().squeeze(1)
        cache.reorder_cache(keep)
        if plan is not None:
            plan.retire(keep)
        self.row_ids, self.alive = self.row_ids[keep], self.alive[keep]
        self.mask, self.next_pos = self.mask[keep], self.next_pos[keep]
        self.streams = select_rows(self.streams, keep)
        return tokens[keep]

    def step(self, engine, tokens: torch.Tensor, t: int, cache, plan) -> torch.Tensor:
        """(live, V) logits after feeding each live row its token of step `t`: the CPU
        backend plan's decoding step where it takes this one, else `engine.next_logits` on
        the mask of the tokens seen so far (a view)."""
        logits = None if plan is None else plan.step(tokens, self.next_pos + t, cache)
        if logits is None:
            step_mask = self.mask[:, : self.P + t + 1] if self.masked else None
            positions = (self.next_pos + t)[:, None]
            logits = engine.next_logits(tokens[:, None], step_mask, positions, cache)
        return logits
