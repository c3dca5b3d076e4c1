"""The registry's objectives and the entropy controls side by side on the built-in task
(docs/objectives.md).

    python bench/objectives.py                         # runs missing runs, then the page's table
    python bench/objectives.py --report-only           # table and figures from what finished
    python bench/objectives.py --task chain --steps 40 --variants grpo dapo cispo sapo gmpo \
        top-entropy-0.2 clip-cov-2e-2 kl-cov-2e-2     # the page's second task
    python bench/objectives.py --variants grpo dapo --seeds 1 --steps 4 --out /tmp/x  # a test

Each run is `python -m rlvr train --preset P` on rlvr-tiny and the arithmetic task, one
process with one thread (OMP_NUM_THREADS=1), with the ablation page's update
(docs/ablation.md): lr 2e-4 and `algo.mini_batches=4`, so that the ratio moves away from 1
between a rollout's optimiser steps and clipping, gating and the covariance selections have
something to act on (with one optimiser step per rollout rho = 1 at every loss and most of
these objectives reduce to the same policy gradient). The entropy controls are DAPO with one
change each. `default-*` are the presets' own default runs (lr 4e-4, one mini-batch, the
preset's length on the built-in model, 100 steps; held-out every 12 steps): the default runs of the preset table in docs/guides/datasets.md (the cispo preset
learns as DAPO's does).

Resumable: a run with a summary.json is done; an interrupted one continues with
`rlvr train --resume`; the table is rewritten from every finished run each time.
Output: OUT/runs/<variant>-s<seed>/ (OUT defaults to runs/objectives), OUT/table.md,
docs/objectives/results.json (every run's curves and numbers) and docs/objectives/*.png;
for another --task, OUT is runs/objectives-TASK and the files in docs/objectives start TASK_.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _runs import mean_sd, run_missing, run_summary, train_command

from rlvr.cli.plot import load_run as load_metrics

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--optim.lr=2e-4", "--algo.mini_batches=4"]
VARIANTS: dict[str, tuple[str, list[str]]] = {  # name -> (preset, changes)
    "grpo": ("grpo", SMALL),
    "dapo": ("dapo", SMALL),
    "cispo": ("cispo", SMALL),
    "sapo": ("sapo", SMALL),
    "gmpo": ("gmpo", SMALL),
    "top-entropy-0.2": ("dapo", [*SMALL, "--algo.top_entropy_quantile=0.2"]),
    "clip-cov": ("dapo", [*SMALL, "--algo.loss=clip_cov"]),
    "kl-cov": ("dapo", [*SMALL, "--algo.loss=kl_cov", "--algo.clip_high=0.2"]),
    # the covariance selections at 2% of a mini-batch's tokens instead of the paper's 0.02%,
    # which here (about 600 loss tokens a mini-batch) is the one token k = max(1, 0.12) gives
    "clip-cov-2e-2": ("dapo", [*SMALL, "--algo.loss=clip_cov", "--algo.clip_cov_ratio=0.02"]),
    "kl-cov-2e-2": (
        "dapo",
        [*SMALL, "--algo.loss=kl_cov", "--algo.clip_high=0.2", "--algo.kl_cov_ratio=0.02"],
    ),
    # DPPO's binary-TV mask (the preset: 0.15, Dr. GRPO, bypass) and binary-KL mask (0.05)
    "dppo": ("dppo", SMALL),
    "dppo-kl": (
        "dppo",
        [*SMALL, "--algo.loss=dppo_kl", "--algo.clip_low=0.05", "--algo.clip_high=0.05"],
    ),
    # DAPO's recipe with DPPO's binary-TV mask in place of the ratio clip: the mask alone
    "dapo-dppo-tv": (
        "dapo",
        [*SMALL, "--algo.loss=dppo_tv", "--algo.clip_low=0.15", "--algo.clip_high=0.15"],
    ),
    "default-dapo": ("dapo", []),
    "default-cispo": ("cispo", []),
    "default-sapo": ("sapo", []),
    "default-gmpo": ("gmpo", []),
}
# the share of loss tokens each variant clips, gates off or leaves out (per-step metrics)
SHARES = (
    "clip_frac_low",
    "clip_frac_high",
    "top_entropy_kept_frac",
    "cov_frac",
    "dppo_masked_frac",
)


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=50, help="steps of the non-default runs")
    p.add_argument("--parallel", type=int, default=2, help="runs at a time")
    p.add_argument("--task", default="arithmetic", help="a built-in task (data.task)")
    p.add_argument("--out", type=Path, default=None, help="default: runs/objectives[-TASK]")
    p.add_argument("--docs", type=Path, default=ROOT / "docs")
    p.add_argument("--report-only", action="store_true")
    a = p.parse_args()
    other = a.task != "arithmetic"
    a.out = a.out or ROOT / "runs" / ("objectives" + (f"-{a.task}" if other else ""))
    a.prefix = f"{a.task}_" if other else ""  # of the figures and results.json in DOCS
    return a


def _job(name: str, seed: int, a: argparse.Namespace) -> tuple[Path, list[str]]:
    run = a.out / "runs" / f"{name}-s{seed}"
    preset, changes = VARIANTS[name]
    steps = [] if name.startswith("default-") else [f"--max-steps={a.steps}"]
    args = ["--preset", preset, f"--data.task={a.task}", *changes, *steps, f"--train.seed={seed}"]
    # a default run is evaluated every 12 steps whatever its length (the page's runs used this)
    return run, train_command(run, args, every=max(1, (60 if not steps else a.steps) // 5))


def run_all(a: argparse.Namespace) -> None:
    """Every missing run, `a.parallel` at a time, in the order of `a.variants`, seed-major."""
    seeds = range(1, a.seeds + 1)
    run_missing([_job(name, seed, a) for seed in seeds for name in a.variants], a.parallel)


def load_run(run: Path) -> dict | None:
    if not (run / "summary.json").exists():
        return None
    finished = load_metrics(run)
    out = run_summary(finished, SHARES)
    entropy = [r["entropy"] for r in finished.rows if "entropy" in r]
    return {
        "before": out["before"],
        "after": out["after"],
        "curve": out["curve"],
        "entropy_first": entropy[0] if entropy else None,
        "entropy_last": entropy[-1] if entropy else None,
        "entropy_curve": entropy,
        "shares": out["means"],
        "loss_tokens": sum(r.get("loss_tokens", 0.0) for r in finished.rows),
        "steps": out["steps"],
        "wall_time_s": out["wall_time_s"],
    }


def plot(results: dict[str, list[dict]], out: Path, prefix: str = "") -> list[str]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out.mkdir(parents=True, exist_ok=True)
    names = []
    for key, label, fname in (("curve", "held-out accuracy", "accuracy.png"),
                              ("entropy_curve", "entropy (nats)", "entropy.png")):  # fmt: skip
        for group, title in ((False, "objectives"), (True, "presets' default runs")):
            if not any(name.startswith("default-") == group for name in results):
                continue
            fig = Figure(figsize=(6.4, 4.2))
            FigureCanvasAgg(fig)
            ax = fig.add_subplot()
            for name, runs in results.items():
                if name.startswith("default-") != group:
                    continue
                if key == "curve":
                    steps = [x for x, _ in runs[0]["curve"]]
                    ys = [[y for _, y in r["curve"]] for r in runs]
                else:
                    steps = list(range(1, min(len(r[key]) for r in runs) + 1))
                    ys = [r[key][: len(steps)] for r in runs]
                n = min(len(y) for y in ys)
                mean = [statistics.mean(c) for c in zip(*(y[:n] for y in ys))]
                ax.plot(steps[:n], mean, label=f"{name} ({len(runs)} seeds)")
            ax.set_xlabel("step")
            ax.set_ylabel(label)
            ax.set_title(title)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            fname_g = prefix + (fname.replace(".png", "_default.png") if group else fname)
            fig.savefig(out / fname_g, dpi=110, bbox_inches="tight")
            names.append(fname_g)
    return names


def report(a: argparse.Namespace) -> None:
    results: dict[str, list[dict]] = {}
    for name in VARIANTS:
        for seed in range(1, a.seeds + 1):
            got = load_run(a.out / "runs" / f"{name}-s{seed}")
            if got is not None:
                results.setdefault(name, []).append(got)
    if not results:
        print("no finished run yet")
        return
    figs = plot(results, a.docs / "objectives", a.prefix)
    lines = [
        "| variant | seeds | held-out before | held-out after | per seed | entropy first -> "
        "last step | clipped / masked share (mean per step) | loss tokens trained | "
        "wall time per run (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        shares = {}
        for r in runs:
            for k, v in r["shares"].items():
                shares.setdefault(k, []).append(v)
        share = ", ".join(f"{k} {statistics.mean(v):.4f}" for k, v in shares.items()) or "-"
        per_seed = ", ".join(f"{r['after']:.3f}" for r in runs)
        lines.append(
            f"| {name} | {len(runs)} | {mean_sd([r['before'] for r in runs])} | "
            f"{mean_sd([r['after'] for r in runs])} | "
            f"{per_seed} | "
            f"{mean_sd([r['entropy_first'] for r in runs])} -> "
            f"{mean_sd([r['entropy_last'] for r in runs])} | {share} | "
            f"{mean_sd([r['loss_tokens'] for r in runs], '.0f')} | "
            f"{mean_sd([r['wall_time_s'] for r in runs], '.0f')} |"
        )
    table = "\n".join(lines)
    (a.out / "table.md").write_text(table + "\n")
    (a.docs / "objectives" / f"{a.prefix}results.json").write_text(
        json.dumps(results, indent=1) + "\n"
    )
    print(table)
    print("figures:", ", ".join(figs))


def main() -> None:
    a = _args()
    if not a.report_only:
        run_all(a)
    report(a)


if __name__ == "__main__":
    main()
