"""Micro-batches without padding (`optim.pad_free`): the samples one after another in a
single row, positions restarting at each sample, attention that never crosses a sample.

`collate_flat` lays the row out (prompt_1 completion_1 prompt_2 completion_2 ...) with
`position_ids` counting from 0 in each sample, so every token sees the positions it had when
it was sampled, and the boundaries as transformers' flash-attention keywords
(`cu_seq_lens_q/k`, `max_length_q/k`, the ones its `DataCollatorWithFlattening` produces).
`flat_token_log_probs` runs the forward without an attention mask and scores only the
completion tokens' positions (no head call on padding either), then places the log-probs
back in the update's (B, T) layout, 0 past each response.

Attention, per implementation:

    flash_attention_2/3   transformers' variable-length path reads the boundaries (the
                          keywords above, or the restarting `position_ids`). Written against
                          transformers' documented interface; UNVERIFIED here (flash-attn
                          needs a GPU): scripts/gpu_check.sh runs the equivalence test on one.
    anything else         switched for the block to `rlvr_segments:<impl>`: causal attention
                          on each sample's slice of the row with the implementation the model
                          had (SDPA, or the CPU backend's native kernel when its gate has
                          switched the model to it), so no query ever meets another sample's
                          keys and the work is sum(L_i^2), not (sum L_i)^2 as a block-diagonal
                          mask over the whole row would cost.

Prompt sharing (`optim.share_prompt`) does not combine with it: with `pad_free` each sample
forwards its own prompt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rlvr.models import unwrap_model
from rlvr.training.batch import Sample, _score_hidden
from rlvr.training.token_scores import head_inputs

PREFIX = "rlvr_segments:"
# implementations whose own kernels read the boundaries (transformers' varlen path)
VARLEN = ("flash_attention_2", "flash_attention_3")
_BOUNDARY_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


@dataclass(frozen=True)
class FlatMicroBatch:
    """A micro-batch as one row of N = sum(p_i + c_i) tokens and where its scores go."""

    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N), from 0 at each sample's first prompt token
    cu_seqlens: torch.Tensor  # (B + 1,) int32: each sample's first position, then N
    max_length: int  # the longest sample
    scored: torch.Tensor  # (M,) the positions whose hidden states score a completion token
    targets: torch.Tensor  # (1, M) those completion tokens
    place: torch.Tensor  # (B, T) bool: where each scored token lands in the (B, T) layout
    response_mask: torch.Tensor  # (B, T) 1 on generated tokens incl. EOS, 0 on tool tokens


def collate_flat(samples: list[Sample], pad_id: int, device) -> FlatMicroBatch:
    """`samples` concatenated (see the module doc); `pad_id` is not used: nothing is padded
    but the (B, T) layout the scores are placed in."""
    del pad_id
    T = max(max(len(s.completion_ids) for s in samples), 1)
    ids, pos, starts, scored, targets = [], [], [0], [], []
    for s in samples:
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids += s.prompt_ids + s.completion_ids
        pos += range(p + c)
        scored += range(starts[-1] + p - 1, starts[-1] + p - 1 + c)
        targets += s.completion_ids
        starts.append(starts[-1] + p + c)
    place = torch.stack([torch.arange(T) < len(s.completion_ids) for s in samples])
    mask = torch.stack([s.model_mask(T) for s in samples]).float()
    lengths = [b - a for a, b in pairwise(starts)]
    return FlatMicroBatch(
        input_ids=torch.tensor([ids], dtype=torch.long).to(device),
        position_ids=torch.tensor([pos], dtype=torch.long).to(device),
        cu_seqlens=torch.tensor(starts, dtype=torch.int32).to(device),
        max_length=max(lengths),
        scored=torch.tensor(scored, dtype=torch.long).to(device),
        targets=torch.tensor([targets], dtype=torch.long).to(device),
        place=place.to(device),
        response_mask=mask.to(device),
    )


def flat_token_log_probs(
    model: torch.nn.Module,
    mb: FlatMicroBatch,
    *,
    temperature: float,
    with_entropy: bool = False,
    chunk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`rlvr.training.batch.token_log_probs` for a `FlatMicroBatch`: (B, T) fp32 log-probs
    of each completion token, 0 past each response, and the entropy (no grad) if asked."""
    boundaries = dict(
        cu_seq_lens_q=mb.cu_seqlens,
        cu_seq_lens_k=mb.cu_seqlens,
        max_length_q=mb.max_length,
        max_length_k=mb.max_length,
    )
    with segment_attention(model), head_inputs(model) as seen:
        model(
            input_ids=mb.input_ids,
            position_ids=mb.position_ids,
            attention_mask=None,
            logits_to_keep=0,
            use_cache=False,
            **boundaries,
        )
    hidden = seen[-1][:, mb.scored]  # (1, M, d)
    lp, entropy = _score_hidden(model, hidden, mb.targets, temperature, with_entropy, chunk)
    out = lp.new_zeros(mb.place.shape).masked_scatter(mb.place, lp[0])
    if entropy is not None:
        entropy = entropy.new_zeros(mb.place.shape).masked_scatter(mb.place, entropy[0])
    return out, entropy


@contextlib.contextmanager
def segment_attention(model: torch.nn.Module) -> Iterator[str]:
    """Within the block `model` attends within each sample of a flat row: unchanged where its
    attention implementation is a varlen one (`VARLEN`), else switched to
    `rlvr_segments:<impl>` (see the module doc). Yields the implementation in use."""
    config = unwrap_model(model).config
    impl = getattr(config, "_attn_implementation", None) or "sdpa"
    if impl in VARLEN:
        yield impl
        return
    name = _register(impl)
    config._attn_implementation = name
    try:
        yield name
    finally:
        config._attn_implementation = impl


def _register(impl: str) -> str:
    """Registers `rlvr_segments:<impl>` (idempotent) and returns the name. The inner
    attention is `impl`'s registry function when it reads a None mask as causal (SDPA and
    the CPU backend's "rlvr_attention"), else SDPA."""
    name = PREFIX + impl
    if name in ALL_ATTENTION_FUNCTIONS:
        return name
    reads_none_as_causal = impl == "rlvr_attention" and impl in ALL_ATTENTION_FUNCTIONS
    inner = ALL_ATTENTION_FUNCTIONS[impl] if reads_none_as_causal else sdpa_attention_forward
    AttentionInterface.register(name, _segments(inner))
    AttentionMaskInterface.register(name, _no_mask)
    return name


def _no_mask(*args, **kwargs) -> None:
    """The mask builder of `rlvr_segments:*`: none (each segment is causal on its own)."""
    return None


def _segments(inner):
    """An attention-registry function running `inner` causally on each sample's slice of a
    one-row batch (the `cu_seq_lens_q` boundaries)."""

    def attend(module, query, key, value, attention_mask, **kw):
        """The registry's call; `kw`: dropout, scaling and the model's keywords."""
        cu = kw.get("cu_seq_lens_q")
        if cu is None or query.shape[0] != 1 or attention_mask is not None:
            raise ValueError(
                "rlvr_segments attention: expected one flat row with cu_seq_lens_q and no "
                "attention mask (rlvr.training.pad_free.flat_token_log_probs)"
            )
        drop = (*_BOUNDARY_KEYS, "position_ids", "is_causal")
        rest = {k: v for k, v in kw.items() if k not in drop}
        outs = []
        for a, b in pairwise(cu.tolist()):
            q, k, v = query[:, :, a:b], key[:, :, a:b], value[:, :, a:b]
            out, _ = inner(module, q, k, v, None, is_causal=True, **rest)
            outs.append(out)
        return torch.cat(outs, 1), None

    return attend
