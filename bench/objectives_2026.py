"""DPPO, GDPO and off-policy sequence masking beside DAPO on the built-in tasks (docs/objectives.md
"The 2026 objectives"): each arm is a built-in task's default run (`rlvr train --data.task=T
--seed S`, the dapo preset, rlvr-tiny) with the arm's changes, run as bench/task_margin.py runs
its rows (one at a time, torch's default threads, no held-out curve), so that its DAPO rows,
bench/results/task_margin.json (arguments none; chain's default lr is the 2e-4 of its
`--optim.lr=2e-4` rows), are the baseline of the arms that change only the objective.

    python bench/objectives_2026.py                          # every arm, arithmetic and chain
    python bench/objectives_2026.py --tasks arithmetic --arms dppo gdpo gdpo-base

Arms:
    dppo        --preset dppo (binary-TV mask 0.15, Dr. GRPO advantage, bypass)
    gdpo-base   DAPO with the R1 format reward at weight 0.2 beside accuracy (+1 / -1)
    gdpo        the same with algo.advantage=gdpo (each reward normalised within its group)
    opsm-base   DAPO at train.max_staleness=2 with token TIS (cap 2)
    opsm        the same with algo.off_policy_mask_threshold=0.01

Runs go to WORK/<task>-<arm>-s<seed>; a finished one (summary.json) is not run again. Rows go
to OUT (bench/results/objectives_2026.json), with the run-means of each arm's own metrics.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from task_margin import run_one

ROOT = Path(__file__).resolve().parent.parent
STALE = ["--train.max_staleness=2", "--algo.rollout_correction=token", "--algo.rollout_is_cap=2"]
FORMAT = ["--reward.format_weight=0.2"]
ARMS: dict[str, list[str]] = {
    "dppo": ["--preset", "dppo"],
    "gdpo-base": FORMAT,
    "gdpo": [*FORMAT, "--algo.advantage=gdpo"],
    "opsm-base": STALE,
    "opsm": [*STALE, "--algo.off_policy_mask_threshold=0.01"],
}
METRICS = (
    "dppo_masked_frac",
    "rollout/off_policy_masked_frac",
    "rollout/off_policy_seq_kl",
    "rewards/format/mean",
    "entropy",
)
BASELINE = {"arithmetic": [], "chain": ["--optim.lr=2e-4"]}  # task_margin.json's DAPO rows


def run_means(run: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    out = {}
    for key in METRICS:
        xs = [r[key] for r in rows if key in r]
        if xs:
            out[key] = statistics.mean(xs)
    return out


def dapo_rows(task: str) -> list[dict]:
    path = ROOT / "bench" / "results" / "task_margin.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    return [
        r
        for r in runs
        if r["task"] == task and r["capability"] == "default" and r["args"] == BASELINE[task]
    ]


def table(rows: list[dict]) -> str:
    lines = ["| task | arm | seeds | after (mean ± sd) | per seed | run-mean metrics |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["arm"]), []).append(r)
    for (task, arm), rs in sorted(groups.items()):
        after = [r["after"] for r in sorted(rs, key=lambda r: r["seed"])]
        sd = f" ± {statistics.stdev(after):.3f}" if len(after) > 1 else ""
        keys = sorted({k for r in rs for k in r.get("means", {})})
        means = ", ".join(
            f"{k} {statistics.mean(r['means'][k] for r in rs if k in r['means']):.4f}" for k in keys
        )
        lines.append(
            f"| {task} | {arm} | {len(rs)} | {statistics.mean(after):.3f}{sd} | "
            f"{', '.join(f'{x:.3f}' for x in after)} | {means or '-'} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=["arithmetic", "chain"], choices=list(BASELINE))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--work", type=Path, default=Path("/tmp/objectives_2026"))
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "objectives_2026.json")
    a = p.parse_args()
    old = json.loads(a.out.read_text())["runs"] if a.out.exists() else []
    results = {(r["task"], r["arm"], r["seed"]): r for r in old}
    for task in a.tasks:
        for arm in a.arms:
            for seed in a.seeds:
                run = a.work / f"{task}-{arm}-s{seed}"
                row = {**run_one(run, task, seed, "default", ARMS[arm]), "arm": arm}
                row["means"] = run_means(run)
                row["args"] = ARMS[arm]
                results[task, arm, seed] = row
                print(f"{task} {arm} seed {seed}: {row['before']:.3f} -> {row['after']:.3f}"
                      f" ({row['seconds']} s)", flush=True)  # fmt: skip
                a.out.parent.mkdir(parents=True, exist_ok=True)
                a.out.write_text(json.dumps({"runs": list(results.values())}, indent=1) + "\n")
    dapo = [{**r, "arm": "dapo (task_margin.json)"} for task in a.tasks for r in dapo_rows(task)]
    print(table(dapo + list(results.values())))


if __name__ == "__main__":
    main()
