"""Held-out evaluation: avg@k (mean accuracy over k sampled answers), pass@k, greedy accuracy."""

from __future__ import annotations

from dataclasses import replace

import torch

from rlvr.data.prompts import Prompt
from rlvr.rollout import SamplingParams, decode_completions, derive_seed
from rlvr.run.distributed import Dist
from rlvr.training.overlap import Generation


@torch.no_grad()
def evaluate(
    gen: Generation,
    prompts: list[Prompt],
    *,
    params: SamplingParams,
    chunk_prompts: int = 64,
    d: Dist | None = None,
    records: list[dict] | None = None,
) -> dict[str, float]:
    """Sample `params.n` answers per held-out prompt (`gen`: the engine, tokenizer and
    scorer); accuracy is their mean (avg@n), pass_at_k the share of prompts with at least one
    correct answer. Greedy when `params.greedy`.

    Every prompt draws from its own seed (its index in `prompts`), so the result does not
    depend on chunking or on how many ranks share the prompts (rank r takes every r-th).
    `records`, when given, receives one dict per answer (prompt, completion, reward, ...)."""
    d = d or Dist()
    engine, tokenizer, scorer = gen.engine, gen.tokenizer, gen.scorer
    if not prompts:
        return {}
    mine = list(range(d.rank, len(prompts), d.world_size))
    # correct answers, prompts with one correct, tokens, truncated; with tools: calls, answers
    # with a call, correct answers with a call
    sums = [0.0] * 7
    for start in range(0, len(mine), chunk_prompts):
        idx = mine[start : start + chunk_prompts]
        chunk = [prompts[i] for i in idx]
        sub = replace(params, row_seeds=tuple(derive_seed(params.seed, "eval", i) for i in idx))
        rollout = engine.generate([p.ids for p in chunk], sub)
        rows = [p for p in chunk for _ in range(params.n)]
        completions = decode_completions(tokenizer, rollout)  # recorded, tool turns included
        scored = decode_completions(tokenizer, rollout, model_only=True)  # the model's text
        values, correct = scorer.accuracy(rows, scored, rollout)
        if records is not None:
            records += [
                {
                    "prompt_index": idx[i // params.n],
                    "sample": i % params.n,
                    "prompt": p.text,
                    "completion": completions[i],
                    "answer": p.answer,
                    "reward": float(values[i]),
                    "correct": bool(correct[i]),
                    "length": int(rollout.lengths[i]),
                    "truncated": bool(rollout.truncated[i]),
                    **(
                        {"tool_calls": int(rollout.tool_calls[i])}
                        if rollout.tool_calls is not None
                        else {}
                    ),
                }
                for i, p in enumerate(rows)
            ]
        correct = correct.view(len(chunk), params.n).float()
        sums[0] += float(correct.sum())
        sums[1] += float(correct.max(dim=1).values.sum())
        sums[2] += float(rollout.lengths.sum())
        sums[3] += float(rollout.truncated.sum())
        if rollout.tool_calls is not None:
            called = rollout.tool_calls > 0
            sums[4] += float(rollout.tool_calls.sum())
            sums[5] += float(called.sum())
            sums[6] += float((called & (correct.flatten() > 0)).sum())
    correct, solved, tokens, truncated, calls, with_call, right_with_call = d.sum(sums)
    answers = len(prompts) * params.n
    tools = {}
    if getattr(engine, "tools", None) is not None:  # docs/tools.md#metrics
        tools = {
            "tool_calls_per_sample": calls / answers,
            "tool_call_frac": with_call / answers,
            "accuracy_with_call": right_with_call / max(with_call, 1.0),
            "accuracy_without_call": (correct - right_with_call) / max(answers - with_call, 1.0),
        }
    return {
        **tools,
        "accuracy": correct / answers,
        "pass_at_k": solved / len(prompts),
        "k": params.n,
        "num_prompts": len(prompts),
        "mean_length": tokens / answers,
        "truncation_rate": truncated / answers,
    }
