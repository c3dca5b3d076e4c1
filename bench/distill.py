"""On-policy distillation against GRPO and DAPO from the same student: held-out accuracy against
generated training tokens and training time, and the tokens each needs to reach a target.

    python bench/distill.py                        # runs missing runs, then writes the results
    python bench/distill.py --report-only          # the table and figures from what finished
    python bench/distill.py --seeds 1 --out /tmp/x # one seed

The teacher is the default run's checkpoint (`rlvr train` with no arguments: DAPO on the
arithmetic task, rlvr-tiny, seed 0), trained once into OUT/teacher. The student is the built-in
model for every arm, each `rlvr train --preset NAME` with the tiny defaults (opd: lr 2e-4, 60
steps; grpo and dapo: lr 4e-4, 100 steps), seeds 1..N, one thread, `--parallel` runs at a time.
Held-out accuracy (train.eval_size prompts, one sample each at temperature 1) is measured before
training and every `--every` steps. Tokens are the generated training tokens (`generated_tokens`,
dynamic sampling's refills included), time the sum of `time/step` (generation, log-probs (the
teacher's included), update; evaluation excluded).

Resumable: a run with a summary.json is done and kept, an interrupted one is continued with
`rlvr train --resume`. Output: OUT/runs/<arm>-s<seed>/, OUT/results.json, OUT/table.md, and
with --docs the figures docs/distillation/*.png and docs/distillation/results.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _runs import mean_sd, run_missing, train_command

from rlvr.cli.plot import load_run as load_metrics

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("opd", "grpo", "dapo")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--every", type=int, default=5, help="steps between held-out evaluations")
    p.add_argument("--target", type=float, default=0.91, help="held-out accuracy to reach")
    p.add_argument("--parallel", type=int, default=2, help="runs at a time")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "distill")
    p.add_argument("--docs", type=Path, default=None, help="write figures and results.json here")
    p.add_argument("--report-only", action="store_true")
    return p.parse_args()


def _teacher(a: argparse.Namespace) -> Path:
    """The default run, once: its run directory is the teacher (its newest checkpoint)."""
    run = a.out / "teacher"
    if not (run / "summary.json").exists():
        run.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "rlvr", "train", "--output-dir", str(run), "--no-progress"]
        subprocess.run(cmd, check=True)
    return run


def _job(arm: str, seed: int, teacher: Path, a) -> tuple[Path, list[str]]:
    run = a.out / "runs" / f"{arm}-s{seed}"
    args = ["--preset", arm, f"--train.seed={seed}"]
    if arm == "opd":
        args.append(f"--algo.teacher={teacher}")
    return run, train_command(run, args, every=a.every)


def load_run(run: Path) -> dict | None:
    """The run's curve [(tokens, seconds, held-out accuracy)], from its metrics and summary."""
    if not (run / "summary.json").exists():
        return None
    finished = load_metrics(run)
    s = finished.summary
    tokens = time_s = 0.0
    curve = [(0.0, 0.0, s["eval_before"]["accuracy"])]
    for r in finished.rows:
        tokens += r["generated_tokens"]
        time_s += r["time/step"]
        if "eval/accuracy" in r:
            curve.append((tokens, time_s, r["eval/accuracy"]))
    return {
        "curve": curve,
        "before": s["eval_before"]["accuracy"],
        "final": s["eval_after"]["accuracy"],
        "steps": s["steps"],
        "tokens": tokens,
        "train_time_s": time_s,
        "step_time_s": time_s / max(len(finished.rows), 1),
    }


def first_reaching(curve: list, target: float, axis: int, hold: int = 1) -> float | None:
    """Tokens (axis 0) or seconds (axis 1) at the first evaluation at or above `target` that
    the next `hold - 1` evaluations also reach (hold = 1: the first touch)."""
    for i in range(len(curve) - hold + 1):
        if all(c[2] >= target for c in curve[i : i + hold]):
            return curve[i][axis]
    return None


def _interp(curve: list, x: float, axis: int) -> float:
    pts = [(c[axis], c[2]) for c in curve]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / max(x1 - x0, 1e-9)
    return pts[-1][1] if x > pts[-1][0] else pts[0][1]


def plot(results: dict[str, list[dict]], out: Path, target: float) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out.mkdir(parents=True, exist_ok=True)
    for axis, label, name in ((0, "generated training tokens", "accuracy_vs_tokens.png"),
                              (1, "training time (s, evaluation excluded)",
                               "accuracy_vs_time.png")):  # fmt: skip
        fig = Figure(figsize=(6.4, 4.2))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for arm, runs in results.items():
            end = min(r["curve"][-1][axis] for r in runs)
            xs = [end * k / 60 for k in range(61)]
            ys = [[_interp(r["curve"], x, axis) for x in xs] for r in runs]
            line = ax.plot(xs, [sum(c) / len(c) for c in zip(*ys)],
                           label=f"{arm} ({len(runs)} seeds)")[0]  # fmt: skip
            ax.fill_between(xs, [min(c) for c in zip(*ys)], [max(c) for c in zip(*ys)],
                            color=line.get_color(), alpha=0.15)  # fmt: skip
        ax.axhline(target, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(label)
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(0.3, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        fig.savefig(out / name, dpi=110, bbox_inches="tight")


def report(a: argparse.Namespace) -> None:
    results = {}
    for arm in ARMS:
        runs = [load_run(a.out / "runs" / f"{arm}-s{s}") for s in range(1, a.seeds + 1)]
        if any(runs):
            results[arm] = [r for r in runs if r]
    if not results:
        print("no finished run yet")
        return
    rows = [
        "| arm | seeds | held-out before | held-out after | best | tokens to "
        f"{a.target} | tokens to hold {a.target} (3 evaluations) | seconds to hold it | "
        "tokens in run | s/step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, runs in results.items():
        reach = [first_reaching(r["curve"], a.target, 0) for r in runs]
        held = [first_reaching(r["curve"], a.target, 0, hold=3) for r in runs]
        secs = [first_reaching(r["curve"], a.target, 1, hold=3) for r in runs]
        hit, kept = [x for x in reach if x is not None], [x for x in held if x is not None]
        rows.append(
            f"| {arm} | {len(runs)} | {mean_sd([r['before'] for r in runs])} | "
            f"{mean_sd([r['final'] for r in runs])} | "
            f"{mean_sd([max(c[2] for c in r['curve']) for r in runs])} | "
            f"{mean_sd(hit, ',.0f')} ({len(hit)}/{len(runs)}) | "
            f"{mean_sd(kept, ',.0f')} ({len(kept)}/{len(runs)}) | "
            f"{mean_sd([x for x in secs if x is not None], '.0f')} | "
            f"{mean_sd([r['tokens'] for r in runs], ',.0f')} | "
            f"{mean_sd([r['step_time_s'] for r in runs], '.2f')} |"
        )
    table = "\n".join(rows)
    (a.out / "table.md").write_text(table + "\n")
    payload = {"target": a.target, "every": a.every, "results": results}
    (a.out / "results.json").write_text(json.dumps(payload, indent=1))
    if a.docs is not None:
        plot(results, a.docs, a.target)
        (a.docs / "results.json").write_text(json.dumps(payload, indent=1))
    print(table)


def main() -> None:
    a = _args()
    if not a.report_only:
        teacher = _teacher(a)
        jobs = [_job(arm, s, teacher, a) for s in range(1, a.seeds + 1) for arm in ARMS]
        run_missing(jobs, a.parallel)
    report(a)


if __name__ == "__main__":
    main()
