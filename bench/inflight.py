"""Three ways to overlap generation and training on one launched vLLM server: synchronous,
bounded staleness 1 (the batch of step t+1 sampled beside step t's update) and in flight
(`train.inflight_updates`: weights pushed into running requests, the first completed groups
trained, staleness bound 1). Held-out accuracy against steps and wall-clock time, the trainer's
and the server's idle seconds per step, and the version spread of the trained tokens.

    python bench/inflight.py --seeds 3 --steps 30 --eval-every 10 --out runs/inflight

Every run is the default run (rlvr-tiny, arithmetic, the dapo preset) with one server launched
on the second CPU (`rollout.vllm.cpus`) and the trainer on the first, one thread each; runs
are interleaved (seed by seed, every arm in turn) so that load from elsewhere spreads over the
arms. Idle time per step, from each step's metrics:

    trainer idle   sync: time/generation (the trainer waits for the whole batch);
                   staleness 1 and in flight: time/gen_wait (waiting for the batch or groups)
    server idle    sync and staleness 1: time/step - time/generation (no request to serve
                   while the trainer scores, updates and pushes); in flight: time/push_paused
                   (paused for the push; otherwise two steps' groups are always queued)

Output: OUT/<arm>-s<seed>/ (the run directories), OUT/results.json, the table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ARMS: dict[str, list[str]] = {
    "sync": [],
    "staleness-1": ["--train.max_staleness=1", "--algo.rollout_correction=token"],
    "in-flight": [
        "--train.inflight_updates=true",
        "--train.max_staleness=1",
        "--algo.rollout_correction=token",
    ],
}


def run_one(arm: str, seed: int, args, out: Path) -> Path:
    cpus = sorted(os.sched_getaffinity(0))
    run = out / f"{arm}-s{seed}"
    if (run / "summary.json").exists():
        return run
    argv = [sys.executable, "-m", "rlvr", "train", "--data.task=arithmetic",
            f"--max-steps={args.steps}", f"--output-dir={run}", f"--train.seed={seed}",
            f"--train.eval_size={args.eval_size}", f"--train.eval_every={args.eval_every}",
            "--no-progress", "--train.threads=1", "--rollout.engine=vllm",
            "--rollout.vllm.mode=server", "--rollout.vllm.launch=1",
            f"--rollout.vllm.cpus={cpus[-1]}", *ARMS[arm], *args.extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, {cpus[0]}))  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{arm} seed {seed} failed:\n{done.stderr[-3000:]}")
    print(f"{arm} seed {seed}: {time.time() - t0:.0f} s", file=sys.stderr)
    return run


def summarise(arm: str, run: Path) -> dict:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    steps = [r for r in rows if "time/step" in r]
    wall = 0.0
    curve = [(0, 0.0, summary["eval_before"]["accuracy"])]
    for r in steps:
        wall += r["time/step"]
        if "eval/accuracy" in r:
            curve.append((r["step"], wall, r["eval/accuracy"]))
    curve.append((len(steps), wall, summary["eval_after"]["accuracy"]))
    trainer_idle = [r.get("time/gen_wait", 0.0) if arm != "sync" else r["time/generation"]
                    for r in steps]  # fmt: skip
    server_idle = [r.get("time/push_paused", 0.0) if arm == "in-flight"
                   else max(r["time/step"] - r["time/generation"], 0.0) for r in steps]  # fmt: skip
    return {
        "curve": curve,
        "step_s": statistics.mean(r["time/step"] for r in steps),
        "trainer_idle_s": statistics.mean(trainer_idle),
        "server_idle_s": statistics.mean(server_idle),
        "version_spread": statistics.mean(r.get("inflight/version_spread", 0.0) for r in steps),
        "token_lag_mean": statistics.mean(
            r.get("inflight/token_lag_mean", r.get("staleness/mean", 0.0)) for r in steps
        ),
        "dropped": sum(r.get("inflight/dropped", 0.0) for r in steps),
        "length_trained": statistics.mean(
            r.get("inflight/length_trained", r["response/length_mean"]) for r in steps
        ),
        "before": summary["eval_before"]["accuracy"],
        "after": summary["eval_after"]["accuracy"],
        "wall_s": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-size", type=int, default=128)
    p.add_argument("--out", type=Path, default=Path("runs/inflight"))
    p.add_argument("extra", nargs="*", help="more `rlvr train` flags for every arm")
    args = p.parse_args()
    results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for seed in range(args.seeds):  # interleaved: every arm in turn, seed by seed
        for arm in ARMS:
            results[arm].append(summarise(arm, run_one(arm, seed, args, args.out)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    keys = ["before", "after", "wall_s", "step_s", "trainer_idle_s", "server_idle_s",
            "token_lag_mean", "version_spread", "dropped", "length_trained"]  # fmt: skip
    print("| arm | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for arm, runs in results.items():
        cells = [f"{statistics.mean(r[k] for r in runs):.3g}" for k in keys]
        print(f"| {arm} | " + " | ".join(cells) + " |")
    print("\naccuracy against step and wall-clock seconds (mean over seeds):")
    for arm, runs in results.items():
        points = zip(*(r["curve"] for r in runs))
        line = [f"step {pts[0][0]} {statistics.mean(x[1] for x in pts):.0f}s "
                f"{statistics.mean(x[2] for x in pts):.3f}" for pts in points]  # fmt: skip
        print(f"{arm}: " + "; ".join(line))


if __name__ == "__main__":
    main()
