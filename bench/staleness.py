"""Bounded staleness on the default run: held-out accuracy when each step trains on the batch
sampled 0, 1 or 2 policy versions earlier, with token-level importance weights (TIS) or
without them (bypass: the clip's ratio taken against the sampling policy).

    python bench/staleness.py                      # missing runs, then the table and figures
    python bench/staleness.py --report-only
    python bench/staleness.py --seeds 1 --steps 2 --out /tmp/x --docs /tmp/x   # a test

Each run is the default run (`rlvr train`: rlvr-tiny, the arithmetic task, the dapo preset,
60 steps) with `train.max_staleness=k` and `algo.rollout_correction=token` (cap 2) or
`algo.rollout_bypass=true`, one process with one thread, two at a time; held-out accuracy
every 12 steps. Resumable as bench/objectives.py. Output: OUT/runs/<arm>-s<seed>/ (OUT
defaults to runs/staleness), OUT/table.md, DOCS/staleness/{accuracy.png,results.json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _runs import mean_sd, run_missing, train_command

from rlvr.plots import load_run as load_metrics

ROOT = Path(__file__).resolve().parent.parent
TIS = ["--algo.rollout_correction=token", "--algo.rollout_is_cap=2"]
BYPASS = ["--algo.rollout_bypass=true"]
ARMS: dict[str, list[str]] = {
    "k0": [],
    "k1-tis": ["--train.max_staleness=1", *TIS],
    "k2-tis": ["--train.max_staleness=2", *TIS],
    "k1-bypass": ["--train.max_staleness=1", *BYPASS],
    "k2-bypass": ["--train.max_staleness=2", *BYPASS],
}
MEANS = ("staleness/mean", "rollout/is_weight_mean", "rollout/is_ess", "rollout/is_truncated_frac")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="steps (default: the preset's)")
    p.add_argument("--parallel", type=int, default=2, help="runs at a time")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "staleness")
    p.add_argument("--docs", type=Path, default=ROOT / "docs")
    p.add_argument("--report-only", action="store_true")
    return p.parse_args()


def _job(arm: str, seed: int, a: argparse.Namespace) -> tuple[Path, list[str]]:
    run = a.out / "runs" / f"{arm}-s{seed}"
    steps = [f"--max-steps={a.steps}"] if a.steps else []
    every = max(1, (a.steps or 60) // 5)
    return run, train_command(run, [*ARMS[arm], *steps, f"--train.seed={seed}"], every)


def load_run(run: Path) -> dict | None:
    if not (run / "summary.json").exists():
        return None
    finished = load_metrics(run)
    rows, s = finished.rows, finished.summary
    curve = [(0, s["eval_before"]["accuracy"])]
    curve += [(i + 1, r["eval/accuracy"]) for i, r in enumerate(rows) if "eval/accuracy" in r]
    means = {}
    for key in MEANS:
        xs = [r[key] for r in rows if key in r]
        if xs:
            means[key] = statistics.mean(xs)
    return {
        "before": s["eval_before"]["accuracy"],
        "after": s["eval_after"]["accuracy"],
        "curve": curve,
        "means": means,
        "steps": s["steps"],
        "wall_time_s": s["wall_time_s"],
    }


def plot(results: dict[str, list[dict]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for arm, runs in results.items():
        n = min(len(r["curve"]) for r in runs)
        steps = [x for x, _ in runs[0]["curve"][:n]]
        ys = [statistics.mean(r["curve"][i][1] for r in runs) for i in range(n)]
        ax.plot(steps, ys, marker="o", label=f"{arm} ({len(runs)} seeds)")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("max_staleness k, with TIS or bypass")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def report(a: argparse.Namespace) -> None:
    results: dict[str, list[dict]] = {}
    for arm in ARMS:
        for seed in range(1, a.seeds + 1):
            got = load_run(a.out / "runs" / f"{arm}-s{seed}")
            if got is not None:
                results.setdefault(arm, []).append(got)
    if not results:
        print("no finished run yet")
        return
    lines = [
        "| arm | seeds | held-out before | held-out after | per seed | staleness mean | "
        "IS weight mean | ESS | truncated share | wall time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, runs in results.items():

        def mean_of(key: str, spec: str, runs=runs) -> str:
            xs = [r["means"][key] for r in runs if key in r["means"]]
            return mean_sd(xs, spec) if xs else "-"

        lines.append(
            f"| {arm} | {len(runs)} | {mean_sd([r['before'] for r in runs])} | "
            f"{mean_sd([r['after'] for r in runs])} | "
            f"{', '.join(format(r['after'], '.3f') for r in runs)} | "
            f"{mean_of('staleness/mean', '.2f')} | {mean_of('rollout/is_weight_mean', '.4f')} | "
            f"{mean_of('rollout/is_ess', '.4f')} | {mean_of('rollout/is_truncated_frac', '.1e')} | "
            f"{mean_sd([r['wall_time_s'] for r in runs], '.0f')} |"
        )
    table = "\n".join(lines)
    (a.out / "table.md").write_text(table + "\n")
    docs = a.docs / "staleness"
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, docs / "accuracy.png")
    print(table)


def main() -> None:
    a = _args()
    if not a.report_only:
        seeds = range(1, a.seeds + 1)
        run_missing([_job(arm, s, a) for s in seeds for arm in a.arms], a.parallel)
    report(a)


if __name__ == "__main__":
    main()
