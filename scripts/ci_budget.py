"""Each part of a `.ci/run` log against its budget.

    python scripts/ci_budget.py CI_LOG        (or - for standard input)

`scripts/ci.sh` prints `ci-part: NAME SECONDS s` as each part ends. A submission lands only if
`.ci/run` passes within 90 minutes on a fresh clone on a 2-core machine; the budgets below keep
it under 45 so that the machine's spread and the next capability's tests fit: the fast suite
10 minutes, the slow suite 20, every other part (install, lint and docs, the C-kernels-off
pass, the CPU capabilities, the vLLM venv, the environment venvs) 15 together. Also listed: the
`ci-step:` lines the venv scripts print (install against tests) and the slowest tests pytest
listed (`--durations=15`). Exit status 1 when a budget or the whole 45 minutes is exceeded, or
when the log holds no part line.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

BUDGETS_S = {"fast": 600, "slow": 1200}
REST_BUDGET_S = 900
TOTAL_BUDGET_S = 2700

PART = re.compile(r"^ci-part: (?P<name>\S+) (?P<seconds>\d+) s(?P<failed> \(exit \d+\))?\s*$")
STEP = re.compile(r"^ci-step: (?P<name>.+?) (?P<seconds>\d+) s\s*$")
PART_START = re.compile(r"^== ci part (?P<name>\S+):")
DURATION = re.compile(r"^(?P<seconds>\d+\.\d+)s (?P<when>call|setup|teardown)\s+(?P<test>\S+)")


@dataclass(frozen=True)
class Part:
    name: str
    seconds: int
    failed: bool


def read_parts(lines: list[str]) -> list[Part]:
    """The parts in the order they ended; a part printed twice (each as it ends, then in the
    summary at the end) counts once, the last reading."""
    parts: dict[str, Part] = {}
    for line in lines:
        m = PART.match(line.strip())
        if m:
            parts[m["name"]] = Part(m["name"], int(m["seconds"]), bool(m["failed"]))
    return list(parts.values())


def slowest_tests(lines: list[str], k: int = 15) -> dict[str, list[tuple[float, str]]]:
    """Each part's k slowest test phases, as pytest listed them (`--durations`)."""
    found: dict[str, dict[str, float]] = {}
    part = "(before any part)"
    for line in lines:
        start = PART_START.match(line.strip())
        if start:
            part = start["name"]
        m = DURATION.match(line.strip())
        if m:
            key = f"{m['test']} ({m['when']})"
            tests = found.setdefault(part, {})
            tests[key] = max(tests.get(key, 0.0), float(m["seconds"]))
    return {
        part: sorted(((s, t) for t, s in tests.items()), reverse=True)[:k]
        for part, tests in found.items()
    }


def minutes(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def table(parts: list[Part]) -> tuple[list[str], bool]:
    """The rows of the budget table, and whether every budget holds."""
    rows = ["| part | wall | budget | |", "|---|---|---|---|"]
    ok = True
    rest = [p for p in parts if p.name not in BUDGETS_S]
    for p in parts:
        if p.name in BUDGETS_S:
            within = p.seconds <= BUDGETS_S[p.name] and not p.failed
            ok &= within
            budget = minutes(BUDGETS_S[p.name])
        else:
            within, budget = not p.failed, "(the rest)"
            ok &= within
        mark = "ok" if within else ("FAILED" if p.failed else "OVER")
        rows.append(f"| {p.name} | {minutes(p.seconds)} | {budget} | {mark} |")
    rest_s = sum(p.seconds for p in rest)
    rest_ok = rest_s <= REST_BUDGET_S
    rows.append(
        f"| the rest together | {minutes(rest_s)} | {minutes(REST_BUDGET_S)} | "
        f"{'ok' if rest_ok else 'OVER'} |"
    )
    total = sum(p.seconds for p in parts)
    total_ok = total <= TOTAL_BUDGET_S
    rows.append(
        f"| **total** | {minutes(total)} | {minutes(TOTAL_BUDGET_S)} | "
        f"{'ok' if total_ok else 'OVER'} |"
    )
    return rows, ok and rest_ok and total_ok


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/ci_budget.py CI_LOG   (or - for standard input)")
        return 2
    if argv[0] == "-":
        lines = sys.stdin.read().splitlines()
    else:
        try:
            with open(argv[0], encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError as e:
            print(f"ci_budget: {argv[0]}: cannot read the log ({e.strerror})")
            return 2
    parts = read_parts(lines)
    if not parts:
        print(f"ci_budget: {argv[0]}: no 'ci-part: NAME SECONDS s' line (a log of scripts/ci.sh?)")
        return 1
    rows, ok = table(parts)
    print("\n".join(rows))
    steps = [STEP.match(line.strip()) for line in lines]
    steps = [m for m in steps if m]
    if steps:
        print("\n| step | wall |\n|---|---|")
        for m in steps:
            print(f"| {m['name']} | {minutes(int(m['seconds']))} |")
    for part, slow in slowest_tests(lines).items():
        print(f"\n| {part}: slowest tests | s |\n|---|---|")
        for seconds, test in slow:
            print(f"| `{test}` | {seconds:.1f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
