"""The step's training batch, its collation into padded micro-batches, and their log-probs.

A sample keeps its own prompt and completion ids (no padding), so any subset can be collated
into a micro-batch only as wide as its longest member: no compute on another batch's padding.
What later stages compute for the samples (advantages, old and reference log-probs) are
tensors with one row per sample, held by the `Batch` beside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from transformers import DynamicCache

from rlvr.models import cache_kwarg, unwrap_model
from rlvr.rollout.base import Rollout, dedupe, left_pad
from rlvr.run.distributed import is_sharded
from rlvr.training.token_scores import LMHead, final_logit_softcap, head_inputs, score_hidden


@dataclass(frozen=True)
class Sample:
    """One scored response. `group`: its prompt's group, numbered in the step's global order
    (`Batch.from_groups`); -1 marks a placeholder row that carries no loss."""

    prompt_ids: list[int]
    completion_ids: list[int]  # exactly `length` ids (EOS included when not truncated)
    truncated: bool
    reward: float
    correct: bool
    group: int
    sampling_log_probs: torch.Tensor | None = None  # (length,) the engine's own, if it has them
    # (length,) bool, True on tool tokens (docs/tools.md): context the policy reads, never
    # trains on; None when the response has no tool turn
    tool_mask: torch.Tensor | None = None
    version: int = 0  # the policy version that sampled it: steps trained before its rollout
    reward_terms: dict[str, float] | None = None  # each reward term's score by name (GDPO)
    # (length,) long: each token's policy version, the weights that computed its logits, where
    # the engine reports them (train.inflight_updates); None: every token has `version`
    token_versions: torch.Tensor | None = None

    @property
    def oldest(self) -> int:
        """The policy version of its oldest token (`version` where tokens carry none)."""
        tv = self.token_versions
        return int(tv.min()) if tv is not None and tv.numel() else self.version

    def model_mask(self, width: int) -> torch.Tensor:
        """(width,) bool: the response's own tokens (EOS included), not tool tokens or padding."""
        mask = torch.arange(width) < len(self.completion_ids)
        if self.tool_mask is not None:
            mask[: len(self.tool_mask)] &= ~self.tool_mask
        return mask

    @classmethod
    def placeholder(cls, pad_id: int) -> Sample:
        """A one-token row without loss (group -1): a rank with no rows in a mini-batch runs
        it so that it still joins the collectives (DDP's all-reduce, FSDP2's gathers) with a
        zero gradient."""
        return cls([pad_id], [pad_id], True, 0.0, False, -1)


GROUP_SIZE_MAX = 4096  # rows of one group, for row ids


@dataclass(frozen=True)
class Batch:
    """One step's training batch on this rank: whole groups, in the step's global group order.

    Row i is `samples[i]`, a response of group `samples[i].group` out of `num_groups` over
    all ranks (the groups of other ranks are simply not here). Each later stage returns its
    per-row result as a tensor and the trainer attaches it with `dataclasses.replace`:

    advantages: (N,) one per response; a per-token estimator (GAE) gives (N, T) instead.
    old_log_probs, ref_log_probs: (N, T) fp32, 0 past each response's length.

    row_ids: (N,) int64, each row's id in the step, group * GROUP_SIZE_MAX + its place among
    the group's rows (`numbered`), the same in every slice `rows` takes (a group lives on one
    rank, whole); computed on the first `rows` call when absent.

    T is `width`, the longest response. Further per-token fields (a critic's values, the
    returns) fit the same way: (N, T) tensors, sliced per micro-batch by `rows` and `to_width`.
    """

    samples: list[Sample]
    num_groups: int
    advantages: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    row_ids: torch.Tensor | None = None

    @classmethod
    def from_groups(cls, groups: Sequence[Sequence[Sample]]) -> Batch:
        """The step's groups in global order, each as the samples this rank holds of it
        (none where another rank holds it); samples are renumbered by their group's place."""
        samples = [replace(s, group=k) for k, g in enumerate(groups) for s in g]
        return cls(samples, len(groups))

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def width(self) -> int:
        return max((len(s.completion_ids) for s in self.samples), default=0) or 1

    def numbered(self) -> torch.Tensor:
        """(N,) each row's id: group * GROUP_SIZE_MAX + its place among the group's rows."""
        if self.row_ids is not None:
            return self.row_ids
        seen: dict[int, int] = {}
        ids = []
        for s in self.samples:
            k = seen.get(s.group, 0)
            seen[s.group] = k + 1
            ids.append(s.group * GROUP_SIZE_MAX + k)
        return torch.tensor(ids, dtype=torch.long)

    def rows(self, index: Sequence[int]) -> Batch:
        """The rows `index` (same groups' numbering), with the per-row tensors indexed."""
        idx = torch.tensor(list(index), dtype=torch.long)
        row_ids = self.numbered()

        def take(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[idx]

        return Batch(
            samples=[self.samples[i] for i in index],
            num_groups=self.num_groups,
            advantages=take(self.advantages),
            old_log_probs=take(self.old_log_probs),
            ref_log_probs=take(self.ref_log_probs),
            row_ids=row_ids[idx] if len(idx) else row_ids[:0],
        )

    def in_groups(self, lo: int, hi: int) -> list[int]:
        """The rows of groups lo .. hi - 1 that are here."""
        return [i for i, s in enumerate(self.samples) if lo <= s.group < hi]

    def model_mask(self, width: int | None = None) -> torch.Tensor:
        """(N, width) bool: each response's own tokens, without tool tokens and padding."""
        width = self.width if width is None else width
        return (
            torch.stack([s.model_mask(width) for s in self.samples])
            if self.samples
            else (torch.zeros((0, width), dtype=torch.bool))
        )

    def token_versions(self, width: int) -> torch.Tensor | None:
        """(N, width) long: each token's policy version, 0 past each length; None unless every
        sample has them."""
        rows = [s.token_versions for s in self.samples]
        if not rows or any(r is None for r in rows):
            return None
        return _pad_rows(rows, width).long()

    def sampling_log_probs(self, width: int) -> torch.Tensor | None:
        """(N, width) the engine's log-probs, 0 past each length; None where it has none."""
        rows = [s.sampling_log_probs for s in self.samples]
        return None if any(r is None for r in rows) else _pad_rows(rows, width)


def to_width(t: torch.Tensor | None, width: int, device) -> torch.Tensor | None:
    """A per-row tensor on `device` for a micro-batch `width` tokens wide: per-token (N, T)
    tensors lose the columns past it (zeros: every row there is shorter), per-row (N,) ones
    stay."""
    if t is None:
        return None
    return (t[:, :width] if t.dim() == 2 else t).to(device)


@dataclass(frozen=True)
class MicroBatch:
    """Collated tensors. Sequence = left-padded prompt (width P) + right-padded completion (T)."""

    input_ids: torch.Tensor  # (B, P + T)
    attention_mask: torch.Tensor  # (B, P + T)
    position_ids: torch.Tensor  # (B, P + T), counting from each row's first real token
    prompt_width: int  # P
    response_mask: torch.Tensor  # (B, T) 1 on generated tokens incl. EOS, 0 on tool tokens


def _pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def collate(samples: list[Sample], pad_id: int, device: torch.device | str) -> MicroBatch:
    P = max(len(s.prompt_ids) for s in samples)
    T = max(max(len(s.completion_ids) for s in samples), 1)
    B = len(samples)
    ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + T), dtype=torch.long)
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids[i, P - p : P] = torch.tensor(s.prompt_ids, dtype=torch.long)
        ids[i, P : P + c] = torch.tensor(s.completion_ids, dtype=torch.long)
        attn[i, P - p : P + c] = 1
    # Same positions generation used for left-padded prompts, so log-probs match sampling.
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    mask = torch.stack([s.model_mask(T) for s in samples]).float()
    return MicroBatch(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        position_ids=position_ids.to(device),
        prompt_width=P,
        response_mask=mask.to(device),
    )


def token_log_probs(
    model: torch.nn.Module,
    mb: MicroBatch,
    *,
    temperature: float,
    with_entropy: bool = False,
    chunk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(o_t | q, o_<t) of each completion token, (B, T) in fp32, and optionally the
    policy's token entropy (no grad). The hidden states at position t predict token t+1, so
    the T completion tokens are scored by positions P-1 .. P+T-2. The sampling temperature is
    applied before the log-softmax (docs/algorithms.md#notation-and-conventions). The forward
    stops at the LM head's input; `rlvr.training.token_scores` applies the head `chunk` tokens
    at a time (0: as many as its memory budget holds)."""
    T = mb.response_mask.shape[1]
    with head_inputs(model) as seen:
        model(
            input_ids=mb.input_ids,
            attention_mask=mb.attention_mask,
            position_ids=mb.position_ids,
            logits_to_keep=T + 1,
            use_cache=False,
        )
    return _score_hidden(
        model,
        seen[-1][:, :-1],
        mb.input_ids[:, mb.prompt_width :],
        temperature,
        with_entropy,
        chunk,
    )


def rollout_log_probs(
    model: torch.nn.Module, rollout: Rollout, pad_id: int, temperature: float = 1.0
) -> torch.Tensor:
    """(B, T) fp32 on the CPU: the trainer's log-probs of a rollout's responses, as the update
    computes them, to compare with an engine's own (`Rollout.sampling_log_probs`)."""
    samples = [
        Sample(
            prompt_ids=rollout.prompt_ids[i],
            completion_ids=rollout.completion_ids[i, : int(n)].tolist(),
            truncated=bool(rollout.truncated[i]),
            reward=0.0,
            correct=False,
            group=0,
            tool_mask=None if rollout.tool_mask is None else rollout.tool_mask[i, : int(n)],
        )
        for i, n in enumerate(rollout.lengths)
    ]
    device = next(model.parameters()).device
    with torch.no_grad():
        lp, _ = token_log_probs(model, collate(samples, pad_id, device), temperature=temperature)
    return lp.float().cpu()


def _score_hidden(
    model, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy, chunk
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`score_hidden` with `model`'s head and soft cap. Under FSDP2 the root's parameters (the
    head's among them) are gathered first: the head runs after the root's forward, which may
    have resharded them, and in the backward's recomputation (they stay gathered until the
    root's post-backward)."""
    if is_sharded(model):
        model.unshard()
    head = LMHead(unwrap_model(model).get_output_embeddings(), final_logit_softcap(model))
    return score_hidden(
        head, hidden, targets, temperature=temperature, with_entropy=with_entropy, chunk=chunk
    )


@dataclass(frozen=True)
class SharedMicroBatch:
    """Collated tensors with each distinct prompt once (U rows, left-padded to width P) and
    the B completions right-padded to width T; `expand` maps each completion to its prompt."""

    prompt_ids: torch.Tensor  # (U, P)
    prompt_mask: torch.Tensor  # (U, P)
    prompt_lengths: torch.Tensor  # (U,)
    expand: torch.Tensor  # (B,) prompt row of each completion
    completion_ids: torch.Tensor  # (B, T)
    response_mask: torch.Tensor  # (B, T) 1 on generated tokens incl. EOS, 0 on tool tokens


def collate_shared(
    samples: list[Sample], pad_id: int, device: torch.device | str
) -> SharedMicroBatch:
    prompts, index = dedupe([s.prompt_ids for s in samples])
    T = max(max(len(s.completion_ids) for s in samples), 1)
    B = len(samples)
    p_ids, p_mask = left_pad(prompts, pad_id, "cpu")
    c_ids = torch.full((B, T), pad_id, dtype=torch.long)
    for i, s in enumerate(samples):
        c_ids[i, : len(s.completion_ids)] = torch.tensor(s.completion_ids, dtype=torch.long)
    mask = torch.stack([s.model_mask(T) for s in samples]).float()
    return SharedMicroBatch(
        prompt_ids=p_ids.to(device),
        prompt_mask=p_mask.to(device),
        prompt_lengths=torch.tensor([len(p) for p in prompts]).to(device),
        expand=torch.tensor(index).to(device),
        completion_ids=c_ids.to(device),
        response_mask=mask.to(device),
    )


def shared_token_log_probs(
    model: torch.nn.Module,
    mb: SharedMicroBatch,
    *,
    temperature: float,
    with_entropy: bool = False,
    chunk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_log_probs` with each distinct prompt forwarded once: the prompt pass fills a KV
    cache (with grad), whose rows are copied to the prompt's completions (`index_select`,
    differentiable), and the completions (all but their last token, whose hidden state scores
    nothing) are forwarded on that cache. The last prompt position's hidden state scores the
    first completion token. Same positions and masks as `collate`, so the values are the
    same."""
    T = mb.completion_ids.shape[1]
    kw = cache_kwarg(model)
    cache = DynamicCache(config=unwrap_model(model).config)
    prompt_pos = (mb.prompt_mask.cumsum(-1) - 1).clamp(min=0)
    with head_inputs(model) as seen:
        model(
            input_ids=mb.prompt_ids,
            attention_mask=mb.prompt_mask,
            position_ids=prompt_pos,
            logits_to_keep=1,
            use_cache=True,
            **{kw: cache},
        )
        hidden = seen[-1][:, -1:].index_select(0, mb.expand)  # (B, 1, d)
        if T > 1:
            cache.reorder_cache(mb.expand)
            mask = torch.cat(
                [mb.prompt_mask.index_select(0, mb.expand), torch.ones_like(mb.completion_ids)],
                -1,
            )[:, :-1]
            positions = mb.prompt_lengths.index_select(0, mb.expand)[:, None] + torch.arange(
                T - 1, device=mask.device
            )
            model(
                input_ids=mb.completion_ids[:, :-1],
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{kw: cache},
            )
            hidden = torch.cat([hidden, seen[-1]], 1)
    return _score_hidden(model, hidden, mb.completion_ids, temperature, with_entropy, chunk)
