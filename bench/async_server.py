"""What the rollout server's overlap buys (docs/async.md): the default run synchronous against
generation beside training at staleness 1 and 2, in one interleaved measurement.

    python bench/async_server.py                         # fast engine, 3 seeds
    python bench/async_server.py --engine vllm --seeds 1 --steps 20   # in the vLLM CPU venv
    python bench/async_server.py --report-only

Arms, each the default run (`rlvr train`: rlvr-tiny, arithmetic, dapo, 100 steps) with
held-out accuracy every `--every` steps:

    sync          in process, train.max_staleness=0, the trainer's 2 threads
    k1            in process, max_staleness=1 (the schedule of server-k1, nothing beside)
    server-k1/k2  rollout server on CPU 0, trainer on CPU 1, max_staleness=1 / 2

Staleness > 0 with token-level importance weights (algo.rollout_correction=token). The runs
go one at a time (the whole machine each), seed by seed and arm by arm in turn. Per run: wall
time of the process (start-up, evaluations and all), time to the last step and to the first
held-out evaluation at or above `--target` (from the first step's generation to the end of
that step's update; the earlier evaluations' time included, that one's not), the median step (one update_end to the next, evaluation
steps left out) and the median seconds the trainer waited for generation and generation for
the trainer. Resumable: a run whose directory holds summary.json is read, not rerun.
Output: OUT/<engine>/<arm>-s<seed>/, OUT/<engine>/table.md (OUT: runs/async), and the table
and the accuracy-against-time figure in DOCS/<engine>.md and DOCS/<engine>.png (docs/async).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = ["--rollout.server.enabled=true", "--rollout.server.cpus=0", "--rollout.server.trainer_cpus=1"]  # fmt: skip
TIS = ["--algo.rollout_correction=token"]
ARMS: dict[str, list[str]] = {
    "sync": [],
    "k1": ["--train.max_staleness=1", *TIS],
    "server-k1": ["--train.max_staleness=1", *TIS, *SERVER],
    "server-k2": ["--train.max_staleness=2", *TIS, *SERVER],
}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["fast", "vllm"], default="fast")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="steps (default: the run's, 100)")
    p.add_argument("--every", type=int, default=15, help="held-out evaluation every N steps")
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "async")
    p.add_argument("--docs", type=Path, default=ROOT / "docs" / "async", help="table and figure")
    p.add_argument("--report-only", action="store_true")
    return p.parse_args()


def _run(run: Path, arm: str, seed: int, a: argparse.Namespace) -> None:
    if (run / "summary.json").exists():
        return
    cmd = [
        sys.executable, "-m", "rlvr", "train", *ARMS[arm], f"--rollout.engine={a.engine}",
        f"--train.seed={seed}", f"--train.eval_every={a.every}", "--output-dir", str(run),
        "--no-progress", *([f"--max-steps={a.steps}"] if a.steps else []),
    ]  # fmt: skip
    if run.exists():
        subprocess.run(["rm", "-rf", str(run)], check=True)
    run.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(f"{run}.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
    print(f"{run.name}: exit {rc} in {time.perf_counter() - t0:.1f}s", flush=True)


def measure(run: Path, target: float) -> dict[str, float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    start = rows[0]["time/gen_start"]
    reached = [r for r in rows if r.get("eval/accuracy", -1) >= target]
    evals = {r["step"] for r in rows if "eval/accuracy" in r}
    steps = [b["time/update_end"] - a["time/update_end"] for a, b in itertools.pairwise(rows)
             if a["step"] not in evals]  # fmt: skip
    waits = [r for r in rows if "time/gen_wait" in r]
    return {
        "wall": summary["wall_time_s"],
        "to_last": rows[-1]["time/update_end"] - start,
        "to_target": reached[0]["time/update_end"] - start if reached else float("nan"),
        "step": statistics.median(steps),
        "gen_wait": statistics.median(r["time/gen_wait"] for r in waits) if waits else 0.0,
        "train_wait": statistics.median(r["time/train_wait"] for r in waits) if waits else 0.0,
        "final": summary["eval_after"]["accuracy"],
        "curve": [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r],
    }


def table(out: Path, arms: list[str], seeds: int, target: float) -> str:
    lines = [
        f"| arm | wall s | to last step s | to {target:.2f} s | step s | trainer waited s | "
        "generation waited s | final accuracy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        got = [measure(out / f"{arm}-s{s}", target) for s in range(1, seeds + 1)
               if (out / f"{arm}-s{s}" / "summary.json").exists()]  # fmt: skip
        if not got:
            continue

        def med(key, fmt=".1f", got=got):
            vals = [g[key] for g in got if g[key] == g[key]]  # nan: not reached
            if not vals:
                return "not reached"
            missed = f", {len(got) - len(vals)} not reached" if len(vals) < len(got) else ""
            return f"{statistics.median(vals):{fmt}} ({min(vals):{fmt}}-{max(vals):{fmt}}{missed})"

        lines.append(
            f"| {arm} | {med('wall')} | {med('to_last')} | {med('to_target')} | "
            f"{med('step', '.3f')} | {med('gen_wait', '.3f')} | {med('train_wait', '.3f')} | "
            f"{med('final', '.3f')} |"
        )
    lines += ["", "Held-out accuracy by step (each seed):", ""]
    for arm in arms:
        for s in range(1, seeds + 1):
            run = out / f"{arm}-s{s}"
            if (run / "summary.json").exists():
                curve = measure(run, target)["curve"]
                lines.append(f"- {arm} seed {s}: " + ", ".join(f"{st}: {acc:.3f}" for st, acc in curve))  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(out: Path, arms: list[str], seeds: int, path: Path) -> None:
    """Held-out accuracy against wall-clock seconds from the first step, one line a run."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, arm in enumerate(arms):
        for s in range(1, seeds + 1):
            run = out / f"{arm}-s{s}"
            if not (run / "summary.json").exists():
                continue
            rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            start = rows[0]["time/gen_start"]
            before = json.loads((run / "summary.json").read_text())["eval_before"]["accuracy"]
            xs = [0.0] + [r["time/update_end"] - start for r in rows if "eval/accuracy" in r]
            ys = [before] + [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
            ax.plot(xs, ys, marker="o", color=f"C{i}", alpha=0.8, label=arm if s == 1 else None)
    ax.set_xlabel("seconds from the first step")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("synchronous vs the rollout server at staleness 1 and 2")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def main() -> None:
    a = _args()
    out = a.out / a.engine
    if not a.report_only:
        for seed in range(1, a.seeds + 1):
            for arm in a.arms:
                _run(out / f"{arm}-s{seed}", arm, seed, a)
    text = table(out, a.arms, a.seeds, a.target)
    (out / "table.md").write_text(text)
    if a.docs:
        a.docs.mkdir(parents=True, exist_ok=True)
        (a.docs / f"{a.engine}.md").write_text(text)
        plot(out, a.arms, a.seeds, a.docs / f"{a.engine}.png")
    print(text)


if __name__ == "__main__":
    main()
