"""PPO (with a critic) against GRPO, DAPO and REINFORCE++ on the built-in task, and the
resource claim: a value model costs memory and compute.

    python bench/ppo_vs_grpo.py                      # runs missing runs, then writes the page
    python bench/ppo_vs_grpo.py --report-only        # the page and figures from what finished
    python bench/ppo_vs_grpo.py --seeds 1 --samples 640 --out /tmp/x   # test the script

Each run is `python -m rlvr train --preset NAME` on rlvr-tiny and the arithmetic task with its
tiny defaults, one process with one thread, under the same budget of generated training
responses (`--samples`): GRPO and DAPO sample 16 prompts x G=8 per step, PPO and REINFORCE++
64 prompts x 1, so the critic-free group methods take `samples / 128` steps and the
one-sample methods `samples / 64`. DAPO's dynamic sampling generates more than 128 responses
in a step when it refills; its curve uses the responses it actually generated. Held-out
accuracy (`train.eval_size` prompts, one sample each at temperature 1) is measured before
training and every `samples / 5` responses. Peak memory is the process's maximum resident set
size (`wait4`), time per step the mean of `time/step` (generation, log-probs, the critic's
values and both updates; evaluation excluded).

Resumable: a run with a summary.json is done and kept; a run that was interrupted is continued
with `rlvr train --resume` from its last checkpoint; the page is rewritten from every finished
run each time. Output: OUT/runs/<algo>-s<seed>/ (OUT defaults to runs/ppo_vs_grpo), docs/ppo_vs_grpo.md and docs/ppo_vs_grpo/*.png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _runs import run_missing, train_command

from rlvr.algos import pooled_explained_variance
from rlvr.cli.plot import load_run as load_metrics

ROOT = Path(__file__).resolve().parent.parent
ALGOS = {  # preset -> responses per step (without dynamic-sampling refills)
    "ppo": 64,
    "reinforce_pp": 64,
    "grpo": 128,
    "dapo": 128,
}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--samples", type=int, default=12800, help="training responses per run")
    p.add_argument("--eval-size", type=int, default=128)
    p.add_argument("--parallel", type=int, default=2, help="runs at a time")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "ppo_vs_grpo")
    p.add_argument("--docs", type=Path, default=ROOT / "docs")
    p.add_argument("--report-only", action="store_true")
    return p.parse_args()


def _job(algo: str, seed: int, a: argparse.Namespace) -> tuple[Path, list[str]]:
    run = a.out / "runs" / f"{algo}-s{seed}"
    steps = a.samples // ALGOS[algo]
    args = [
        "--preset", algo, f"--train.seed={seed}", f"--max-steps={steps}",
        f"--train.eval_size={a.eval_size}",
    ]  # fmt: skip
    return run, train_command(run, args, every=max(1, steps // 5))


def _record_peak(run: Path, code: int, usage) -> None:
    """The max peak RSS over the run's processes (a resume is another), from `wait4`."""
    peaks = run / "peak_rss.json"
    old = json.loads(peaks.read_text())["peak_rss_mb"] if peaks.exists() else 0.0
    if run.is_dir():
        peaks.write_text(json.dumps({"peak_rss_mb": max(old, usage.ru_maxrss / 1024)}))


def run_all(a: argparse.Namespace) -> None:
    """Every missing run, `a.parallel` at a time; each one's peak RSS from `wait4`."""
    jobs = [_job(algo, seed, a) for seed in range(1, a.seeds + 1) for algo in ALGOS]
    run_missing(jobs, a.parallel, on_exit=_record_peak)


def load_run(run: Path) -> dict | None:
    if not (run / "summary.json").exists():
        return None
    finished = load_metrics(run)
    rows, s = finished.rows, finished.summary
    samples = time_s = 0.0
    curve = [(0, 0.0, s["eval_before"]["accuracy"])]
    for r in rows:
        samples += r.get("responses", 0)
        time_s += r["time/step"]
        if "eval/accuracy" in r:
            curve.append((samples, time_s, r["eval/accuracy"]))
    critic = [r for r in rows if "critic/return_var" in r]
    last_q = critic[len(critic) * 3 // 4 :]
    peak = json.loads((run / "peak_rss.json").read_text())["peak_rss_mb"]
    return {
        "curve": curve,
        "final": s["eval_after"]["accuracy"],
        "before": s["eval_before"]["accuracy"],
        "steps": s["steps"],
        "samples": samples,
        "train_time_s": time_s,
        "step_time_s": time_s / max(len(rows), 1),
        "update_time_s": sum(r["time/update"] + r["time/log_probs"] for r in rows) / len(rows),
        "peak_rss_mb": peak,
        "ev_last_quarter": pooled_explained_variance(last_q) if last_q else None,
        "ev_first_quarter": pooled_explained_variance(critic[: len(critic) // 4])
        if critic
        else None,
    }


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _interp(curve: list[tuple], x: float, axis: int) -> float:
    """Held-out accuracy at x (samples or seconds), linear between evaluations."""
    pts = [(c[axis], c[2]) for c in curve]
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / max(x1 - x0, 1e-9)
    return pts[-1][1]


def plot(results: dict[str, list[dict]], out: Path) -> list[str]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out.mkdir(parents=True, exist_ok=True)
    names = []
    for axis, label, fname in ((0, "generated training responses", "accuracy_vs_samples.png"),
                               (1, "training time (s, evaluation excluded)",
                                "accuracy_vs_time.png")):  # fmt: skip
        fig = Figure(figsize=(6.4, 4.2))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for algo, runs in results.items():
            end = min(r["curve"][-1][axis] for r in runs)
            xs = [end * k / 40 for k in range(41)]
            ys = [[_interp(r["curve"], x, axis) for x in xs] for r in runs]
            mean = [_mean(col) for col in zip(*ys)]
            line = ax.plot(xs, mean, label=f"{algo} ({len(runs)} seeds)")[0]
            ax.fill_between(xs, [min(c) for c in zip(*ys)], [max(c) for c in zip(*ys)],
                            color=line.get_color(), alpha=0.15)  # fmt: skip
        ax.set_xlabel(label)
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        fig.savefig(out / fname, dpi=110, bbox_inches="tight")
        names.append(fname)
    return names


def report(a: argparse.Namespace) -> None:
    results: dict[str, list[dict]] = {}
    for algo in ALGOS:
        for seed in range(1, a.seeds + 1):
            got = load_run(a.out / "runs" / f"{algo}-s{seed}")
            if got is not None:
                results.setdefault(algo, []).append(got)
    if not results:
        print("no finished run yet")
        return
    figs = plot(results, a.docs / "ppo_vs_grpo")
    rows = []
    for algo, runs in results.items():
        ev = [r["ev_last_quarter"] for r in runs if r["ev_last_quarter"] is not None]
        rows.append(
            f"| {algo} | {len(runs)} | {_mean([r['before'] for r in runs]):.3f} | "
            f"{_mean([r['final'] for r in runs]):.3f} "
            f"({min(r['final'] for r in runs):.3f}-{max(r['final'] for r in runs):.3f}) | "
            f"{_mean([r['steps'] for r in runs]):.0f} | {_mean([r['samples'] for r in runs]):.0f} | "
            f"{_mean([r['step_time_s'] for r in runs]):.2f} | "
            f"{_mean([r['train_time_s'] for r in runs]):.0f} | "
            f"{_mean([r['peak_rss_mb'] for r in runs]):.0f} | "
            + (f"{_mean(ev):.3f}" if ev else "-")
            + " |"
        )
    table = "\n".join(
        [
            "| algorithm | seeds | held-out before | held-out after (min-max) | steps | "
            "responses | s/step | train s | peak RSS MB | critic EV, last quarter (pooled) |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    (a.out / "table.md").write_text(table + "\n")
    (a.out / "results.json").write_text(json.dumps(results, indent=1))
    print(table)
    print("figures:", ", ".join(figs))


def main() -> None:
    a = _args()
    if not a.report_only:
        run_all(a)
    report(a)


if __name__ == "__main__":
    main()
