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

from rlvr.rollout.live_cache import LiveLayer
from rlvr.rollout.live_rows import LiveRows
from rlvr.rollout.ragged import decode_ragged
from rlvr.rollout.turns import ToolRows


def decode_with_tools(engine, logits, cache, plan, prompt_mask, expand, generators, params, rows):
    """`FastEngine._decode` for an engine with `tools`: one token per live row per step,
    a queued tool token where the row has one."""
    plain = engine.cache == "static" and all(type(x) is LiveLayer for x in cache.layers)
    if plan is None and plain and engine.tool_prefill:
        return decode_ragged(engine, logits, cache, prompt_mask, expand, generators, params, rows)
    box = engine.tools
    max_new = params.max_new_tokens
    T = box.total_tokens(max_new)
    B, device = len(rows), logits.device
    pad = engine.pad_id
    out = ToolRows(box, B, T, pad, device)
    completion, log_probs, tool_mask = out.completion, out.log_probs, out.tool_mask
    live = LiveRows(prompt_mask, expand, T, plan, generators)
    eos = torch.tensor(engine.eos_ids, dtype=torch.long, device=device)
    ends = torch.full((B,), T, dtype=torch.long)  # per output row: its length
    close_last = box.close_ids[-1]
    queued: dict[int, list[int]] = {}  # output row -> tool tokens still to feed
    steps = 0
    for t in range(T):
        tokens, lp = engine.sample(logits, params, None, live.streams, plan, t)
        row_ids, alive = live.row_ids, live.alive
        fed = torch.zeros_like(alive)
        if queued:
            at = {r: k for k, r in enumerate(row_ids.tolist())}
            idx = torch.tensor([at[r] for r in queued], dtype=torch.long, device=device)
            tokens[idx] = torch.tensor([q.pop(0) for q in queued.values()], device=device)
            lp[idx] = 0.0
            fed[idx] = True
            tool_mask[row_ids[idx].cpu(), t] = True
            queued = {r: q for r, q in queued.items() if q}
        completion[row_ids, t] = torch.where(alive, tokens, pad)
        log_probs[row_ids, t] = torch.where(alive, lp, 0.0)
        steps = t + 1
        own = alive & ~fed  # the model's tokens this step
        out.model_count[row_ids] += own.long()
        is_eos = own & torch.isin(tokens, eos)
        full = own & ~is_eos & ((out.model_count[row_ids] >= max_new) | (t + 1 >= T))
        maybe = own & ~is_eos & ~full & (tokens == close_last)
        for k in maybe.nonzero().flatten().tolist():
            r = int(row_ids[k])
            reply = out.tally.call(r, completion[r, out.turn_start[r] : t + 1].tolist())
            if reply is None:
                continue
            queued[r] = reply.ids[: T - (t + 1)]
            out.turn_start[r] = t + 1 + len(queued[r])
        done = is_eos | full
        if done.any():
            finished = row_ids[done].cpu()
            ends[finished] = t + 1
            out.eos_seen[row_ids[is_eos].cpu()] = True
            alive &= ~done
        if t == T - 1:
            break
        n_alive = int(alive.sum())
        if n_alive == 0:
            break
        tokens = live.compact(tokens, n_alive, engine.retire_fraction, cache, plan)
        logits = live.step(engine, tokens, t, cache, plan)

    return out.rollout(rows, torch.minimum(ends, torch.tensor(steps)), params.n)
