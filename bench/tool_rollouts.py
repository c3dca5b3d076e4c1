"""Rollouts with tool calls: time per batch of each engine path on the calc task.

    python bench/tool_rollouts.py [--model rlvr-tiny] [--prompts 16] [--group 8] [--repeats 3]

Each path samples the same prompts (temperature 1, per-prompt seeds) with the task's `calc`
tool and the built-in model's calc budgets (rollout.max_new_tokens / max_total_tokens): the fast engine's torch path with a tool turn as one multi-token prefill of its
row, the same with the turn fed one token a step, the CPU backend's path (where its gate is
on: fp32 weights on the CPU), and the hf engine's rounds. Prints the best of `--repeats`
wall times, the rows' mean length, tool calls and tool tokens per row.
"""

from __future__ import annotations

import argparse
import time

import torch

from rlvr import cpu
from rlvr.config.load import load_config
from rlvr.config.presets import TINY_TASK_DEFAULTS
from rlvr.data.prompts import load_prompts
from rlvr.models import eos_ids, load_model, load_tokenizer
from rlvr.rollout import FastEngine, HFEngine, SamplingParams
from rlvr.tools import Toolbox


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="rlvr-tiny")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    # the built-in model's calc budgets, whatever the model
    budgets = TINY_TASK_DEFAULTS["calc"]["rollout"]
    over = {"data": {"task": "calc"}, "model": {"name_or_path": args.model}, "rollout": budgets}
    cfg = load_config(overrides=over)
    tok = load_tokenizer(args.model)
    model = load_model(args.model).eval()
    source = load_prompts(cfg, tok, model.config.max_position_embeddings)
    box = Toolbox(["calc"], tok, max_calls=cfg.rollout.max_tool_calls,
                  max_total_tokens=cfg.rollout.max_total_tokens)  # fmt: skip
    prompts = [q.ids for q in source.train[: args.prompts]]
    params = SamplingParams(n=args.group, max_new_tokens=cfg.rollout.max_new_tokens, seed=1,
                            row_seeds=tuple(range(len(prompts))))  # fmt: skip
    kw = dict(pad_id=tok.pad_token_id, eos_ids=eos_ids(tok, model), tools=box)
    paths = {
        "fast, torch, prefill": lambda: FastEngine(model, backend=cpu.OFF, **kw),
        "fast, torch, per step": lambda: _per_step(FastEngine(model, backend=cpu.OFF, **kw)),
        "fast, CPU backend": lambda: FastEngine(model, **kw),
        "hf, rounds": lambda: HFEngine(model, **kw),
    }
    print(f"{len(prompts)} prompts x {args.group}, {args.threads} thread(s), {args.model}")
    for name, build in paths.items():
        engine, best = build(), float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            r = engine.generate(prompts, params)
            best = min(best, time.perf_counter() - t0)
        print(
            f"{name:22s} {best:7.2f} s  length {r.lengths.float().mean():6.1f}  "
            f"calls/row {r.tool_calls.float().mean():.2f}  "
            f"tool tokens/row {r.tool_mask.sum(1).float().mean():.1f}"
        )


def _per_step(engine: FastEngine) -> FastEngine:
    engine.tool_prefill = False
    return engine


if __name__ == "__main__":
    main()
