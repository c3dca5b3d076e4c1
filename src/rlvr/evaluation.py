"""Held-out evaluation: avg@k (mean accuracy over k sampled answers), pass@k, greedy accuracy."""

from __future__ import annotations

import torch

from rlvr.prompts import Prompt
from rlvr.rollout import Rollout, RolloutEngine, SamplingParams
from rlvr.scoring import Scorer


def decode_completions(tokenizer, rollout: Rollout) -> list[str]:
    """Response text without its EOS. Special tokens the task uses (<think>, <answer>) stay:
    skip_special_tokens would drop them too, so only the trailing EOS is cut by length."""
    out = []
    for ids, n, trunc in zip(
        rollout.completion_ids, rollout.lengths.tolist(), rollout.truncated.tolist()
    ):
        keep = n if trunc else n - 1
        out.append(tokenizer.decode(ids[:keep].tolist(), skip_special_tokens=False))
    return out


@torch.no_grad()
def evaluate(
    engine: RolloutEngine,
    tokenizer,
    scorer: Scorer,
    prompts: list[Prompt],
    *,
    params: SamplingParams,
    chunk_prompts: int = 64,
) -> dict[str, float]:
    """Sample `params.n` answers per held-out prompt; accuracy is their mean (avg@n), pass_at_k
    the share of prompts with at least one correct answer. Greedy when `params.greedy`."""
    if not prompts:
        return {}
    correct_all, lengths, truncated = [], [], []
    for start in range(0, len(prompts), chunk_prompts):
        chunk = prompts[start : start + chunk_prompts]
        sub = SamplingParams(**{**params.__dict__, "seed": params.seed + start})
        rollout = engine.generate([p.ids for p in chunk], sub)
        rows = [p for p in chunk for _ in range(params.n)]
        _, correct = scorer.accuracy(rows, decode_completions(tokenizer, rollout), rollout)
        correct_all.append(correct.view(len(chunk), params.n))
        lengths.append(rollout.lengths.float())
        truncated.append(rollout.truncated.float())
    correct = torch.cat(correct_all).float()
    return {
        "accuracy": correct.mean().item(),
        "pass_at_k": correct.max(dim=1).values.mean().item(),
        "k": params.n,
        "num_prompts": len(prompts),
        "mean_length": torch.cat(lengths).mean().item(),
        "truncation_rate": torch.cat(truncated).mean().item(),
    }
