"""The update alone on long-tailed response lengths: padded micro-batches by sequences
(today's) against token-budget micro-batches (`optim.micro_batch_tokens`) and micro-batches
without padding (`optim.pad_free`).

    python bench/packing.py                    # 4 configurations, 1 round, one thread
    python bench/packing.py --rounds 2 --budget 4096
    python bench/packing.py --scale 0.25 --budget 1024 --parallel   # quick, on a busy machine

The model: bench/shapes.py's centre, the 27.6M Qwen2 grid model (hidden 512, 7 layers, 8
heads, intermediate 2048, 2,048 positions; random init, seed 0), fp32 on the CPU, one thread
(`--threads`).

The rollouts (synthetic, `draw`): 4 prompts x G = 8 = 32 samples, each prompt 47 tokens (the
grid's prompt length); response lengths log-normal with sigma 0.9 (exp(0.9 z), z ~ N(0, 1),
seed 0), scaled so that the draw's median is 300, rounded, clipped to [16, 2,001], and the
longest one set to 2,001 (a response that hit the cap: prompt + response = 2,048 positions). Rewards are
random, so every group has advantages. Token ids are random (the lengths are what matters).

Each configuration runs in its own child process (fresh peak RSS): one untimed warm-up update
on the first group, its responses cut to 64 tokens (the code paths, the native kernels), then `--steps` timed updates of
all 32 (dapo's loss, mu 1, one mini-batch, AdamW), each from the same weights and batch. The
configurations run interleaved, A B C D per round (`--parallel`: a round's at once, for a
machine shared with other work, where only the CPU times compare). Reported per configuration: the median
update time, wall and CPU (the process's; on a shared machine the CPU time is what a quiet core
would take), the child's peak RSS, the padding share (`train/padding_frac`), the micro-batch
count and the largest micro-batch's computed positions, and the ratios to the baseline.
Results go to bench/results/packing.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _shared import build_qwen2, peak_rss_mib, set_threads  # noqa: E402
from shapes import MODELS  # noqa: E402

PROMPTS, GROUP, PROMPT_LEN, MAX_POSITIONS = 4, 8, 47, 2048
MEDIAN, SIGMA, SHORTEST = 300, 0.9, 16

# name -> optim overrides; the first is the baseline (today's defaults at 8 sequences)
CONFIGS = {
    "sequences=8 (today)": dict(micro_batch_sequences=8),
    "tokens": dict(micro_batch_tokens=None),
    "tokens, share_prompt off": dict(micro_batch_tokens=None, share_prompt=False),
    "tokens, pad_free": dict(micro_batch_tokens=None, pad_free=True),
}


def draw(seed: int = 0, scale: float = 1.0) -> list[int]:
    """The 32 response lengths (see the module doc); `scale` multiplies the median and the
    positions (the same draw, shorter)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    raw = torch.exp(SIGMA * torch.randn(PROMPTS * GROUP, generator=g, dtype=torch.float64))
    raw = raw / torch.quantile(raw, 0.5)  # the draw's own median at MEDIAN
    cap = round(MAX_POSITIONS * scale) - PROMPT_LEN
    lengths = [min(max(round(MEDIAN * scale * float(x)), SHORTEST), cap) for x in raw]
    lengths[max(range(len(lengths)), key=lengths.__getitem__)] = cap
    return lengths


def samples(seed: int = 0, scale: float = 1.0):
    import torch

    from rlvr.training.batch import Sample

    g = torch.Generator().manual_seed(seed + 1)
    out = []
    lengths = draw(seed, scale)
    for k, n in enumerate(lengths):
        if k % GROUP == 0:
            prompt = torch.randint(10, 60, (PROMPT_LEN,), generator=g).tolist()
        out.append(
            Sample(
                prompt_ids=prompt,
                completion_ids=torch.randint(10, 60, (n,), generator=g).tolist(),
                truncated=n == max(lengths),
                reward=float(torch.rand(1, generator=g)),
                correct=False,
                group=k // GROUP,
            )
        )
    return out


def child(spec: dict) -> dict:
    """One configuration: a warm-up update, then the timed ones (run in its own process)."""
    set_threads(spec["threads"])
    import copy
    from dataclasses import replace

    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.config.algorithm import Algorithm
    from rlvr.config.load import load_config
    from rlvr.training.batch import Batch
    from rlvr.training.micro import cut
    from rlvr.training.micro_batches import positions
    from rlvr.training.settings import step_context
    from rlvr.training.update import advantages, policy_update

    cfg = load_config(None, {"preset": "dapo", "rollout": {"group_size": GROUP}})
    optim = {"max_grad_norm": 1.0, **spec["optim"]}
    cfg = replace(cfg, optim=replace(cfg.optim, **optim))
    algo = Algorithm.from_config(cfg)
    start = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    every = samples(scale=spec["scale"])

    def batch_of(chosen):
        groups = [[s for s in chosen if s.group == k] for k in range(PROMPTS)]
        b = Batch.from_groups([g for g in groups if g])
        return replace(b, advantages=advantages(b, algo, GROUP))

    def update(batch):
        model = copy.deepcopy(start).train()
        u = step_context(cfg, algo, model, 0, "cpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        t0, c0 = time.perf_counter(), time.process_time()
        metrics = policy_update(batch, u, opt, sched)
        return (time.perf_counter() - t0, time.process_time() - c0), metrics, u

    update(batch_of([replace(s, completion_ids=s.completion_ids[:64]) for s in every[:GROUP]]))
    full = batch_of(every)
    timed = [update(full) for _ in range(spec["steps"])]
    u = timed[0][2]
    micros = cut(full.samples, u.settings, u.model)
    from rlvr.training.micro import layout

    shape = layout(u.settings, u.model)
    largest = max(positions([full.samples[i] for i in m], shape)[0] for m in micros)
    return {
        "update_s": [t for (t, _), _, _ in timed],
        "update_cpu_s": [c for (_, c), _, _ in timed],
        "padding_frac": timed[0][1]["train/padding_frac"],
        "micro_batches": len(micros),
        "largest_micro_positions": largest,
        "peak_rss_mib": peak_rss_mib(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=int, default=4096, help="optim.micro_batch_tokens")
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="lengths and positions x this (0.25: median 75, 512 positions; a quick run)",
    )
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--steps", type=int, default=2, help="timed updates per configuration")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", default="", help="comma-separated configuration names")
    p.add_argument(
        "--parallel",
        action="store_true",
        help="a round's configurations at once (on a machine shared with other work: compare "
        "their CPU times, not wall times)",
    )
    p.add_argument("--results", default=str(HERE / "results" / "packing.json"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        spec = json.loads(Path(args.child).read_text())
        Path(spec["out"]).write_text(json.dumps(child(spec)))
        return
    names = [n for n in CONFIGS if not args.only or n in args.only.split(",")]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    lengths = draw(scale=args.scale)
    print(f"lengths: median {statistics.median(lengths)}, max {max(lengths)}, sum {sum(lengths)}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "centre30M"
        build_qwen2(model, seed=0, max_position_embeddings=MAX_POSITIONS, **MODELS["30M"])
        for r in range(args.rounds):
            procs = []
            for k, name in enumerate(names):
                optim = {k: (args.budget if v is None else v) for k, v in CONFIGS[name].items()}
                spec = dict(model=str(model), optim=optim, steps=args.steps, scale=args.scale,
                            threads=args.threads, out=str(work / f"out{k}.json"))  # fmt: skip
                (work / f"spec{k}.json").write_text(json.dumps(spec))
                env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
                cmd = [sys.executable, __file__, "--child", str(work / f"spec{k}.json")]
                procs.append(subprocess.Popen(cmd, env=env))
                if not args.parallel:
                    procs[-1].wait()
            for k, (name, proc) in enumerate(zip(names, procs)):
                if proc.wait() != 0:
                    raise SystemExit(f"{name}: the child failed (exit {proc.returncode})")
                res = json.loads((work / f"out{k}.json").read_text())
                runs[name].append(res)
                print(f"round {r} {name}: {json.dumps(res)}", flush=True)
    summary = summarise(runs, args, lengths)
    Path(args.results).write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary))


def summarise(runs: dict[str, list[dict]], args, lengths: list[int]) -> dict:
    rows = {}
    for name, rs in runs.items():
        rows[name] = {
            "update_s": statistics.median(t for r in rs for t in r["update_s"]),
            "update_cpu_s": statistics.median(t for r in rs for t in r["update_cpu_s"]),
            "update_s_all": [t for r in rs for t in r["update_s"]],
            "peak_rss_mib": max(r["peak_rss_mib"] for r in rs),
            "padding_frac": rs[0]["padding_frac"],
            "micro_batches": rs[0]["micro_batches"],
            "largest_micro_positions": rs[0]["largest_micro_positions"],
        }
    base = rows[next(iter(rows))]
    for row in rows.values():
        row["speedup"] = base["update_s"] / row["update_s"]
        row["speedup_cpu"] = base["update_cpu_s"] / row["update_cpu_s"]
        row["rss_ratio"] = row["peak_rss_mib"] / base["peak_rss_mib"]
    return {
        "budget": args.budget,
        "scale": args.scale,
        "threads": args.threads,
        "steps": args.steps,
        "rounds": args.rounds,
        "lengths": lengths,
        "configs": rows,
    }


def table(summary: dict) -> str:
    lines = [
        f"scale {summary['scale']}, budget {summary['budget']} positions, "
        f"{summary['threads']} thread(s), "
        f"{summary['rounds']} round(s) x {summary['steps']} timed updates",
        "| configuration | update s (CPU s) | speed-up (CPU) | peak RSS MiB | RSS ratio | "
        "padding | micro-batches | largest (positions) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in summary["configs"].items():
        lines.append(
            f"| {name} | {r['update_s']:.1f} ({r['update_cpu_s']:.1f}) | {r['speedup']:.2f}x "
            f"({r['speedup_cpu']:.2f}x) | {r['peak_rss_mib']:.0f} | "
            f"{r['rss_ratio']:.2f} | {100 * r['padding_frac']:.1f}% | {r['micro_batches']} | "
            f"{r['largest_micro_positions']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
