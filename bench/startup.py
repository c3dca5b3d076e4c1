"""How fast the command line answers: `rlvr --help`, `rlvr train --help`, `rlvr eval --help` and
`rlvr config show`, each a fresh process, against `python -c "import torch"` (what a command
that imported torch would pay before anything else) and, when the bench extra is installed,
TRL's own command line (`trl --help`), side by side.

    python bench/startup.py              # 7 runs each, interleaved; medians and ranges
    python bench/startup.py --runs 15

Measure on an idle machine: a command's start is mostly reading and compiling modules, which
another process on the same cores slows several times.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

PY = sys.executable
COMMANDS = {
    "rlvr --help": [PY, "-m", "rlvr", "--help"],
    "rlvr train --help": [PY, "-m", "rlvr", "train", "--help"],
    "rlvr eval --help": [PY, "-m", "rlvr", "eval", "--help"],
    "rlvr config show": [PY, "-m", "rlvr", "config", "show"],
    "import torch": [PY, "-c", "import torch"],
}


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=300
    )
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args()
    commands = dict(COMMANDS)
    if shutil.which("trl"):
        commands["trl --help (peer)"] = ["trl", "--help"]
    for cmd in commands.values():  # warm the page cache and the bytecode
        timed(cmd)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):  # interleaved, so a slow moment touches every command alike
        for name, cmd in commands.items():
            times[name].append(timed(cmd))
    torch_s = statistics.median(times["import torch"])
    print(f"{'command':<22} {'median s':>9} {'min..max s':>13} {'/ import torch':>15}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<22} {med:>9.2f} {min(ts):>6.2f}..{max(ts):<6.2f} {med / torch_s:>14.2f}x")


if __name__ == "__main__":
    main()
