"""One memory and process budget for the whole sandbox (rlvr.rewards.sandbox.budget): as root a
cgroup bounds every process of a program together; without one (the control, and an
unprivileged user without delegation, in test_sandbox_unprivileged.py) the per-process bound
is what holds."""

from __future__ import annotations

import os
import subprocess

import pytest

from rlvr.rewards.code_reward import make_code_reward
from rlvr.rewards.sandbox import Limits, run_python
from rlvr.rewards.sandbox.budget import (
    _mounts,
    _own_cgroups,
    cgroup_bytes,
    kind_here,
    per_process_bound,
)

# Six children of 200 MB each (the pages written, so they are resident), alive together.
CHILDREN = """
import os, time
kids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        b = b"\\1" * (200 << 20)
        time.sleep(1.0)
        os._exit(0)
    kids.append(pid)
print(*[os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids])
"""

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="a cgroup of our own needs root here")


def _memory_base() -> str | None:
    mounts, own = _mounts(), _own_cgroups()
    if "memory" not in mounts or "memory" not in own:
        return None
    return os.path.join(mounts["memory"], own["memory"].lstrip("/"))


def _left_behind() -> list[str]:
    """This process's sandbox cgroups under its memory cgroup."""
    base = _memory_base()
    mine = f"rlvr-sandbox-{os.getpid()}-"
    return [d for d in os.listdir(base) if d.startswith(mine)] if base else []


@as_root
def test_children_of_one_sandbox_share_one_memory_budget():
    """memory_mb=256: each child alone fits its address space, six together (1.2 GB) do not
    fit the sandbox's cgroup of 256 + 16 MB, so the kernel kills some; the peak stays under
    the limit and the cgroup is removed afterwards."""
    lim = Limits(timeout_s=30, memory_mb=256)
    r = run_python(CHILDREN, limits=lim)
    codes = [int(c) for c in r.stdout.split()]
    assert r.returncode == 0 and len(codes) == 6, (r.stdout, r.stderr)
    assert r.budget.startswith("cgroup"), r.budget
    assert codes.count(-9) >= 4 and r.oom_kills >= 4, (codes, r.oom_kills)
    assert r.memory_peak_bytes is not None and r.memory_peak_bytes <= cgroup_bytes(lim)
    assert _left_behind() == []


def test_without_the_cgroup_each_child_is_bounded_alone():
    """The control: the per-process limits alone let all six hold their 200 MB at once (1.2 GB
    in a sandbox of memory_mb=256), within the stated per-process bound."""
    lim = Limits(timeout_s=30, memory_mb=256, cgroup=False)
    r = run_python(CHILDREN, limits=lim)
    assert r.budget == "per-process" and r.memory_peak_bytes is None
    assert r.stdout.split() == ["0"] * 6, (r.stdout, r.stderr)
    assert per_process_bound(lim) >= 6 * (200 << 20)


@as_root
def test_the_cgroup_also_counts_tmp_files():
    """tmpfs pages count in the same budget: 50 /tmp files of 4 MB (200 MB; tmp_mb=512 allows
    them) in a sandbox of memory_mb=64 + tmp_mb=512 fit, and the cgroup's peak holds them."""
    lim = Limits(timeout_s=30, memory_mb=64, tmp_mb=512, max_output_bytes=4 << 20)
    src = """
chunk = b"x" * (4 << 20)
for i in range(50):
    with open(f"/tmp/f{i}", "wb") as f:
        f.write(chunk)
print("wrote")
"""
    r = run_python(src, limits=lim)
    assert r.stdout.strip() == "wrote", r.stderr
    assert r.memory_peak_bytes is not None and r.memory_peak_bytes >= 200 << 20


def test_per_process_bound_by_hand():
    """(max_procs + 1) x (memory_mb + max_open_files x max_output_bytes) + tmp_mb."""
    lim = Limits(memory_mb=100, max_procs=3, max_open_files=10, max_output_bytes=1 << 20, tmp_mb=8)
    assert per_process_bound(lim) == 4 * ((100 << 20) + 10 * (1 << 20)) + (8 << 20)
    assert cgroup_bytes(lim) == 108 << 20


def test_the_code_reward_states_what_its_sandboxes_may_hold():
    """workers x one sandbox's budget: its cgroup's limit where one can be made (root here),
    else the per-process bound; the memory guard adds it (tests/test_memory_guard.py)."""
    lim = Limits(memory_mb=256, max_procs=4)
    fn = make_code_reward(workers=3, memory_mb=256, max_procs=4)
    per_sandbox = cgroup_bytes(lim) if kind_here(lim) != "per-process" else per_process_bound(lim)
    assert fn.sandbox_bytes == 3 * per_sandbox
    if os.geteuid() == 0:
        assert kind_here(lim).startswith("cgroup") and fn.sandbox_bytes == 3 * (272 << 20)


@as_root
def test_a_killed_trainers_empty_cgroups_are_swept():
    """A trainer killed by SIGKILL leaves its cgroup; the next sandbox removes it (empty, and
    its pid is gone) and keeps a live trainer's."""
    base = _memory_base()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = os.path.join(base, f"rlvr-sandbox-{dead.pid}-0000")
    live = os.path.join(base, f"rlvr-sandbox-{os.getppid()}-0000")
    os.mkdir(stale)
    os.mkdir(live)
    try:
        run_python("print(1)", limits=Limits(timeout_s=10))
        assert not os.path.exists(stale) and os.path.exists(live)
    finally:
        for d in (stale, live):
            if os.path.exists(d):
                os.rmdir(d)
