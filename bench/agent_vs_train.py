"""The built-in `arithmetic` task written as an agent function (one chat completion through the
run's OpenAI-compatible endpoint, scored by the task's verifier: tests/agent_funcs.py) against
`rlvr train` on the same settings (the default run: dapo, rlvr-tiny, 100 steps), over seeds:
held-out accuracy before and after (train.eval_size=128), the gain, and wall time.

    python bench/agent_vs_train.py                     # seeds 0-2, both ways
    python bench/agent_vs_train.py --seeds 0 --steps 30

Runs go to WORK/<way>-s<seed>; a finished one (summary.json) is not run again. One run at a
time. Prints one row per run, then each way's mean gain and mean accuracy after, their
difference, and the agent runs' wall time as a ratio of `rlvr train`'s; writes OUT
(bench/results/agent_vs_train.json)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AGENT = f"{ROOT / 'tests' / 'agent_funcs.py'}:arithmetic"


def run_one(way: str, seed: int, steps: int, work: Path) -> dict:
    run = work / f"{way}-s{seed}"
    if not (run / "summary.json").exists():
        cmd = [
            sys.executable,
            "-m",
            "rlvr",
            "train",
            "--seed",
            str(seed),
            "--max-steps",
            str(steps),
        ]
        cmd += ["--train.eval_size=128", "--no-progress", "--output-dir", str(run)]
        if way == "agent":
            cmd += ["--agent", AGENT]
        if run.exists():
            subprocess.run(["rm", "-rf", str(run)], check=True)
        work.mkdir(parents=True, exist_ok=True)
        with open(work / f"{way}-s{seed}.log", "w") as log:
            subprocess.run(cmd, stdout=log, stderr=log, check=True)
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["eval_before"]["accuracy"], summary["eval_after"]["accuracy"]
    return {
        "way": way,
        "seed": seed,
        "steps": steps,
        "before": before,
        "after": after,
        "gain": round(after - before, 4),
        "seconds": round(summary["wall_time_s"], 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--work", type=Path, default=Path("/tmp/rlvr-agent-vs-train"))
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/agent_vs_train.json")
    args = p.parse_args()
    rows = []
    for seed in args.seeds:
        for way in ("train", "agent"):
            row = run_one(way, seed, args.steps, args.work)
            print(json.dumps(row), flush=True)
            rows.append(row)
    mean = {
        way: {
            key: statistics.mean(r[key] for r in rows if r["way"] == way)
            for key in ("gain", "after", "seconds")
        }
        for way in ("train", "agent")
    }
    result = {
        "rows": rows,
        "mean": mean,
        "after_difference": round(mean["agent"]["after"] - mean["train"]["after"], 4),
        "time_ratio": round(mean["agent"]["seconds"] / mean["train"]["seconds"], 2),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
