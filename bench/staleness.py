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

from _runs import arm_bench, arm_job

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
COLUMNS = [
    ("staleness mean", "staleness/mean", ".2f"),
    ("IS weight mean", "rollout/is_weight_mean", ".4f"),
    ("ESS", "rollout/is_ess", ".4f"),
    ("truncated share", "rollout/is_truncated_frac", ".1e"),
]


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


def main() -> None:
    a = _args()
    results = arm_bench(a, ARMS, COLUMNS, lambda arm, seed: arm_job(a, ARMS, arm, seed))
    if results:
        docs = a.docs / "staleness"
        docs.mkdir(parents=True, exist_ok=True)
        (docs / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        plot(results, docs / "accuracy.png")


if __name__ == "__main__":
    main()
