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
    """'mean ± sample standard deviation' ('mean' alone for one value), each in `spec`."""
    m = format(statistics.mean(xs), spec)
    return f"{m} ± {format(statistics.stdev(xs), spec)}" if len(xs) > 1 else m
