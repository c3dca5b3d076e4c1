"""The vLLM servers' answers as rlvr's objects: a one-choice `/v1/completions` answer's sampled
ids and log-probs (`choice`), and the `Rollout` of such rows, with each token's weight version
when the rows carry one (`rollout_from_rows`; `/inference/v1/generate`'s answers in flight,
rlvr.rollout.vllm_inflight.generated)."""

from __future__ import annotations

import torch

from rlvr.rollout.base import Rollout, lengths_from_eos


def choice(answer: dict) -> tuple[list[int], list[float]]:
    """The sampled token ids and their log-probs of a one-choice completion."""
    choice = answer["choices"][0]
    ids = list(choice["token_ids"] or [])
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or [0.0] * len(ids)
    return ids, [float(x) for x in logprobs]


def rollout_from_rows(prompt_ids, rows, n: int, pad_id: int, eos_ids: list[int]) -> Rollout:
    """A `Rollout` from (token ids, log-probs) or (token ids, log-probs, weight versions)
    per row, prompt-major."""
    width = max((len(row[0]) for row in rows), default=0)
    ids_t = torch.full((len(rows), width), pad_id, dtype=torch.long)
    lp = torch.zeros((len(rows), width))
    versioned = bool(rows) and len(rows[0]) == 3
    versions = torch.zeros((len(rows), width), dtype=torch.long) if versioned else None
    for i, (ids, logprobs, *rest) in enumerate(rows):
        ids_t[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        lp[i, : len(ids)] = torch.tensor(logprobs[: len(ids)])
        if versions is not None:
            versions[i, : len(ids)] = torch.tensor(rest[0], dtype=torch.long)
    lengths, truncated = lengths_from_eos(ids_t, eos_ids)
    lengths = torch.minimum(lengths, torch.tensor([len(row[0]) for row in rows], dtype=torch.long))
    return Rollout(
        prompt_ids=[p for p in prompt_ids for _ in range(n)],
        completion_ids=ids_t,
        lengths=lengths,
        truncated=truncated,
        group_size=n,
        sampling_log_probs=lp,
        token_versions=versions,
    )
