"""What the resumable multi-run benches share (ppo_vs_grpo.py, objectives.py,
rollout_correction.py): the `rlvr train` command of one run, resumed where it left a
checkpoint, and the loop that runs every unfinished run a few at a time."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def train_command(
    run: Path, args: list[str], every: int, python: str = sys.executable
) -> list[str]:
    """`rlvr train ARGS` writing to `run`, evaluating and saving every `every` steps on one
    thread; `--resume run` instead once the run has a checkpoint (its config.yaml holds ARGS)."""
    if (run / "checkpoints").is_dir():
        return [python, "-m", "rlvr", "train", "--resume", str(run), "--no-progress"]
    return [
        python, "-m", "rlvr", "train", *args,
        f"--train.eval_every={every}",
        "--train.threads=1",
        "--save-every", str(every),
        "--output-dir", str(run),
        "--no-progress",
    ]  # fmt: skip


def run_missing(
    jobs: list[tuple[Path, list[str]]],
    parallel: int,
    on_exit: Callable[[Path, int, object], None] | None = None,
) -> None:
    """Each (run directory, command) whose directory holds no summary.json, `parallel` at a
    time in the given order, one thread each (OMP_NUM_THREADS=1), output appended to
    `<run>.log`; `on_exit(run, exit code, rusage)` after each one ends."""
    todo = [(run, cmd) for run, cmd in jobs if not (run / "summary.json").exists()]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    live: dict[int, Path] = {}
    while todo or live:
        while todo and len(live) < parallel:
            run, cmd = todo.pop(0)
            run.parent.mkdir(parents=True, exist_ok=True)
            with open(run.parent / f"{run.name}.log", "a") as log:
                live[subprocess.Popen(cmd, stdout=log, stderr=log, env=env).pid] = run
        pid, status, usage = os.wait4(-1, 0)
        run = live.pop(pid, None)
        if run is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if on_exit is not None:
            on_exit(run, code, usage)
        print(f"{run.name}: exit {code}", flush=True)


def mean_sd(xs: list[float], spec: str = ".3f") -> str:
    """'mean ± sample standard deviation' ('mean' alone for one value, '-' for none), each in
    `spec`."""
    if not xs:
        return "-"
    m = format(statistics.mean(xs), spec)
    return f"{m} ± {format(statistics.stdev(xs), spec)}" if len(xs) > 1 else m


def load_arm_run(run: Path, means: tuple[str, ...]) -> dict | None:
    """`run_summary` of a finished run; None while it has no summary.json."""
    from rlvr.cli.plot import load_run

    if not (run / "summary.json").exists():
        return None
    return run_summary(load_run(run), means)


def run_summary(finished, means: tuple[str, ...]) -> dict:
    """A loaded run's (`rlvr.cli.plot.load_run`) held-out accuracy before and after, its held-out
    curve (step, accuracy), the run-mean of each metric in `means` it logged, steps and wall
    time."""
    rows, s = finished.rows, finished.summary
    curve = [(0, s["eval_before"]["accuracy"])]
    curve += [(i + 1, r["eval/accuracy"]) for i, r in enumerate(rows) if "eval/accuracy" in r]
    logged = {k: [r[k] for r in rows if k in r] for k in means}
    return {
        "before": s["eval_before"]["accuracy"],
        "after": s["eval_after"]["accuracy"],
        "curve": curve,
        "means": {k: statistics.mean(xs) for k, xs in logged.items() if xs},
        "steps": s["steps"],
        "wall_time_s": s["wall_time_s"],
    }


def arm_results(out: Path, arms, seeds: int, means: tuple[str, ...]) -> dict[str, list[dict]]:
    """Every finished OUT/runs/<arm>-s<seed> (seeds 1..`seeds`), by arm."""
    results: dict[str, list[dict]] = {}
    for arm in arms:
        for seed in range(1, seeds + 1):
            got = load_arm_run(out / "runs" / f"{arm}-s{seed}", means)
            if got is not None:
                results.setdefault(arm, []).append(got)
    return results


def arm_table(results: dict[str, list[dict]], columns: list[tuple[str, str, str]]) -> str:
    """Markdown: per arm, seeds, held-out before and after (mean ± sd), each seed's after,
    one column per (header, metric, format) of the run-means, and wall time."""
    head = ["arm", "seeds", "held-out before", "held-out after", "per seed"]
    head += [h for h, _, _ in columns] + ["wall time (s)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, runs in results.items():
        cells = [arm, str(len(runs)), mean_sd([r["before"] for r in runs])]
        cells += [mean_sd([r["after"] for r in runs])]
        cells += [", ".join(format(r["after"], ".3f") for r in runs)]
        for _, key, spec in columns:
            cells.append(mean_sd([r["means"][key] for r in runs if key in r["means"]], spec))
        cells.append(mean_sd([r["wall_time_s"] for r in runs], ".0f"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def arm_bench(a, arms, columns, job: Callable[[str, int], tuple[Path, list[str]]]):
    """The main of an arm x seed bench: the missing runs of `a.arms` x seeds 1..`a.seeds`
    (unless `a.report_only`), `a.parallel` at a time, then OUT/table.md of every finished run,
    printed; returns the results by arm (empty when nothing has finished)."""
    if not a.report_only:
        seeds = range(1, a.seeds + 1)
        run_missing([job(arm, s) for s in seeds for arm in a.arms], a.parallel)
    results = arm_results(a.out, arms, a.seeds, tuple(key for _, key, _ in columns))
    if not results:
        print("no finished run yet")
        return results
    table = arm_table(results, columns)
    (a.out / "table.md").write_text(table + "\n")
    print(table)
    return results


def arm_job(a, arms: dict[str, list[str]], arm: str, seed: int, python: str = sys.executable):
    """(run directory, command) of `arm` at `seed`: the default run with the arm's changes,
    `a.steps` steps when given, held-out accuracy and a checkpoint 5 times a run."""
    run = a.out / "runs" / f"{arm}-s{seed}"
    steps = [f"--max-steps={a.steps}"] if a.steps else []
    every = max(1, (a.steps or 60) // 5)
    return run, train_command(run, [*arms[arm], *steps, f"--train.seed={seed}"], every, python)
