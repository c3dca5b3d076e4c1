"""One rlvr training step timed in two checkouts, runs interleaved A B A B: medians and spread.

    git worktree add /tmp/before <commit>
    python bench/step_ab.py --before /tmp/before --points centre,model4M --pairs 4

Each run is bench/vs_trl.py's rlvr child from that checkout (its own `bench/vs_trl.py`, its
`src` first on PYTHONPATH) on the same saved model: `--warmup` untimed steps, then `--steps`
timed ones, one thread, beta 0. Points: `centre` is bench/shapes.py's centre (27.6M, one
prompt x G=8, 256 tokens forced); `model4M` the 4.25M comparison model of bench/vs_trl.py at
its own batch (4 prompts x G=8, 64 tokens). The order within a pair flips every pair. Per run
the medians of its timed steps; per point the median over runs and the ratio after / before
pair by pair (CPU time is what a quiet core would take; wall time the machine's load adds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import shapes  # noqa: E402
import vs_trl  # noqa: E402
from _shared import build_qwen2  # noqa: E402

POINTS = {"centre": dict(model="30M", prompts=1, length=256), "model4M": dict(model="4M", prompts=4, length=64)}  # fmt: skip
KEYS = ("step", "step_cpu", "train", "train_cpu")


def run(tree: Path, point: dict, mdir: Path, work: Path, tag: str, args) -> dict:
    child = argparse.Namespace(
        warmup=args.warmup, steps=args.steps, threads=1, seed=0, rlvr_engine=None,
        trl_gradient_checkpointing=False, bf16=False, prompts=point["prompts"], group=8,
        length=point["length"], system_prompt=None,
    )  # fmt: skip
    cmd, env, out = vs_trl.child_command("rlvr", 0.0, child, mdir, work, tag)
    cmd[1] = str(tree / "bench" / "vs_trl.py")
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), str(tree / "bench")])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"run {tag} in {tree} failed (exit {proc.returncode})")
    res = vs_trl.checked_result("rlvr", child, out, tag)
    return {k: statistics.median(s[k] for s in res["timed"]) for k in KEYS}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="the other checkout (its root)")
    p.add_argument("--after", default=str(HERE.parent), help="default: this checkout")
    p.add_argument("--points", default="centre,model4M")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    trees = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    summary = {}
    with tempfile.TemporaryDirectory(prefix="step_ab_") as tmp:
        for name in args.points.split(","):
            point = POINTS[name]
            mdir = Path(tmp) / "models" / name
            build_qwen2(mdir, seed=0, max_position_embeddings=2048, **shapes.MODELS[point["model"]])
            got: dict[str, list[dict]] = {"before": [], "after": []}
            for i in range(args.pairs):
                for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    r = run(
                        trees[side], point, mdir, Path(tmp) / "runs", f"{name}-{side}-{i}", args
                    )
                    got[side].append(r)
                    print(f"  {name} pair {i} {side:>6}: " + ", ".join(f"{k} {r[k]:.3f} s" for k in KEYS), flush=True)  # fmt: skip
            s = {}
            for k in KEYS:
                b, a = [r[k] for r in got["before"]], [r[k] for r in got["after"]]
                ratios = [x / y for x, y in zip(a, b)]
                s[k] = {
                    "before_median": statistics.median(b), "before_spread": [min(b), max(b)],
                    "after_median": statistics.median(a), "after_spread": [min(a), max(a)],
                    "ratio_median": statistics.median(ratios),
                    "ratio_spread": [min(ratios), max(ratios)],
                }  # fmt: skip
                print(
                    f"{name} {k}: before {s[k]['before_median']:.3f} s ({min(b):.3f}..{max(b):.3f}), "
                    f"after {s[k]['after_median']:.3f} s ({min(a):.3f}..{max(a):.3f}), after / before "
                    f"{s[k]['ratio_median']:.3f} ({min(ratios):.3f}..{max(ratios):.3f})"
                )  # fmt: skip
            summary[name] = s
    print(json.dumps({"pairs": args.pairs, "load": os.getloadavg(), **summary}))


if __name__ == "__main__":
    main()
