"""Decode attention with the group's prompt read once: a cascade over a shared prefix.

In GRPO every prompt is sampled G times, and a decoding step of a plain KV cache reads the
prompt's keys and values once per sample: G copies of the same numbers, the largest part of
the cache while responses are short. Here the cache keeps the prompt once per distinct prompt
(the prefill's rows) and only the generated tokens per sample. Each step's attention is the
softmax over both parts at once:

    scores = [q K_prompt^T (the group's G queries as one matmul) | q K_own^T] * scale
    out    = softmax(scores) [V_prompt ; V_own]

which is the same attention as over the concatenated cache (the softmax is taken jointly, not
merged from two partial softmaxes), so it differs from SDPA by float reassociation only.

It plugs into Hugging Face models through their attention-function registry
(`AttentionInterface`, name "rlvr_prefix") and a cache layer; it is used only for decoding
steps (the prefill runs the model's own attention), only for model types whose attention
calls `cache.update` then the registered function (`rlvr.cpu.layers.LLAMA_FAMILY`), and only
with plain full-attention layers; it is registered when decoding starts, not at import.
Finished rows can be retired: the layout maps each live row to its prompt and its slot in
the group.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.cache_utils import StaticLayer

import rlvr.cpu.native as native
from rlvr.cpu.layers import is_llama_family

NAME = "rlvr_prefix"


class PrefixLayer(StaticLayer):
    """A cache layer holding the prompt once per distinct prompt and the generated tokens of
    every row in a preallocated buffer of `max_new_tokens` slots.

    The first `update` (the prefill, one row per distinct prompt) stores the prompt part and
    returns it; later updates write one slot per row and return the slots written so far."""

    is_compileable = False

    def __init__(self, max_new_tokens: int, **kwargs):
        super().__init__(max_new_tokens, **kwargs)
        self.prefix: tuple[torch.Tensor, torch.Tensor] | None = None
        self.live = 0

    def update(self, key_states, value_states, *args, **kwargs):
        if self.prefix is None:  # contiguous: the native kernel reads it as (U, Hkv, P, D)
            self.prefix = (key_states.contiguous(), value_states.contiguous())
            return self.prefix
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, self.live = self.live, self.live + key_states.shape[-2]
        self.keys[:, :, start : self.live] = key_states  # in place, a plain slice copy
        self.values[:, :, start : self.live] = value_states
        return self.keys[:, :, : self.live], self.values[:, :, : self.live]

    def buffers(self, like: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The own-token buffers (n, Hkv, max_new_tokens, D), allocated on first use from
        `like()` (n, Hkv, 1, D; called only then), for a caller that writes slot `live` itself
        and then counts it (`live += 1`): the lean decoder's native step."""
        if not self.is_initialized:
            example = like()
            self.lazy_initialization(example, example)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.live + query_length, 0  # the prefill's mask (later steps build none)

    def get_seq_length(self) -> int:
        prompt = 0 if self.prefix is None else self.prefix[0].shape[-2]
        return prompt + self.live

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep the generated part of these rows (the prompt part is indexed by the layout)."""
        if self.is_initialized:
            self.keys = self.keys.index_select(0, beam_idx)
            self.values = self.values.index_select(0, beam_idx)


@dataclass
class PrefixLayout:
    """Which prompt (prefill row) and which slot of its group each live row is.

    bias: (n, 1, 1, P) additive mask of each live row's prompt padding (0 or -inf).
    group, slot: (n,) per live row. regular: rows are exactly U blocks of `slots` in order,
    so the regrouping is a view instead of a scatter."""

    layers: list
    bias: torch.Tensor
    group: torch.Tensor
    slot: torch.Tensor
    slots: int
    regular: bool
    native: bool = False  # decode with rlvr.cpu.native's kernel where the tensors fit

    @classmethod
    def build(cls, layers: list, prompt_mask: torch.Tensor, expand: torch.Tensor) -> PrefixLayout:
        """`expand[r]`: the prefill row of response row r (rows of one prompt contiguous or not)."""
        U = prompt_mask.shape[0]
        bias = torch.zeros(prompt_mask.shape, dtype=torch.float32, device=prompt_mask.device)
        bias = bias.masked_fill(prompt_mask == 0, float("-inf"))[expand, None, None, :]
        counts = [0] * U
        slot = []
        for g in expand.tolist():
            slot.append(counts[g])
            counts[g] += 1
        slots = max(counts)
        group = expand.clone()
        slot_t = torch.tensor(slot, dtype=torch.long, device=expand.device)
        regular = min(counts) == slots and torch.equal(
            group, torch.arange(U, device=expand.device).repeat_interleave(slots)
        )
        return cls(layers, bias, group, slot_t, slots, bool(regular), native.available())

    def select(self, keep: torch.Tensor) -> None:
        """Rows `keep` stay live (the engine retired the others)."""
        self.group, self.slot, self.bias = self.group[keep], self.slot[keep], self.bias[keep]
        self.regular = False


_LAYOUT: contextvars.ContextVar[PrefixLayout | None] = contextvars.ContextVar(NAME, default=None)


def current_layout() -> PrefixLayout | None:
    """The layout `prefix_decoding` set, if any."""
    return _LAYOUT.get()


def _to_groups(x: torch.Tensor, lay: PrefixLayout, U: int) -> torch.Tensor:
    """(n, Hkv, r, X) per row -> (U, Hkv, slots * r, X) per prompt (zeros in empty slots)."""
    _, Hkv, r, X = x.shape
    if lay.regular:
        g = x.view(U, lay.slots, Hkv, r, X)
    else:
        g = x.new_zeros(U, lay.slots, Hkv, r, X)
        g[lay.group, lay.slot] = x
    return g.transpose(1, 2).reshape(U, Hkv, lay.slots * r, X)


def _to_rows(x: torch.Tensor, lay: PrefixLayout, n: int, r: int) -> torch.Tensor:
    """(U, Hkv, slots * r, X) per prompt -> (n, Hkv, r, X) per live row."""
    U, Hkv, _, X = x.shape
    g = x.view(U, Hkv, lay.slots, r, X).transpose(1, 2)  # (U, slots, Hkv, r, X)
    if lay.regular:
        return g.reshape(n, Hkv, r, X)
    return g[lay.group, lay.slot]


def prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """One decoding step. query (n, Hq, 1, D); key/value (n, Hkv, t, D): the rows' own
    generated tokens. Returns (n, 1, Hq, D) like the library's attention functions."""
    lay = _LAYOUT.get()
    if lay is None or query.shape[2] != 1:
        raise RuntimeError(f"{NAME} attention is for the fast engine's decoding steps only")
    k_p, v_p = lay.layers[module.layer_idx].prefix  # (U, Hkv, P, D)
    n, Hq, _, D = query.shape
    U, Hkv, P, _ = k_p.shape
    r = Hq // Hkv  # query heads per KV head: q head h reads KV head h // r
    scale = scaling if scaling is not None else D**-0.5
    if lay.native:
        q, bias = query.reshape(n, Hq, D), lay.bias.reshape(n, P)
        if native.fits(q, k_p, v_p, bias, lay.group, key, value):
            out = native.prefix_decode_attention(q, k_p, v_p, bias, lay.group, key, value, scale)
            return out.view(n, 1, Hq, D), None
    q = query.view(n, Hkv, r, D)
    s_prompt = _to_rows(torch.matmul(_to_groups(q, lay, U), k_p.transpose(-1, -2)), lay, n, r)
    s_prompt = s_prompt * scale + lay.bias.to(s_prompt.dtype)
    s_own = torch.matmul(q, key.transpose(-1, -2)) * scale  # (n, Hkv, r, t)
    # softmax in fp32 whatever the model's dtype, as SDPA's kernels do
    probs = torch.cat([s_prompt, s_own], dim=-1).float().softmax(dim=-1).to(query.dtype)
    p_prompt, p_own = probs.split([P, key.shape[2]], dim=-1)
    out = _to_rows(torch.matmul(_to_groups(p_prompt, lay, U), v_p), lay, n, r)
    out = out + torch.matmul(p_own, value)  # (n, Hkv, r, D)
    return out.reshape(n, 1, Hq, D), None


def supports_prefix_attention(model) -> bool:
    """Whether decoding this model may use `prefix_attention` (see the module doc; the
    caller also checks that every cache layer is plain full attention; sliding-window
    layers are not)."""
    implementation = getattr(model.config, "_attn_implementation", None)
    return is_llama_family(model) and implementation in ("sdpa", "eager")


@contextlib.contextmanager
def prefix_decoding(model, layout: PrefixLayout) -> Iterator[None]:
    """Within the block the model's attention is `prefix_attention` over `layout`."""
    config = model.config
    before = config._attn_implementation
    AttentionInterface.register(NAME, prefix_attention)  # idempotent
    token = _LAYOUT.set(layout)
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
        _LAYOUT.reset(token)
