"""The fast engine's torch path with tools: a tool turn is one multi-token prefill of its row.

Without tools every row of the batch writes its KV cache at the same column each step. Here
each row has its own length: `_RaggedLayer` keeps the preallocated cache (B, heads, L, dim)
and writes row b's new token at its own column n_b. A decoding step feeds one token per live
row (the 2D mask marks each row's columns, so the rows' different lengths are just padding
on the right); when a row's token closes a tool call, the tool runs and its turn's K tokens
are forwarded for that row alone, on a view of its cache rows (written in place), in one
forward, while the other rows lose no step. The step after, the row samples again from the
logits of its turn's last token. Positions are the trainer's (prompt length + tokens so far),
so the log-probs match `token_log_probs` on the same rows.
"""

from __future__ import annotations

import copy

import torch
from transformers.cache_utils import StaticLayer

from rlvr.rollout.streams import select_rows
from rlvr.rollout.turns import ToolRows


class _RaggedState:
    """What every layer of the cache reads: each live row's length, the longest, and (for a
    prefill) the rows being extended, their new tokens' columns and how many are real."""

    def __init__(self, n: torch.Tensor):
        self.n, self.live = n, int(n.max()) if len(n) else 0
        self.rows: torch.Tensor | None = None  # (R,) batch rows of a prefill
        self.columns: torch.Tensor | None = None  # (R, K) where each new token goes
        self.real: torch.Tensor | None = None  # (R, K) True on a row's own tokens
        self.end = 0  # columns the prefill attends over


class _RaggedLayer(StaticLayer):
    """A preallocated cache layer whose rows have their own lengths (see the module doc)."""

    is_compileable = False

    def __init__(self, layer: StaticLayer, state: _RaggedState):
        super().__init__(layer.max_cache_len)
        self.keys, self.values, self.state = layer.keys, layer.values, state
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        s = self.state
        if s.rows is None:  # one token per row, each at its row's own column
            idx = s.n.clamp(max=self.max_cache_len - 1)  # a finished row may sit at the end
            b = torch.arange(key_states.shape[0], device=key_states.device)
            self.keys[b, :, idx] = key_states[:, :, 0]
            self.values[b, :, idx] = value_states[:, :, 0]
            return self.keys[:, :, : s.live + 1], self.values[:, :, : s.live + 1]
        # the tool turns of several rows, right-padded to the longest: only real tokens land
        rows = s.rows[:, None].expand_as(s.columns)[s.real]
        self.keys[rows, :, s.columns[s.real]] = key_states.transpose(1, 2)[s.real]
        self.values[rows, :, s.columns[s.real]] = value_states.transpose(1, 2)[s.real]
        keys, values = self.keys.index_select(0, s.rows), self.values.index_select(0, s.rows)
        return keys[:, :, : s.end], values[:, :, : s.end]

    def get_seq_length(self) -> int:
        s = self.state
        return s.live if s.rows is None else s.end - s.columns.shape[1]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.keys = self.keys.index_select(0, beam_idx)
        self.values = self.values.index_select(0, beam_idx)


def decode_ragged(engine, logits, cache, prompt_mask, expand, generators, params, rows):
    """`FastEngine._decode` with tools on the torch path (module doc; the rules are
    `rlvr.rollout.turns`'s)."""
    box, max_new = engine.tools, params.max_new_tokens
    T = box.total_tokens(max_new)
    B, P, device, pad = len(rows), prompt_mask.shape[1], logits.device, engine.pad_id
    out = ToolRows(box, B, T, pad, device)
    completion, log_probs, tool_mask = out.completion, out.log_probs, out.tool_mask
    prompt_part = prompt_mask.index_select(0, expand)  # (B, P) the left-padded prompts
    prompt_len = prompt_mask.sum(-1).index_select(0, expand)
    w = torch.zeros(B, dtype=torch.long, device=device)  # tokens written, per output row
    state = _RaggedState(torch.full((B,), P, dtype=torch.long, device=device))
    view = copy.copy(cache)  # the same layers, seen through the ragged state
    view.layers = [_RaggedLayer(layer, state) for layer in cache.layers]

    row_ids = torch.arange(B, device=device)
    alive = torch.ones(B, dtype=torch.bool, device=device)
    eos = torch.tensor(engine.eos_ids, dtype=torch.long, device=device)
    streams = generators
    for t in range(T):
        tokens, lp = engine.sample(logits, params, None, streams, None, t)
        at = w[row_ids].clamp(max=T - 1)
        completion[row_ids, at] = torch.where(alive, tokens, completion[row_ids, at])
        log_probs[row_ids, at] = torch.where(alive, lp, log_probs[row_ids, at])
        positions = prompt_len[row_ids] + w[row_ids]
        w[row_ids] += alive.long()
        out.model_count[row_ids] += alive.long()
        is_eos = alive & torch.isin(tokens, eos)
        full = alive & ~is_eos & ((out.model_count[row_ids] >= max_new) | (w[row_ids] >= T))
        maybe = alive & ~is_eos & ~full & (tokens == box.close_ids[-1])
        replies = {}
        for k in maybe.nonzero().flatten().tolist():
            r = int(row_ids[k])
            reply = out.tally.call(r, completion[r, out.turn_start[r] : int(w[r])].tolist())
            if reply is None:
                continue
            ids = reply.ids[: T - int(w[r])]
            start = int(w[r])
            completion[r, start : start + len(ids)] = torch.tensor(ids, device=device)
            tool_mask[r, start : start + len(ids)] = True
            w[r] += len(ids)
            out.turn_start[r] = start + len(ids)
            if int(w[r]) >= T:
                full[k] = True  # the turn was cut at the budget: the row ends, truncated
            else:
                replies[k] = ids
        done = is_eos | full
        out.eos_seen[row_ids[is_eos].cpu()] = True
        alive &= ~done
        fed = alive.clone()  # rows whose token's KV is kept: a row that ended needs none
        n_alive = int(alive.sum())
        if t == T - 1 or n_alive == 0:
            break
        live_n = alive.shape[0]
        if (
            engine.retire_fraction is not None
            and live_n - n_alive >= engine.retire_fraction * live_n
        ):
            keep = alive.nonzero().squeeze(1)
            view.reorder_cache(keep)
            state.n = state.n[keep]
            row_ids, alive, tokens, fed = row_ids[keep], alive[keep], tokens[keep], fed[keep]
            positions, streams = positions[keep], select_rows(streams, keep)
            replies = {
                int(j): replies[int(k)] for j, k in enumerate(keep.tolist()) if int(k) in replies
            }
        # one decoding step for every live row, at its own column
        state.live = int(state.n.max())
        mask = _mask(prompt_part.index_select(0, row_ids), state.n, state.live + 1)
        logits = engine.next_logits(tokens[:, None], mask, positions[:, None], view)
        state.n = state.n + fed.long()
        if replies:  # every tool turn of this step: one forward, each row its own K tokens
            logits = _prefill(
                engine, view, state, replies, row_ids, prompt_part, prompt_len, w, logits
            )
        state.live = int(state.n.max())

    return out.rollout(rows, w.cpu().clamp(max=T), params.n)


def _prefill(engine, view, state, replies, row_ids, prompt_part, prompt_len, w, logits):
    """Forward the tool turns `replies` ({live row: ids}) of their rows in one batch, right-
    padded to the longest, with a 4D mask: each token sees its row's prompt, its row's tokens
    so far and the turn's tokens up to itself. The logits of each turn's last token become
    its row's."""
    device = logits.device
    ks = list(replies)
    rows = torch.tensor(ks, dtype=torch.long, device=device)
    lens = torch.tensor([len(replies[k]) for k in ks], dtype=torch.long, device=device)
    K = int(lens.max())
    ids = torch.full((len(ks), K), engine.pad_id, dtype=torch.long, device=device)
    for i, k in enumerate(ks):
        ids[i, : len(replies[k])] = torch.tensor(replies[k], dtype=torch.long, device=device)
    steps = torch.arange(K, device=device)
    starts = state.n.index_select(0, rows)  # the turn's first column in each row
    out_rows = row_ids.index_select(0, rows)
    first = prompt_len.index_select(0, out_rows) + w.index_select(0, out_rows) - lens
    state.rows, state.real = rows, steps[None, :] < lens[:, None]
    state.columns = (starts[:, None] + steps).clamp(max=view.layers[0].max_cache_len - 1)
    state.end = int((starts + lens).max())
    P = prompt_part.shape[1]
    cols = torch.arange(state.end, device=device)
    sees = (cols[None, None, :] <= (starts[:, None] + steps)[:, :, None]) & (cols >= P)
    sees |= torch.nn.functional.pad(
        prompt_part.index_select(0, out_rows).bool(), (0, state.end - P)
    )[:, None, :]
    dtype = next(engine.model.parameters()).dtype
    mask = torch.zeros(sees.shape, dtype=dtype, device=device).masked_fill(
        ~sees, torch.finfo(dtype).min
    )[:, None]
    try:
        out = engine.forward(ids, mask, first[:, None] + steps, view, keep=K)
    finally:
        state.rows = state.columns = state.real = None
    state.n[rows] = starts + lens
    logits = logits.clone()
    logits[rows] = out[torch.arange(len(ks), device=device), lens - 1].to(logits.dtype)
    return logits


def _mask(prompt_part: torch.Tensor, n: torch.Tensor, width: int) -> torch.Tensor:
    """(rows, width) 2D attention mask: each row's prompt (left-padded to P columns) and its
    columns P .. n (its tokens and the one being written)."""
    P = prompt_part.shape[1]
    cols = torch.arange(P, width, device=n.device)
    return torch.cat([prompt_part, (cols[None, :] <= n[:, None]).to(prompt_part.dtype)], dim=1)
