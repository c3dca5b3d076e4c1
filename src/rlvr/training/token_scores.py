"""Per-token log-probs and entropy from a causal LM's final hidden states, a chunk of tokens
at a time, so no (tokens x vocabulary) tensor exists for more than one chunk.

The full-logits way (the LM's forward returning (B, T, V) logits, an fp32 copy divided by the
temperature, its log-softmax, the target's entry) keeps what autograd needs of all of it: for
a 151,936-token vocabulary that is 3 x 0.6 MB a token, 5 GB for 8 x 1,024 response tokens in
fp32. Here the LM's forward stops at the head's input (`head_inputs`: a forward pre-hook on
the output embeddings that records the final hidden states and hands the head zero
positions), and `score_hidden` applies the head to `chunk` tokens at a time, with the LM's own
final-logit soft cap (Gemma-2), then the temperature and the log-softmax, and the entropy
from each chunk's probabilities without keeping them. With a gradient each chunk runs under
`torch.utils.checkpoint` (non-reentrant): its forward keeps only its hidden-state rows, and
the backward recomputes that chunk's logits and frees them before the next chunk's, so the
scoring's memory is O(chunk x V) plus the (tokens x d) hidden states. Non-reentrant
checkpointing flows each chunk's gradient through the one autograd graph, so the head's
weight (tied or not, LoRA on it or not) gets one accumulated gradient, as DDP and FSDP2
expect, and the recompute runs under the forward's autocast state.

When all the tokens fit one chunk the values come from one head call without recomputation:
the same ops, so a small vocabulary costs what it did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rlvr.models import unwrap_model

# What one chunk's vocabulary-wide tensors may take at their peak (the backward's): the fp32
# logits, the tempered copy, the log-softmax's gradient and its temporaries, BYTES_PER_LOGIT
# bytes per (token, vocabulary entry) in all.
CHUNK_BUDGET_BYTES = 256 * 2**20
BYTES_PER_LOGIT = 24


def chunk_tokens(tokens: int, vocab: int, chunk: int = 0) -> int:
    """Tokens per chunk: `chunk` where set (> 0), else as many as CHUNK_BUDGET_BYTES holds;
    at most `tokens`, at least 1."""
    if chunk <= 0:
        chunk = CHUNK_BUDGET_BYTES // (BYTES_PER_LOGIT * max(vocab, 1))
    return max(1, min(tokens, chunk))


def scoring_bytes(tokens: int, vocab: int, chunk: int = 0) -> float:
    """The scoring's vocabulary-wide peak for `tokens` tokens (what `rlvr.run.memory` counts):
    one chunk's tensors."""
    return float(BYTES_PER_LOGIT * vocab * chunk_tokens(tokens, vocab, chunk))


@contextlib.contextmanager
def head_inputs(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Within the block the LM's head (its output embeddings) projects nothing: each call
    appends its input, the final hidden states at the positions `logits_to_keep` kept, to
    the yielded list, and gets zero positions instead (its logits come out (B, 0, V))."""
    head = unwrap_model(model).get_output_embeddings()
    seen: list[torch.Tensor] = []

    def keep(module, args):
        seen.append(args[0])
        return (args[0][..., :0, :], *args[1:])

    handle = head.register_forward_pre_hook(keep)
    try:
        yield seen
    finally:
        handle.remove()


def final_logit_softcap(model: torch.nn.Module) -> float | None:
    """The LM's final-logit soft cap (Gemma-2's `final_logit_softcapping`), or None."""
    config = unwrap_model(model).config
    return getattr(config, "final_logit_softcapping", None) or None


def _logits(head: torch.nn.Module, hidden: torch.Tensor, cap: float | None) -> torch.Tensor:
    """The head's logits, soft-capped as the LM's forward does it (in the head's dtype)."""
    logits = head(hidden)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _score(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 log-probs of `targets` under softmax(logits / temperature), and the entropy (no
    grad)."""
    logits = logits.float() / temperature
    log_z = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = log_z - (F.softmax(logits, dim=-1) * logits).sum(-1)
    return log_probs, entropy


def _chunk(head, hidden, targets, temperature: float, cap: float | None, with_entropy: bool):
    lp, entropy = _score(_logits(head, hidden, cap), targets, temperature, with_entropy)
    return (lp, entropy) if with_entropy else (lp,)


@dataclass(frozen=True)
class LMHead:
    """A causal LM's head (its output embeddings) and its final-logit soft cap
    (`final_logit_softcap`; None: none), as `score_hidden` applies them."""

    head: torch.nn.Module
    softcap: float | None = None


def score_hidden(
    lm_head: LMHead,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float,
    with_entropy: bool = False,
    chunk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, T) fp32 log pi(targets) and, with `with_entropy`, the entropy (no grad), from the
    final hidden states `hidden` (B, T, d) whose logits score `targets` (B, T); `chunk`
    tokens' logits at a time (`chunk_tokens`)."""
    head, softcap = lm_head.head, lm_head.softcap
    B, T = targets.shape
    vocab = head.weight.shape[0] if hasattr(head, "weight") else head(hidden[:1, :1]).shape[-1]
    size = chunk_tokens(B * T, vocab, chunk)
    if size >= B * T:  # one chunk: the values as one head call gives them, nothing recomputed
        return _score(_logits(head, hidden, softcap), targets, temperature, with_entropy)
    h, t = hidden.reshape(B * T, -1), targets.reshape(B * T)
    recompute = torch.is_grad_enabled() and h.requires_grad
    lps, entropies = [], []
    for a in range(0, B * T, size):
        args = (head, h[a : a + size], t[a : a + size], temperature, softcap, with_entropy)
        out = checkpoint(_chunk, *args, use_reentrant=False) if recompute else _chunk(*args)
        lps.append(out[0])
        if with_entropy:
            entropies.append(out[1])
    lp = torch.cat(lps).view(B, T)
    return lp, (torch.cat(entropies).view(B, T) if with_entropy else None)
