"""The fast engine's cache layer for plain full-attention layers, shared by its decoding
loops (`rlvr.rollout.fast`, `fast_tools`, `ragged`)."""

from __future__ import annotations

from transformers.cache_utils import StaticLayer


class LiveLayer(StaticLayer):
    """A preallocated cache layer that hands attention only the slots written so far.

    `StaticLayer` returns all `max_cache_len` slots (masked), so every decoding step would
    attend over the full prompt + max_new_tokens width; this returns a view of the live
    prefix instead (no copy), and sizes the mask to match. The write itself is StaticLayer's:
    in place, at `cumulative_length`.
    """

    is_compileable = False  # lets the mask code skip the mask when nothing is padded

    def __init__(self, max_cache_len: int, **kwargs):
        super().__init__(max_cache_len, **kwargs)
        self.live = 0  # python int: no device sync to size the mask

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        self.live += key_states.shape[-2]
        return keys[:, :, : self.live], values[:, :, : self.live]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.live + query_length, 0
