"""DeepSeekMath's iterative RL on the built-in task: GRPO trained by the rule reward, by a
frozen reward model trained from rule judgments, and by that model refreshed every M steps
with replay while the KL reference is reset (docs/iterative_rl.md).

    python bench/iterative_rl.py                  # runs what is missing, then writes the page's numbers
    python bench/iterative_rl.py --report-only    # the table and figures from what finished
    python bench/iterative_rl.py --seeds 1 --steps 4 --out /tmp/x   # test the script

First `rlvr rm` trains one reward model (OUT/rm) on the built-in model's own responses at
T = 1, labelled by the task's rule; then every arm runs `rlvr train --preset grpo` (KL 0.04 to
the reference) on rlvr-tiny and the arithmetic task with its tiny defaults, one thread, seeds
1..N:

    rule        the rule's reward (the task's verifier)
    frozen_rm   reward.model = OUT/rm: the model's probability of "correct" instead
    iterative   the same model, refreshed every --refresh-every steps on the iteration's
                rule-labelled responses plus 10% of the history, the reference reset after each

Held-out accuracy is judged by the rule in every arm (train.eval_size prompts, one sample each
at T = 1, every --eval-every steps); `rm/agreement` is the share of each step's training
responses on which the reward model's verdict (logit > 0) is the rule's.

Resumable: the reward model and each run continue from their newest checkpoints when the
command is run again; finished runs (summary.json) are kept; the table and figures are
rewritten from every finished run. Output: OUT/ (default runs/iterative_rl), docs/iterative_rl/*.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from rlvr.cli.plot import load_run as load_metrics

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("rule", "frozen_rm", "iterative")
COLORS = {"rule": "tab:blue", "frozen_rm": "tab:orange", "iterative": "tab:green"}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--refresh-every", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-size", type=int, default=128)
    p.add_argument("--rm-prompts", type=int, default=1024, help="rlvr rm's training prompts")
    p.add_argument("--rm-epochs", type=int, default=3)
    p.add_argument("--parallel", type=int, default=2, help="runs at a time (one thread each)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "iterative_rl")
    p.add_argument("--docs", type=Path, default=ROOT / "docs")
    p.add_argument("--report-only", action="store_true")
    return p.parse_args()


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def train_rm(a: argparse.Namespace) -> Path:
    rm = a.out / "rm"
    if (rm / "summary.json").exists():
        return rm
    if (rm / "rm.yaml").exists():
        cmd = [sys.executable, "-m", "rlvr", "rm", "--resume", str(rm), "--no-progress"]
    else:
        cmd = [sys.executable, "-m", "rlvr", "rm", "--output-dir", str(rm), "--no-progress",
               "--train.threads=1", f"--rm.train_prompts={a.rm_prompts}",
               f"--rm.epochs={a.rm_epochs}", f"--rm.eval_prompts={a.eval_size}"]  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "rm.log", "a") as log:
        subprocess.run(cmd, stdout=log, stderr=log, env=_env(), check=True)
    return rm


def _command(arm: str, seed: int, run: Path, rm: Path, a: argparse.Namespace) -> list[str]:
    if (run / "checkpoints").is_dir():
        return [sys.executable, "-m", "rlvr", "train", "--resume", str(run), "--no-progress"]
    extra = {
        "rule": [],
        "frozen_rm": [f"--reward.model={rm}"],
        "iterative": [f"--reward.model={rm}", f"--reward.model_refresh_every={a.refresh_every}"],
    }[arm]
    return [
        sys.executable, "-m", "rlvr", "train", "--preset", "grpo", *extra,
        f"--train.seed={seed}",
        f"--max-steps={a.steps}",
        f"--train.eval_size={a.eval_size}",
        f"--train.eval_every={a.eval_every}",
        "--train.threads=1",
        "--save-every", str(a.eval_every),
        "--output-dir", str(run),
        "--no-progress",
    ]  # fmt: skip


def run_all(a: argparse.Namespace, rm: Path) -> None:
    """Every missing run, `a.parallel` at a time."""
    (a.out / "runs").mkdir(parents=True, exist_ok=True)
    todo = [
        (arm, seed)
        for seed in range(1, a.seeds + 1)
        for arm in ARMS
        if not (a.out / "runs" / f"{arm}-s{seed}" / "summary.json").exists()
    ]
    live: dict[int, Path] = {}
    while todo or live:
        while todo and len(live) < a.parallel:
            arm, seed = todo.pop(0)
            run = a.out / "runs" / f"{arm}-s{seed}"
            with open(a.out / "runs" / f"{arm}-s{seed}.log", "a") as log:
                cmd = _command(arm, seed, run, rm, a)
                live[subprocess.Popen(cmd, stdout=log, stderr=log, env=_env()).pid] = run
        pid, status = os.wait()
        run = live.pop(pid, None)
        if run is not None:
            print(f"{run.name}: exit {os.waitstatus_to_exitcode(status)}", flush=True)


def load_run(run: Path) -> dict | None:
    if not (run / "summary.json").exists():
        return None
    finished = load_metrics(run)
    rows, s = finished.rows, finished.summary
    curve = [(0, s["eval_before"]["accuracy"])]
    curve += [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    agreement = [(r["step"], r["rm/agreement"]) for r in rows if "rm/agreement" in r]
    ranking = [(r["step"], r["rm/auc"]) for r in rows if "rm/auc" in r]
    train_acc = [(r["step"], r["accuracy"]) for r in rows]
    rm_reward = [(r["step"], r["reward/model"]) for r in rows if "reward/model" in r]
    time_s = sum(r["time/step"] for r in rows)
    return {
        "curve": curve,
        "agreement": agreement,
        "rm_auc": ranking,
        "train_accuracy": train_acc,
        "rm_reward": rm_reward,
        "final": s["eval_after"]["accuracy"],
        "before": s["eval_before"]["accuracy"],
        "steps": s["steps"],
        "train_time_s": time_s,
        "step_time_s": time_s / max(len(rows), 1),
        "scoring_time_s": sum(r["time/scoring"] for r in rows) / max(len(rows), 1),
        "refresh_steps": [r["step"] for r in rows if r.get("rm/refresh")],
        "refresh_time_s": sum(r.get("time/rm_refresh", 0.0) for r in rows),
        "wall_time_s": s["wall_time_s"],
    }


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _band(ax, runs: list[dict], key: str, label: str) -> None:
    steps = sorted({st for r in runs for st, _ in r[key]})
    by_step = [[v for r in runs for st, v in r[key] if st == s] for s in steps]
    mean = [_mean(v) for v in by_step]
    line = ax.plot(steps, mean, label=f"{label} ({len(runs)} seeds)", color=COLORS[label])[0]
    if len(runs) > 1:
        ax.fill_between(steps, [min(v) for v in by_step], [max(v) for v in by_step],
                        color=line.get_color(), alpha=0.15, linewidth=0)  # fmt: skip


def plot(results: dict[str, list[dict]], out: Path) -> list[str]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out.mkdir(parents=True, exist_ok=True)
    figures = (
        ("curve", "held-out accuracy (rule)", "accuracy.png", ARMS),
        ("train_accuracy", "training-batch accuracy (rule)", "train_accuracy.png", ARMS),
        ("agreement", "rm/agreement (RM verdict = rule verdict)", "agreement.png",
         ("frozen_rm", "iterative")),
        ("rm_reward", "reward/model: mean RM probability of correct", "rm_reward.png",
         ("frozen_rm", "iterative")),
        ("rm_auc", "rm/auc: RM ranking of the step's responses (rule labels)", "rm_auc.png",
         ("frozen_rm", "iterative")),
    )  # fmt: skip
    names = []
    for key, ylabel, fname, arms in figures:
        fig = Figure(figsize=(6.4, 4.2))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for arm in arms:
            if results.get(arm):
                _band(ax, results[arm], key, arm)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        fig.savefig(out / fname, dpi=110, bbox_inches="tight")
        names.append(fname)
    return names


def report(a: argparse.Namespace) -> None:
    results: dict[str, list[dict]] = {}
    for arm in ARMS:
        for seed in range(1, a.seeds + 1):
            got = load_run(a.out / "runs" / f"{arm}-s{seed}")
            if got is not None:
                results.setdefault(arm, []).append(got)
    rm_summary = a.out / "rm" / "summary.json"
    rm = json.loads(rm_summary.read_text()) if rm_summary.exists() else None
    if rm is not None:
        ev = rm["eval"]
        print(f"reward model: held-out accuracy {ev['accuracy']:.3f}, AUC {ev['auc']}, "
              f"AUC well-formed {ev['auc_well_formed']}, {rm['wall_time_s']:.0f} s")  # fmt: skip
    if not results:
        print("no finished run yet")
        return
    figs = plot(results, a.docs / "iterative_rl")
    rows = []
    for arm, runs in results.items():
        agree = [_mean([v for _, v in r["agreement"]]) for r in runs if r["agreement"]]
        last = [_mean([v for _, v in r["agreement"][-a.refresh_every:]]) for r in runs
                if r["agreement"]]  # fmt: skip
        finals = [r["final"] for r in runs]
        ranked = [v for r in runs for _, v in r["rm_auc"]]
        rows.append(
            f"| {arm} | {len(runs)} | {_mean([r['before'] for r in runs]):.3f} | "
            f"{_mean(finals):.3f} ({min(finals):.3f}-{max(finals):.3f}) | "
            + (f"{_mean(agree):.3f} / {_mean(last):.3f}" if agree else "-")
            + (f" | {_mean(ranked):.3f} ({len(ranked)} steps)" if ranked else " | -")
            + f" | {_mean([r['step_time_s'] for r in runs]):.2f} | "
            f"{_mean([r['scoring_time_s'] for r in runs]):.3f} | "
            f"{_mean([r['wall_time_s'] for r in runs]):.0f} |"
        )
    table = "\n".join(
        [
            "| arm | seeds | held-out before | held-out after (min-max) | rm/agreement: mean / "
            "last iteration | rm/auc | s/step | scoring s/step | wall s |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    (a.out / "table.md").write_text(table + "\n")
    (a.out / "results.json").write_text(json.dumps({"rm": rm, "runs": results}, indent=1))
    print(table)
    print("figures:", ", ".join(figs))


def main() -> None:
    a = _args()
    if not a.report_only:
        run_all(a, train_rm(a))
    report(a)


if __name__ == "__main__":
    main()
