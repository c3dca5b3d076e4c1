"""Gated sandboxes and `run_pipelined`: a jail built ahead of its turn runs nothing until its
gate opens, its wall clock starts then, a gate never opened ends the jail, and a pipeline of
jobs on w workers returns every result in order with at most w programs running at once."""

from __future__ import annotations

import json
import time

import pytest

from rlvr.rewards.code_reward import make_code_reward, run_tests
from rlvr.rewards.sandbox import Limits, PythonRun, SandboxProcess, run_pipelined
from rlvr.rewards.sandbox.reap import _alive

STAMP = "import time\nprint(time.time())\n"  # CLOCK_REALTIME: the same inside the jail


def _gated(source: str, limits: Limits, mode: str = "namespaces") -> SandboxProcess:
    p = SandboxProcess({"main.py": source}, ["main.py"], limits, mode, gated=True)
    p.launch()
    p.wait_ready()
    return p


@pytest.mark.parametrize("mode", ["namespaces", "none"])
def test_a_gated_program_starts_at_go_not_before(mode):
    with _gated(STAMP, Limits(timeout_s=5.0), mode) as p:
        time.sleep(0.4)
        opened = time.time()
        p.go()
        p.stdin.close()
        r = p.finish()
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) >= opened - 0.01


def test_the_wall_clock_starts_at_go():
    # 1 s of waiting at the shut gate, then a program that needs 0.6 s of its 1 s
    with _gated("import time\ntime.sleep(0.6)\nprint('done')\n", Limits(timeout_s=1.0)) as p:
        time.sleep(1.0)
        p.go()
        p.stdin.close()
        r = p.finish()
    assert not r.timed_out and r.stdout.strip() == "done", (r.timed_out, r.stderr)


def test_a_gate_never_opened_ends_the_jail_and_runs_nothing():
    p = _gated("open('/tmp/ran', 'w')\nimport time\ntime.sleep(30)\n", Limits(timeout_s=30.0))
    init = int(p._line(b"pid").split()[1])
    t = time.monotonic()
    p.close()
    assert time.monotonic() - t < 5.0
    assert not _alive(p.proc.pid) and not _alive(init)


def test_a_pipeline_returns_every_result_in_order_and_runs_at_most_w_at_once():
    source = "import sys, time\nt0 = time.time()\ntime.sleep(0.15)\nprint(sys.stdin.read(), t0, time.time())\n"
    jobs = [lambda i=i: PythonRun({"main.py": source}, ["main.py"], str(i), Limits(5.0),
                                  "namespaces") for i in range(8)]  # fmt: skip
    results = run_pipelined(jobs, 2)
    assert [r.stdout.split()[0] for r in results] == [str(i) for i in range(8)]
    spans = [tuple(map(float, r.stdout.split()[1:])) for r in results]
    for start, _ in spans:  # how many programs ran at each program's start
        assert sum(a <= start < b for a, b in spans) <= 2


class _Failing:
    def run(self):
        raise RuntimeError("this job fails")

    def close(self):
        pass


def test_a_failing_job_raises_after_the_others_closed():
    closed = []

    class Job(_Failing):
        def run(self):
            return 1

        def close(self):
            closed.append(self)

    with pytest.raises(RuntimeError, match="this job fails"):
        run_pipelined([Job, _Failing, Job, Job], 1)
    assert len(closed) == 2  # the one before the failure and the one launched beside it


def test_pipelined_scores_equal_one_at_a_time_scores():
    add = "def add(a, b):\n    return a + b\n"
    wrong = "def add(a, b):\n    return a - b\n"
    echo = "print(input()[::-1])\n"
    stdio = json.dumps({"inputs": ["ab", "xyz", "q"], "outputs": ["ba", "zyx", "x"]})
    asserts = json.dumps(
        ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]
    )
    cases = [(add, asserts), (wrong, asserts), (echo, stdio), ("pass\n", stdio)]
    reward = make_code_reward(workers=2, require_fence=False)
    got = reward([c for c, _ in cases], tests=[t for _, t in cases])
    one_by_one = [p / n for p, n in (run_tests(c, t) for c, t in cases)]
    assert got == one_by_one == [1.0, 1 / 3, 2 / 3, 0.0]
