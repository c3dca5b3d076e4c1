"""The `fast` engine's decoding loop with tools on the CPU backend's paths (docs/tools.md;
the rules are `rlvr.rollout.turns`'s, shared with the hf engine). On the torch path (no
backend plan, the static cache) a tool turn is instead one multi-token prefill of its row
(`rlvr.rollout.ragged`).

Every row decodes in the same batched loop as without tools. When a row's model token
closes a tool call, the tool runs at once and its turn is queued for that row: in the
following steps the row is fed the queued tokens instead of its samples (written with the
tool mask, their log-probs 0), one a step, each extending its KV cache as a prefill would,
while every other row keeps sampling. No row waits for another's tool, the batch never
stops for a round, and the loop's step (`plan.step` on the CPU backend's C kernels, or the
modules) is the same one, so both paths run tools.
"""

from __future__ import annotations

import torch

from rlvr.rollout.base import Rollout
from rlvr.rollout.live_cache import LiveLayer
from rlvr.rollout.ragged import decode_ragged
from rlvr.rollout.streams import select_rows
from rlvr.rollout.turns import ToolTally


def decode_with_tools(engine, logits, cache, plan, prompt_mask, expand, generators, params, rows):
    """`FastEngine._decode` for an engine with `tools`: one token per live row per step,
    a queued tool token where the row has one."""
    plain = engine.cache == "static" and all(type(x) is LiveLayer for x in cache.layers)
    if plan is None and plain and engine.tool_prefill:
        return decode_ragged(engine, logits, cache, prompt_mask, expand, generators, params, rows)
    box = engine.tools
    max_new = params.max_new_tokens
    T = box.total_tokens(max_new)
    B, P, device = len(rows), prompt_mask.shape[1], logits.device
    pad = engine.pad_id
    completion = torch.full((B, T), pad, dtype=torch.long, device=device)
    log_probs = torch.zeros((B, T), dtype=torch.float32, device=device)
    tool_mask = torch.zeros((B, T), dtype=torch.bool)
    mask = torch.ones((B, P + T), dtype=prompt_mask.dtype, device=device)
    mask[:, :P] = prompt_mask.index_select(0, expand)
    next_pos = prompt_mask.sum(-1).index_select(0, expand)
    masked = plan is None or plan.layout is None

    row_ids = torch.arange(B, device=device)  # live batch row -> output row
    alive = torch.ones(B, dtype=torch.bool, device=device)
    eos = torch.tensor(engine.eos_ids, dtype=torch.long, device=device)
    model_count = torch.zeros(B, dtype=torch.long, device=device)  # per output row
    ends = torch.full((B,), T, dtype=torch.long)  # per output row: its length
    eos_seen = torch.zeros(B, dtype=torch.bool)
    close_last = box.close_ids[-1]
    tally = ToolTally(box, B)
    turn_start = [0] * B
    queued: dict[int, list[int]] = {}  # output row -> tool tokens still to feed
    steps, streams = 0, generators
    for t in range(T):
        tokens, lp = engine._sample(logits, params, None, streams, plan, t)
        fed = torch.zeros_like(alive)
        if queued:
            live = {r: k for k, r in enumerate(row_ids.tolist())}
            idx = torch.tensor([live[r] for r in queued], dtype=torch.long, device=device)
            tokens[idx] = torch.tensor([q.pop(0) for q in queued.values()], device=device)
            lp[idx] = 0.0
            fed[idx] = True
            tool_mask[row_ids[idx].cpu(), t] = True
            queued = {r: q for r, q in queued.items() if q}
        completion[row_ids, t] = torch.where(alive, tokens, pad)
        log_probs[row_ids, t] = torch.where(alive, lp, 0.0)
        steps = t + 1
        own = alive & ~fed  # the model's tokens this step
        model_count[row_ids] += own.long()
        is_eos = own & torch.isin(tokens, eos)
        full = own & ~is_eos & ((model_count[row_ids] >= max_new) | (t + 1 >= T))
        maybe = own & ~is_eos & ~full & (tokens == close_last)
        for k in maybe.nonzero().flatten().tolist():
            r = int(row_ids[k])
            reply = tally.call(r, completion[r, turn_start[r] : t + 1].tolist())
            if reply is None:
                continue
            queued[r] = reply.ids[: T - (t + 1)]
            turn_start[r] = t + 1 + len(queued[r])
        done = is_eos | full
        if done.any():
            finished = row_ids[done].cpu()
            ends[finished] = t + 1
            eos_seen[row_ids[is_eos].cpu()] = True
            alive &= ~done
        if t == T - 1:
            break
        n_alive = int(alive.sum())
        if n_alive == 0:
            break
        live_n = alive.shape[0]
        retire = engine.retire_fraction is not None
        if retire and live_n - n_alive >= engine.retire_fraction * live_n:
            keep = alive.nonzero().squeeze(1)
            cache.reorder_cache(keep)
            if plan is not None:
                plan.retire(keep)
            row_ids, alive, tokens = row_ids[keep], alive[keep], tokens[keep]
            mask, next_pos = mask[keep], next_pos[keep]
            streams = select_rows(streams, keep)
        logits = None if plan is None else plan.step(tokens, next_pos + t, cache)
        if logits is None:
            step_mask = mask[:, : P + t + 1] if masked else None
            logits = engine._forward(tokens[:, None], step_mask, (next_pos + t)[:, None], cache)

    ends = torch.minimum(ends, torch.tensor(steps))
    width = int(ends.max()) if B else 0
    return Rollout(
        prompt_ids=rows,
        completion_ids=completion[:, :width].cpu(),
        lengths=ends,
        truncated=~eos_seen,
        group_size=params.n,
        sampling_log_probs=log_probs[:, :width].cpu(),
        tool_mask=tool_mask[:, :width],
        **tally.rollout_fields(),
    )
