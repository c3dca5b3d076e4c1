"""Per-row random streams for batched sampling on the GPU, without per-row generators.

A row's draw at decoding step t is a Gumbel-max over the vocabulary,

    token = argmax_v (filtered_logits[v] + G[v]),   G[v] = -log(-log U[v]),

which samples exactly softmax(filtered_logits) (Gumbel-max trick). U[v] is a uniform number
computed, not drawn: a counter-based hash of (row key, t, v) evaluated on the device, so a
row's stream depends only on its own seed and the step, never on which other rows share
the batch or on how often the batch was compacted, and the whole batch is one set of
elementwise kernels with no per-row work and no host sync.

The hash is a 32-bit integer mixer (xor-shift-multiply rounds) computed in int64 with
every value below 2**32 and every multiplier below 2**31, so no product overflows. U keeps
its top 24 bits: (h >> 8 + 0.5) / 2**24, strictly inside (0, 1) and exact in fp32.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFF_FFFF
_C1, _C2 = 0x7FEB_352D, 0x6A09_E667  # odd multipliers < 2**31
CHUNK_ELEMENTS = 1 << 24


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mixer on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _C1) & _M32
    x = x ^ (x >> 15)
    x = (x * _C2) & _M32
    return x ^ (x >> 16)


def _mix32_int(x: int) -> int:
    x ^= x >> 16
    x = (x * _C1) & _M32
    x ^= x >> 15
    x = (x * _C2) & _M32
    return x ^ (x >> 16)


def row_key(seed: int) -> int:
    """A row's 32-bit stream key from its (up to 64-bit) seed."""
    seed &= (1 << 64) - 1
    return _mix32_int((seed & _M32) ^ _mix32_int((seed >> 32) ^ 0x9E37_79B9))


class CounterStreams:
    """One random stream per row: `keys` (N,) int64, from `row_key` of each row's seed."""

    def __init__(self, keys: torch.Tensor):
        self.keys = keys

    @classmethod
    def from_seeds(cls, seeds: list[int], device) -> CounterStreams:
        return cls(torch.tensor([row_key(s) for s in seeds], dtype=torch.long, device=device))

    def __len__(self) -> int:
        return self.keys.shape[0]

    def rows(self, index: torch.Tensor) -> CounterStreams:
        """The streams of the rows kept (index: positions in this batch)."""
        return CounterStreams(self.keys.index_select(0, index))

    def uniform(self, step: int, vocab: int) -> torch.Tensor:
        """(N, vocab) fp32 uniforms in (0, 1) for decoding step `step`."""
        step_key = mix32(self.keys ^ _mix32_int((step * 0x9E37_79B9 + 0x85EB_CA6B) & _M32))
        v = torch.arange(vocab, dtype=torch.long, device=self.keys.device)
        h = mix32(mix32(step_key[:, None] ^ v[None, :]) ^ 0x2545_F491)
        return ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))

    def draw(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        """(N,) a sample of softmax(logits) per row (-inf entries never drawn). Rows go in
        chunks of about 2**24 noise values: the hash's int64 temporaries stay ~128 MiB each."""
        N, V = logits.shape
        chunk = max(1, CHUNK_ELEMENTS // max(V, 1))
        out = []
        for lo in range(0, N, chunk):
            part = self if chunk >= N else CounterStreams(self.keys[lo : lo + chunk])
            gumbel = -torch.log(-torch.log(part.uniform(step, V)))
            out.append((logits[lo : lo + chunk].float() + gumbel).argmax(dim=-1))
        return out[0] if len(out) == 1 else torch.cat(out)


def select_rows(streams: list[torch.Generator] | CounterStreams | None, keep: torch.Tensor):
    """The streams of the rows kept after a compaction (`keep`: positions in the batch): a
    row's stream goes with it, one `torch.Generator` a row or `CounterStreams.rows`."""
    if streams is None or isinstance(streams, CounterStreams):
        return None if streams is None else streams.rows(keep)
    return [streams[i] for i in keep.tolist()]
