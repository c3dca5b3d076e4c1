"""Samples kept for an update, their collation into padded tensors, and their log-probs.

A sample keeps its own prompt and completion ids (no padding), so any subset can be collated
into a micro-batch only as wide as its longest member: no compute on another batch's padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Sample:
    """One response, with everything the update needs. `group` is the prompt's index."""

    prompt_ids: list[int]
    completion_ids: list[int]  # exactly `length` ids (EOS included when not truncated)
    truncated: bool
    reward: float
    correct: bool
    group: int
    advantage: float = 0.0
    old_log_probs: torch.Tensor | None = None  # (length,)
    ref_log_probs: torch.Tensor | None = None  # (length,)


@dataclass(frozen=True)
class MicroBatch:
    """Collated tensors. Sequence = left-padded prompt (width P) + right-padded completion (T)."""

    input_ids: torch.Tensor  # (B, P + T)
    attention_mask: torch.Tensor  # (B, P + T)
    position_ids: torch.Tensor  # (B, P + T), counting from each row's first real token
    prompt_width: int  # P
    response_mask: torch.Tensor  # (B, T) 1 on generated tokens incl. EOS
    advantages: torch.Tensor  # (B,)
    old_log_probs: torch.Tensor | None  # (B, T)
    ref_log_probs: torch.Tensor | None  # (B, T)


def _pad_rows(rows: list[torch.Tensor | None], width: int) -> torch.Tensor | None:
    if any(r is None for r in rows):
        return None
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
    lengths = torch.tensor([len(s.completion_ids) for s in samples])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    return MicroBatch(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        position_ids=position_ids.to(device),
        prompt_width=P,
        response_mask=mask.to(device),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
        old_log_probs=_to(_pad_rows([s.old_log_probs for s in samples], T), device),
        ref_log_probs=_to(_pad_rows([s.ref_log_probs for s in samples], T), device),
    )


def _to(t: torch.Tensor | None, device) -> torch.Tensor | None:
    return None if t is None else t.to(device)


def token_log_probs(
    model: torch.nn.Module, mb: MicroBatch, *, temperature: float, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(o_t | q, o_<t) of each completion token, (B, T) in fp32, and optionally the
    policy's token entropy (no grad). Logits at position t predict token t+1, so the T
    completion tokens are scored by the logits at positions P-1 .. P+T-2. The sampling
    temperature is applied before the log-softmax (ALGORITHMS.md §8)."""
    T = mb.response_mask.shape[1]
    out = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        position_ids=mb.position_ids,
        logits_to_keep=T + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :].float() / temperature  # (B, T, V)
    targets = mb.input_ids[:, mb.prompt_width :]  # (B, T)
    log_z = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = log_z - (F.softmax(logits, dim=-1) * logits).sum(-1)
    return log_probs, entropy
