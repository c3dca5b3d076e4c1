"""Training phase alone: `policy_update` on bench/vs_trl.py's model and batch shape, with
`optim.share_prompt` off and on, alternating, medians.

    python bench/train_step.py --threads 1 --rounds 7

4 prompts x G=8, 47-token prompts, 64-token completions, grpo preset, beta 0, mu 1, one
micro-batch of 32 sequences, AdamW; every timed call is one whole `policy_update`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import QWEN2_SHAPE

from rlvr.config.algorithm import Algorithm
from rlvr.config.load import load_config
from rlvr.training.batch import Batch, Sample
from rlvr.training.settings import step_context
from rlvr.training.update import advantages, policy_update


def build(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr.models import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tok), pad_token_id=tok.pad_token_id, **QWEN2_SHAPE)
    return Qwen2ForCausalLM(config).train(), tok.pad_token_id, len(tok)


def samples(vocab: int, prompts: int, G: int, P: int, T: int, seed: int = 0) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(prompts):
        prompt = torch.randint(5, vocab, (P,), generator=g).tolist()
        for _ in range(G):
            out.append(
                Sample(
                    prompt_ids=prompt,
                    completion_ids=torch.randint(5, vocab, (T,), generator=g).tolist(),
                    truncated=True,
                    reward=float(torch.rand(1, generator=g)),
                    correct=False,
                    group=k,
                )
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=47)
    ap.add_argument("--length", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, pad_id, vocab = build()
    batch = samples(vocab, args.prompts, args.group, args.prompt_len, args.length)
    B = args.prompts * args.group
    cfgs = {
        share: load_config(
            None,
            {
                "rollout": {"group_size": args.group, "prompts_per_step": args.prompts},
                "algo": {"kl_coef": 0.0, "mu": 1, "mini_batches": 1},
                "optim": {"micro_batch_sequences": B, "share_prompt": share, "lr": 1e-5},
            },
            preset="grpo",
        )
        for share in (False, True)
    }
    state = {k: v.clone() for k, v in model.state_dict().items()}
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds + 1):  # round 0 warms up
        for share in (False, True) if r % 2 else (True, False):
            model.load_state_dict(state)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
            work = Batch.from_groups([batch[i : i + args.group] for i in range(0, B, args.group)])
            algorithm = Algorithm.from_config(cfgs[share])
            u = step_context(cfgs[share], algorithm, model, pad_id, "cpu")
            work = replace(work, advantages=advantages(work, algorithm, args.group))
            t0 = time.perf_counter()
            policy_update(work, u, opt, sched)
            if r:
                times[share].append(time.perf_counter() - t0)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"share_prompt off: {off:.3f} s  {[round(t, 3) for t in times[False]]}")
    print(f"share_prompt on:  {on:.3f} s  {[round(t, 3) for t in times[True]]}")
    print(json.dumps({"off_s": off, "on_s": on, "speedup": off / on, "threads": args.threads}))


if __name__ == "__main__":
    main()
