"""rlvr against TRL's GRPOTrainer as the work grows: one axis at a time around a centre point.

    python bench/shapes.py --quick        # three points (~4 CPU minutes)
    python bench/shapes.py                # the grid, 1 warm-up + 1 timed step a run, 1 thread
    python bench/shapes.py --points prompt400 --redo   # measure one point again
    python bench/shapes.py --table        # the Markdown table of what the results file holds

Centre: a 27.6M-parameter Qwen2 (hidden 512, 7 layers, 8 heads, 4 key/value heads,
intermediate 2048; random init, seeded), 256 completion tokens forced, the arithmetic task's
47-token prompts, one prompt x G=8 a step, fp32, beta 0. Axes: model 4.25M / 27.6M / 112.7M;
response 64 / 256 / 1024;
prompt 47 / 400 (a fixed system message in front of every prompt, shared by the G samples);
G 8 / 16; fp32 / bf16 autocast. Every run is one child of `bench/vs_trl.py` (the same
settings, timing hooks and FLOP counts, attention included); runs alternate TRL, rlvr per
point, so both sides of a ratio see the same machine load; every phase is also timed in CPU
time (`time.process_time`), which the table uses (see bench/README.md). One prompt a step keeps
TRL's largest point (1024 tokens) at ~4.5 GiB.

Each finished point is one JSON line appended to `--results` (default
bench/results/shapes.jsonl); a rerun skips the points already there (`--redo` measures them
again and appends; the table uses each point's last line).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import vs_trl  # noqa: E402
from _shared import build_qwen2, load_char_tokenizer, task_prompts  # noqa: E402

MODELS = {
    "4M": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "30M": dict(
        hidden_size=512, num_hidden_layers=7, num_attention_heads=8, intermediate_size=2048
    ),
    "120M": dict(
        hidden_size=768, num_hidden_layers=13, num_attention_heads=12, intermediate_size=3072
    ),
}
CENTRE = dict(model="30M", length=256, prompt=47, group=8, precision="fp32")
GRID = {  # cheapest first, so that an interrupted run has the most points
    "centre": {},
    "model4M": dict(model="4M"),
    "response64": dict(length=64),
    "prompt400": dict(prompt=400),
    "G16": dict(group=16),
    "bf16": dict(precision="bf16"),
    "model120M": dict(model="120M"),
    "response1024": dict(length=1024),
}
QUICK = ("model4M", "response64", "prompt400")
FILLER = (
    "You are a careful calculator. Work out the expression step by step, check each "
    "intermediate result, and give only the final number inside the answer tags. "
)


def point(name: str) -> dict:
    return {**CENTRE, **GRID[name]}


def system_prompt_for(tokenizer, target: int) -> str | None:
    """A system message that makes the rendered arithmetic prompt `target` tokens long."""
    base = len(tokenizer(task_prompts(tokenizer, "arithmetic", "train", 1, 0)[0][0]).input_ids)
    if target <= base:
        return None
    text = FILLER * (target // len(FILLER) + 2)
    n = target - base
    for _ in range(8):  # the template's system block adds a fixed number of tokens
        rendered = task_prompts(tokenizer, "arithmetic", "train", 1, 0, text[:n])[0][0]
        got = len(tokenizer(rendered).input_ids)
        if got == target:
            return text[:n]
        n += target - got
    raise SystemExit(f"no system prompt renders to {target} tokens")


def model_dir(work: Path, name: str, seed: int) -> Path:
    path = work / "models" / name
    if not (path / "config.json").exists():
        build_qwen2(path, seed=seed, max_position_embeddings=2048, **MODELS[name])
    return path


def measure(name: str, args, work: Path) -> dict:
    p = point(name)
    mdir = model_dir(work, p["model"], args.seed)
    shape = vs_trl.model_shape(mdir)
    tok = load_char_tokenizer(str(mdir))
    bf16 = p["precision"] == "bf16"
    run_args = argparse.Namespace(
        warmup=args.warmup,
        steps=args.steps,
        threads=args.threads,
        seed=args.seed,
        rlvr_engine=None,
        trl_gradient_checkpointing=False,
        bf16=bf16,
        prompts=1,
        group=p["group"],
        length=p["length"],
        system_prompt=system_prompt_for(tok, p["prompt"]),
    )
    dtype = torch.bfloat16 if bf16 else torch.float32
    peaks = [vs_trl.matmul_peak(args.threads, rounds=3, dtype=dtype)]
    cpu_peaks = [vs_trl.matmul_peak(args.threads, rounds=3, dtype=dtype, clock=time.process_time)]
    runs: dict[str, list[dict]] = {"trl": [], "rlvr": []}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for kind in ("trl", "rlvr"):
            tag = f"{name}-{kind}-r{r}"
            shutil.rmtree(work / "runs" / tag, ignore_errors=True)  # a kept earlier run's files
            res = vs_trl.run_child(kind, 0.0, run_args, mdir, work / "runs", tag)
            runs[kind].append(res)
            print(
                f"  {name} round {r} {kind:>4}: {vs_trl._median(res, 'step'):7.2f} s/step "
                f"(gen {vs_trl._median(res, 'generation'):6.2f} s, train "
                f"{vs_trl._median(res, 'train'):6.2f} s; CPU {vs_trl._median(res, 'step_cpu'):6.2f}"
                f" s/step), rss {res['peak_rss_mib']:6.0f} MiB",
                flush=True,
            )
    peak = max(peaks + [x for rs in runs.values() for r in rs for x in r["matmul_peaks"]])
    cpu_peak = max(
        cpu_peaks + [x for rs in runs.values() for r in rs for x in r["matmul_peaks_cpu"]]
    )
    s = {k: vs_trl.summarise(runs[k], shape, peak, 0.0, k, cpu_peak) for k in runs}
    prompt_len = runs["trl"][0]["timed"][0]["prompt_tokens"] / runs["trl"][0]["timed"][0]["rows"]
    return {
        "point": name,
        **p,
        "prompt_tokens": prompt_len,
        "params_m": round(shape["total"] / 1e6, 2),
        "rounds": args.rounds,
        "timed_steps_per_run": args.steps,
        "threads": args.threads,
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "matmul_peak_gflops_per_cpu_s": round(cpu_peak / 1e9, 1),
        # CPU seconds of each one-thread process: what a busy machine's time-sharing leaves alone
        "speedup_end_to_end_cpu": s["trl"]["sec_per_step_cpu"] / s["rlvr"]["sec_per_step_cpu"],
        "speedup_generation_cpu": s["trl"]["generation_cpu_s"] / s["rlvr"]["generation_cpu_s"],
        "speedup_train_cpu": s["trl"]["train_cpu_s"] / s["rlvr"]["train_cpu_s"],
        "speedup_end_to_end": s["trl"]["sec_per_step"] / s["rlvr"]["sec_per_step"],
        "speedup_generation": s["trl"]["generation_s"] / s["rlvr"]["generation_s"],
        "speedup_train": s["trl"]["train_s"] / s["rlvr"]["train_s"],
        "rss_ratio": s["rlvr"]["peak_rss_mib"] / s["trl"]["peak_rss_mib"],
        "trl": s["trl"],
        "rlvr": s["rlvr"],
        "wall_s": time.perf_counter() - t0,
        "load_avg": os.getloadavg(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def load(path: Path) -> dict[str, dict]:
    """Each point's last line in the results file."""
    out: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                out[rec["point"]] = rec
    return out


ORDER = ["model4M", "centre", "model120M", "response64", "response1024", "prompt400", "G16", "bf16"]


def table(results: dict[str, dict]) -> str:
    """Per point, in CPU time (see the module docstring): rlvr and TRL completion tokens per
    CPU second, rlvr's speedups, both trainers' MFU, peak RSS; the wall-clock speedup last."""
    head = (
        "| point | params | prompt + response, G | rlvr tok/s | TRL tok/s | end to end | "
        "generation | train | rlvr MFU gen / train | TRL MFU gen / train | RSS MiB rlvr / TRL "
        "| wall-clock end to end |"
    )
    rows = [head, "|" + "---|" * 12]
    for name in ORDER:
        r = results.get(name)
        if r is None:
            rows.append(f"| {name} | not measured |" + " |" * 10)
            continue
        a, b = r["rlvr"], r["trl"]
        prec = "" if r["precision"] == "fp32" else f", {r['precision']}"
        rows.append(
            f"| {name} | {r['params_m']:.1f}M | {r['prompt_tokens']:.0f} + {r['length']}, "
            f"{r['group']}{prec} | {a['tokens_per_cpu_s']:,.0f} | {b['tokens_per_cpu_s']:,.0f} | "
            f"**{r['speedup_end_to_end_cpu']:.2f}x** | {r['speedup_generation_cpu']:.2f}x | "
            f"{r['speedup_train_cpu']:.2f}x | {a['gen_mfu_cpu']:.0%} / {a['train_mfu_cpu']:.0%} | "
            f"{b['gen_mfu_cpu']:.0%} / {b['train_mfu_cpu']:.0%} | "
            f"{a['peak_rss_mib']:,.0f} / {b['peak_rss_mib']:,.0f} | "
            f"{r['speedup_end_to_end']:.2f}x |"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"points {', '.join(QUICK)}; 1 + 1 steps")
    p.add_argument("--points", default=None, help=f"comma list of {', '.join(GRID)}")
    p.add_argument("--rounds", type=int, default=1, help="TRL / rlvr pairs per point")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps at the start of a run")
    p.add_argument("--steps", type=int, default=1, help="timed steps per run")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", default=None, help="default bench/results/shapes[_quick].jsonl")
    p.add_argument("--redo", action="store_true", help="measure points already in --results")
    p.add_argument("--table", action="store_true", help="print the table of --results and exit")
    p.add_argument("--keep", default=None, help="keep models and run files in this directory")
    args = p.parse_args()
    default = HERE / "results" / ("shapes_quick.jsonl" if args.quick else "shapes.jsonl")
    results_path = Path(args.results or default)
    if args.table:
        print(table(load(results_path)))
        return
    names = list(QUICK) if args.quick else list(GRID)
    if args.points:
        names = args.points.split(",")
        unknown = [n for n in names if n not in GRID]
        if unknown:
            raise SystemExit(f"--points: unknown {unknown}; expected some of {list(GRID)}")
    if args.quick:
        args.warmup, args.steps = 1, 1
    done = load(results_path)
    todo = [n for n in names if args.redo or n not in done]
    print(f"points to measure: {todo or 'none'} (results: {results_path})", flush=True)
    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="shapes_")
    work = Path(args.keep or tmp.name)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    for name in todo:
        if not args.redo and name in load(results_path):  # another invocation measured it
            continue
        rec = measure(name, args, work)
        with results_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(
            f"{name}: CPU time end to end {rec['speedup_end_to_end_cpu']:.2f}x, generation "
            f"{rec['speedup_generation_cpu']:.2f}x, train {rec['speedup_train_cpu']:.2f}x; wall "
            f"{rec['speedup_end_to_end']:.2f}x; RSS ratio {rec['rss_ratio']:.2f} "
            f"({rec['wall_s']:.0f} s)",
            flush=True,
        )
    if tmp is not None:
        tmp.cleanup()
    print(table(load(results_path)))


if __name__ == "__main__":
    main()
