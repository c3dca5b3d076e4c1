"""A long run stays flat: resident memory, descriptors, threads, processes, /dev/shm files and
sandbox cgroups do not grow over a long `rlvr train`, and nothing is left once it exits.

    python bench/soak.py                          # 2,000 grpo steps, then 500 code steps
    python bench/soak.py --steps 20 --code-steps 0 --interval 1   # a smoke test, ~1 min idle

Two runs, one after the other, each `python -m rlvr train` in a child process of its own
session: `--preset grpo` on the default task (arithmetic; the default dapo preset's dynamic
sampling changes the work once the task is solved, grpo's stays the same), and the code task
of `tests/test_code_learns.py` (`_code_task.py`: a warmed rlvr-tiny, HumanEval-style rows, the
`code` reward running every completion in the sandbox). Each child gets a private TMPDIR so
the temporary directories it leaves are its own.

Every `--interval` seconds this process reads (`_soak_probe.py`, /proc only) the run's
resident memory (trainer + every descendant, and the trainer alone), open descriptors,
threads, processes below the trainer (the sandbox's zygote, launchers, inits and programs),
/dev/shm entries made since the run started and the run's sandbox cgroups, each tagged with
the last step in the run's metrics.jsonl.

Verdicts, over a run of N steps (warm-up: the first `--warmup` of them, 10%; windows of
`--window` of them, 10%, at least one step):
  - warm-up end: the samples at steps [warm-up, warm-up + window); end: those at steps
    [N - window, N), up to the last step's metrics line (what follows, the held-out evaluation
    and the final checkpoint, is other work: it opens a file more than the steps do);
  - resident memory is flat when its median at the end is at most (1 + `--rss-tolerance`,
    5%) times its median at warm-up end;
  - a count is flat when its maximum at the end is at most its maximum between warm-up and
    the end window;
  - nothing is left when, within 5 s of the trainer's exit, no process of the run runs
    (seen in a sample, or in its session), no /dev/shm entry made since it started remains,
    none of its cgroups remains, and its TMPDIR is empty but for the per-user cache
    directories of rlvr's C kernels and torch's inductor (`caches`).
A /dev/shm entry counts as the run's once one of its processes is seen holding it: the
directory is the machine's, and other processes make entries in it too.
The exit status is 1 when a run fails, a verdict fails or something is left. `--out` gets
every sample as JSON, `--results` the verdicts, what was left and a thinned trace;
`--report-only` judges `--out` again without running anything.

Measured on the project's 2-core machine (docs/results/reliability.md, "A long run stays
flat"): every resource flat in both runs and nothing left; the grpo trainer held 698.7 MiB at
warm-up end and 708.8 at the end (limit 733.6), the code run's trainer 626.8 and 617.8.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _code_task import train_args as code_args  # noqa: E402
from _soak_probe import Probe, shm_names  # noqa: E402

MEMORY = ("rss_mib", "trainer_rss_mib")
COUNTS = ("fds", "threads", "children", "shm_files", "cgroups")
LEFT = ("processes", "shm_files", "cgroups", "temp")
SETTLE_S = 5.0


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--steps", type=int, default=2000, help="grpo steps on the default task (0: skip)"
    )
    p.add_argument("--code-steps", type=int, default=500, help="code task steps (0: skip)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=0.1, help="share of steps not judged")
    p.add_argument("--window", type=float, default=0.1, help="share of steps a window spans")
    p.add_argument("--rss-tolerance", type=float, default=0.05)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "soak", help="run directories")
    p.add_argument("--out", type=Path, default=None, help="every sample (default WORK/soak.json)")
    p.add_argument("--results", type=Path, default=HERE / "results" / "soak.json",
                   help="verdicts, leftovers and a thinned trace of each run")  # fmt: skip
    p.add_argument("--report-only", action="store_true", help="judge --out again, run nothing")
    return p.parse_args(argv)


class Steps:
    """The last step a run's metrics.jsonl records, read a little more each call."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.buf, self.step = path, 0, b"", 0

    def read(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.step
        self.offset += len(data)
        *lines, self.buf = (self.buf + data).split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self.step = max(self.step, int(json.loads(line)["step"]))
        return self.step


def train_command(argv: list[str], steps: int, run: Path) -> list[str]:
    return [sys.executable, "-m", "rlvr", "train", *argv, f"--max-steps={steps}",
            "--output-dir", str(run), "--no-progress"]  # fmt: skip


def run_one(name: str, cmd: list[str], run: Path, a: argparse.Namespace) -> dict:
    """Run `cmd`, a trainer writing `run`/metrics.jsonl, with a TMPDIR of its own, sampling it
    every `a.interval` seconds; its exit code, wall time, samples and what it left."""
    shutil.rmtree(run, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"rlvr-soak-{name}-"))
    tmp.chmod(0o711)  # a sandbox's jail init (another uid) must reach its directory in here
    shm_before, t0 = shm_names(), time.monotonic()
    with open(a.work / f"{name}.log", "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "TMPDIR": str(tmp)})  # fmt: skip
    probe = Probe(proc.pid, shm_before)
    samples = sample_until_exit(proc, probe, Steps(run / "metrics.jsonl"), name, a)
    wall = time.monotonic() - t0
    left = settle(probe, proc.pid)
    names = sorted(p.name for p in tmp.iterdir())
    left["temp"] = [n for n in names if n not in caches()]
    left["temp_caches"] = [n for n in names if n in caches()]
    shutil.rmtree(tmp, ignore_errors=True)
    return {"name": name, "command": cmd, "exit_code": proc.returncode,
            "wall_s": round(wall, 1), "samples": samples, "left": left}  # fmt: skip


def sample_until_exit(proc, probe: Probe, progress: Steps, name: str, a) -> list[dict]:
    """A sample every `a.interval` seconds until `proc` exits, each with its time since the
    start and the step reached; also appended to WORK/<name>.samples.jsonl as it comes."""
    samples, t0 = [], time.monotonic()
    with open(a.work / f"{name}.samples.jsonl", "w") as kept:
        while proc.poll() is None:
            s = probe.sample()
            if s["trainer_rss_mib"] > 0:  # 0: it exited while being read
                s = {"t": round(time.monotonic() - t0, 1), "step": progress.read(), **s}
                samples.append(s)
                kept.write(json.dumps(s) + "\n")
                kept.flush()
                if len(samples) % 50 == 0:
                    print(f"{name}: {_line(s)}", flush=True)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=a.interval)
    return samples


def caches() -> tuple[str, ...]:
    """Per-user cache directories made in TMPDIR by design: the C kernels' (`rlvr.cpu.native`)
    and torch's inductor cache (made, empty, when transformers' model classes are imported)."""
    return (f"rlvr-{os.getuid()}", f"torchinductor_{getpass.getuser()}")


def settle(probe: Probe, session: int) -> dict[str, list]:
    """What the run left, given up to SETTLE_S for processes to exit and cgroups to go."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        left = probe.left_behind(session)
        if not (left["processes"] or left["cgroups"]) or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _line(s: dict) -> str:
    return "  ".join(f"{k} {s[k]}" for k in ("step", "t", *MEMORY, *COUNTS))


def verdicts(samples: list[dict], steps: int, a: argparse.Namespace) -> list[dict]:
    """One row per resource: its value at warm-up end and at the end, its maximum after
    warm-up, the rule and whether it holds (None: a window without samples)."""
    start = math.ceil(a.warmup * steps)
    width = max(1, math.ceil(a.window * steps))
    end_from = steps - width
    warm = [s for s in samples if start <= s["step"] < start + width]
    before_end = [s for s in samples if start <= s["step"] < end_from]
    end = [s for s in samples if end_from <= s["step"] < steps]
    after = [s for s in samples if s["step"] >= start]
    rows = []
    for key in (*MEMORY, *COUNTS):
        run_max = max((s[key] for s in after), default=None)
        if key in MEMORY:
            w = statistics.median(s[key] for s in warm) if warm else None
            e = statistics.median(s[key] for s in end) if end else None
            limit = None if w is None else round(w * (1 + a.rss_tolerance), 1)
            rule = f"end median <= {limit} (warm-up end x {1 + a.rss_tolerance:g})"
        else:
            w = max((s[key] for s in warm), default=None)
            e = max((s[key] for s in end), default=None)
            limit = max((s[key] for s in before_end), default=None)
            rule = f"end max <= {limit} (max from warm-up to the end window)"
        ok = None if e is None or limit is None else e <= limit
        rows.append({"resource": key, "warm_up_end": w, "end": e, "max": run_max,
                     "rule": rule, "ok": ok})  # fmt: skip
    return rows


def report(result: dict, rows: list[dict]) -> bool:
    """Print one run's table and leftovers; whether everything holds."""
    left = result["left"]
    print(f"\n{result['name']}: {result['steps']} steps, exit {result['exit_code']}, "
          f"{result['wall_s']:.0f} s, {len(result['samples'])} samples")  # fmt: skip
    print("| resource | warm-up end | end | max after warm-up | rule | verdict |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        verdict = {True: "flat", False: "GROWS", None: "n/a (no samples)"}[r["ok"]]
        print(f"| {r['resource']} | {r['warm_up_end']} | {r['end']} | {r['max']} | "
              f"{r['rule']} | {verdict} |")  # fmt: skip
    clean = not any(left[k] for k in LEFT)
    print("left after exit: " + ("nothing" if clean else json.dumps({k: left[k] for k in LEFT})))
    for key, what in (("shm_others", "/dev/shm entries the run never held (not judged)"),
                      ("temp_caches", "cache directories in its TMPDIR (by design)")):  # fmt: skip
        if left[key]:
            print(f"{what}: {', '.join(left[key])}")
    return result["exit_code"] == 0 and clean and all(r["ok"] is not False for r in rows)


def machine() -> str:
    with open("/proc/cpuinfo") as f:
        model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    return f"{os.cpu_count()} CPUs, {model}"


def measure(a: argparse.Namespace) -> list[dict]:
    """Each run (grpo unless --steps 0, code unless --code-steps 0), sampled."""
    jobs = [("grpo", ["--preset=grpo"], a.steps)] if a.steps else []
    if a.code_steps:
        task = a.work / "code-task"
        if not (task / "warm" / "config.json").exists():
            subprocess.run([sys.executable, str(HERE / "_code_task.py"), str(task)], check=True)
        jobs.append(("code", code_args(task), a.code_steps))
    results = []
    for name, args, steps in jobs:
        run = a.work / name
        results.append({"steps": steps, **run_one(name, train_command(args, steps, run), run, a)})
    return results


def summary(result: dict, rows: list[dict], points: int = 60) -> dict:
    """A run without its samples: verdicts, leftovers and about `points` samples."""
    samples = result["samples"]
    every = max(1, math.ceil(len(samples) / points))
    brief = {k: v for k, v in result.items() if k != "samples"}
    return {**brief, "samples": len(samples), "verdicts": rows, "trace": samples[::every]}


def main(argv=None) -> int:
    a = _args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    a.out = a.out or a.work / "soak.json"
    if not a.report_only:
        record = {"machine": machine(), "argv": sys.argv[1:] if argv is None else argv}
        a.out.write_text(json.dumps({**record, "runs": measure(a)}) + "\n")
    record = json.loads(a.out.read_text())
    ok, runs = True, []
    for result in record["runs"]:
        rows = verdicts(result["samples"], result["steps"], a)
        ok &= report(result, rows)
        runs.append(summary(result, rows))
    a.results.parent.mkdir(parents=True, exist_ok=True)
    a.results.write_text(json.dumps({**record, "runs": runs}, indent=1) + "\n")
    print(f"\n{'all flat, nothing left' if ok else 'FAILED'}; samples in {a.out}, "
          f"verdicts in {a.results}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
