"""Each built-in task's default run (`rlvr train --data.task=T --seed S`) over seeds and CPU
roundings: held-out accuracy before and after, and wall time. One run at a time, torch's
default threads. The roundings: this host's own, and an AVX2 host's (`avx2`): torch's kernels
under `ATEN_CPU_CAPABILITY=avx2` and rlvr's C kernels (rlvr.cpu.native, built with
-march=native) built for x86-64-v3 instead, by a `$CC` that swaps the flag, in their own cache.
rlvr's C kernels do most of the arithmetic (generation, linear layers, attention), so
`ATEN_CPU_CAPABILITY` alone leaves a run nearly unchanged (chain's seed-0 run is the same at
every evaluation to step 300).

    python bench/task_margin.py                        # 4 tasks x seeds 0-2 x {default, avx2}
    python bench/task_margin.py --tasks chain --seeds 0 --eval-every 20 -- --optim.lr=3e-4

Runs go to WORK/<task>-<capability>-s<seed> and a finished one (summary.json) is not run
again. Each run's row goes into OUT (bench/results/task_margin.json; a row of the same task,
seed, rounding and arguments is replaced, the others kept), with the min / mean / max held-out
accuracy after of each task and arguments. Arguments after `--` go to every run (then pick
another --work); `--eval-every N` adds the held-out accuracy every N steps (each prompt samples
from its own seed, so the training is the same; the time is not). `generated_tokens` measures
a run's work where the machine's load makes its seconds unreliable."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

TASKS = ["arithmetic", "chain", "sort", "calc"]


def host_cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def avx2_env(work: Path) -> dict[str, str]:
    """The environment of an AVX2 host's rounding: torch's AVX2 kernels, and rlvr's C kernels
    built by a compiler wrapper that turns -march=native into -march=x86-64-v3."""
    cc = work / "cc-x86-64-v3"
    if not cc.exists():
        work.mkdir(parents=True, exist_ok=True)
        gcc = shutil.which("gcc") or shutil.which("cc")
        cc.write_text(
            '#!/bin/bash\nargs=()\nfor a in "$@"; do\n'
            '  [ "$a" = -march=native ] && a=-march=x86-64-v3\n  args+=("$a")\ndone\n'
            f'exec {gcc} "${{args[@]}}"\n'
        )
        cc.chmod(0o755)
    return {"ATEN_CPU_CAPABILITY": "avx2", "CC": str(cc), "RLVR_CACHE_DIR": str(work / "cache")}


def run_one(run: Path, task: str, seed: int, capability: str, extra: list[str]) -> dict:
    """The run's row, training it first unless `run` holds a summary.json."""
    if not (run / "summary.json").exists():
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        for key in ("ATEN_CPU_CAPABILITY", "CC", "RLVR_CACHE_DIR"):
            env.pop(key, None)
        if capability == "avx2":
            env.update(avx2_env(run.parent))
        cmd = [sys.executable, "-m", "rlvr", "train", f"--data.task={task}", "--seed", str(seed)]
        cmd += [*extra, "--output-dir", str(run), "--no-progress"]
        run.parent.mkdir(parents=True, exist_ok=True)
        with open(run.parent / f"{run.name}.log", "w") as log:
            subprocess.run(cmd, stdout=log, stderr=log, env=env, check=True)
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    row = {
        "task": task,
        "seed": seed,
        "capability": capability,
        "steps": summary["steps"],
        "before": summary["eval_before"]["accuracy"],
        "after": summary["eval_after"]["accuracy"],
        "seconds": round(summary["wall_time_s"], 1),
        "step_seconds": round(sum(r["time/step"] for r in rows), 1),
        "generated_tokens": int(sum(r["generated_tokens"] for r in rows)),
    }
    curve = [[r["step"], r["eval/accuracy"]] for r in rows if "eval/accuracy" in r]
    if curve:
        row["held_out_curve"] = curve
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=TASKS, choices=TASKS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    caps = ["default", "avx2"]
    p.add_argument("--capabilities", nargs="+", default=caps, choices=caps)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path("/tmp/task_margin"))
    p.add_argument("--out", type=Path, default=Path("bench/results/task_margin.json"))
    p.add_argument("extra", nargs="*", help="after --: arguments for every run")
    a = p.parse_args()
    evaluate = [f"--train.eval_every={a.eval_every}"] if a.eval_every else []

    import torch

    old = json.loads(a.out.read_text())["runs"] if a.out.exists() else []
    results = {(r["task"], r["seed"], r["capability"], " ".join(r["args"])): r for r in old}
    for task in a.tasks:
        for capability in a.capabilities:
            for seed in a.seeds:
                run = a.work / f"{task}-{capability}-s{seed}"
                row = {**run_one(run, task, seed, capability, evaluate + a.extra), "args": a.extra}
                results[task, seed, capability, " ".join(a.extra)] = row
                print(
                    f"{task} {capability} seed {seed}: {row['before']:.3f} -> {row['after']:.3f}"
                    f" ({row['seconds']} s)",
                    flush=True,
                )
    groups: dict[str, list[float]] = {}
    for (task, _, _, args), row in sorted(results.items()):
        groups.setdefault(f"{task} {args}".strip(), []).append(row["after"])
    out = {
        "host": {"cpu": host_cpu(), "cores": os.cpu_count(), "torch": torch.__version__},
        "host_capability": torch.backends.cpu.get_cpu_capability(),
        "after": {
            k: {"runs": len(v), "min": min(v), "mean": round(statistics.mean(v), 4), "max": max(v)}
            for k, v in groups.items()
        },
        "runs": list(results.values()),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["after"], indent=1))


if __name__ == "__main__":
    main()
