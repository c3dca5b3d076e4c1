"""The sandbox as an unprivileged user, and every reward process dying with the trainer.

CI runs as root, so these tests drop to uid/gid 65534 (nobody) in a subprocess that runs
`sandbox_attacks.py` from a world-readable copy of rlvr/rewards' sandbox package (they need
only the standard library). Run as another user, they run as that user. They never skip:
unprivileged user namespaces are required, and an interpreter nobody can run fails loudly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REWARDS = HERE.parents[1] / "src" / "rlvr" / "rewards"
NOBODY = 65534
sys.path.insert(0, str(HERE))
from sandbox_attacks import MARK, setsid_children  # noqa: E402


def _user() -> int:
    return NOBODY if os.geteuid() == 0 else os.geteuid()


def _spawn(argv, **kw) -> subprocess.Popen:
    """`argv` as the unprivileged user (as root: uid and gid 65534, no supplementary groups)."""
    if os.geteuid() == 0:
        kw.update(user=NOBODY, group=NOBODY, extra_groups=[])
    return subprocess.Popen(argv, cwd="/", **kw)


@pytest.fixture(scope="module")
def copy():
    """A world-readable directory with the sandbox modules, the attack script, a directory
    the unprivileged user may write, and an interpreter that user can run."""
    d = Path(tempfile.mkdtemp(prefix="rlvr-unprivileged-", dir="/tmp"))
    os.chmod(d, 0o755)
    shutil.copytree(
        REWARDS / "sandbox", d / "sandbox", ignore=shutil.ignore_patterns("__pycache__")
    )
    os.chmod(d / "sandbox", 0o755)
    for f in (d / "sandbox").iterdir():
        os.chmod(f, 0o644)
    shutil.copy(HERE / "sandbox_attacks.py", d / "sandbox_attacks.py")
    os.chmod(d / "sandbox_attacks.py", 0o644)
    (d / "writable").mkdir(mode=0o777)
    os.chmod(d / "writable", 0o777)
    tried = []
    for exe in dict.fromkeys([os.path.realpath(sys.executable), shutil.which("python3") or "",
                              "/usr/bin/python3"]):  # fmt: skip
        if not exe:
            continue
        try:
            p = _spawn([exe, "-c", "import sys; assert sys.version_info >= (3, 9)"],
                       stderr=subprocess.PIPE)  # fmt: skip
            err = p.communicate()[1]
        except OSError as e:
            tried.append(f"{exe}: {e}")
            continue
        if p.returncode == 0:
            yield d, exe
            shutil.rmtree(d, ignore_errors=True)
            return
        tried.append(f"{exe}: {err.decode(errors='replace').strip()[-200:]}")
    shutil.rmtree(d, ignore_errors=True)
    pytest.fail(f"no Python >= 3.9 that uid {_user()} can run: {tried}")


def _attack(copy, port: int, isolation: str, *names: str) -> tuple[dict, bool]:
    """Run the attacks `names` (none: every attack) as the unprivileged user; (results,
    whether the decoy survived)."""
    d, exe = copy
    decoy = _spawn(["sleep", "60"])
    try:
        argv = [exe, "-I", str(d / "sandbox_attacks.py"), str(d), str(port), str(decoy.pid),
                str(d / "writable"), isolation, *names]  # fmt: skip
        env = {"PATH": "/usr/bin:/bin", "RLVR_SECRET": "hunter2"}
        p = _spawn(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode(errors="replace")
        return json.loads(out), decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()


def test_unprivileged_user_gets_full_isolation(copy, server):
    port, accepted = server
    r, decoy_alive = _attack(copy, port, "auto")
    assert r["uid"] == _user() and r["isolation"] == "namespaces", r
    assert r["environ"].startswith("denied"), r["environ"]  # no /proc/<trainer>/environ
    assert "WROTE" not in r["write"] and r["write"].count("denied") == 3, r["write"]
    assert "inside ok" in r["write"]
    assert not (copy[0] / "writable" / "escape-auto.txt").exists()
    assert r["connect"].startswith("refused"), r["connect"]  # no 127.0.0.1
    assert "KILLED" not in r["kill"] and decoy_alive, r["kill"]  # neither the trainer nor a peer
    assert r["setsid"] == "started\n" and r["setsid_left"] == 0  # setsid child died with it
    assert r["userns"].startswith("denied"), r["userns"]
    assert r["identity"].split()[:3] == ["1000", "1000", "2"] and "False" in r["identity"]
    # the keyring syscalls refused; nothing reached the trainer's session keyring
    assert r["keyring"] == "denied 1\ndenied 1\n" and not r["keyring_left"], r["keyring"]
    assert r["ptrace_init"] == "denied 1\n", r["ptrace_init"]  # its init is not dumpable
    time.sleep(0.3)
    assert accepted == []


def test_the_same_attacks_succeed_without_isolation(copy, server):
    """The control: isolation "none" (the explicit opt-out) stops none of them, so the
    attacks above are real."""
    port, _ = server
    r, decoy_alive = _attack(copy, port, "none")
    assert "hunter2" in r["environ"]
    assert "WROTE" in r["write"] and (copy[0] / "writable" / "escape-none.txt").exists()
    assert r["connect"].strip() == "CONNECTED"
    assert "KILLED" in r["kill"] and not decoy_alive
    assert r["setsid_left"] == 1
    assert r["keyring"] == "READ\nADDED\n" and r["keyring_left"]


def test_unprivileged_kernel_surface_and_other_abis_are_refused(copy, server):
    """As uid 65534: io_uring, bpf and perf_event_open fail with the filter's EPERM inside the
    sandbox, and so does keyctl through the i386 ABI. The control, isolation "none": the
    kernel sees each call (its own errno for the deliberately bad arguments; bpf's may be
    EPERM where unprivileged bpf is off) and the i386 keyctl runs."""
    port, _ = server
    r, _ = _attack(copy, port, "auto", "kernel_surface", "i386_keyctl")
    lines = r["kernel_surface"].splitlines()
    assert len(lines) == 5 and all(line.endswith(" denied 1") for line in lines), lines
    assert r["i386_keyctl"] in ("denied 1\n", "x86_64 only\n"), r["i386_keyctl"]
    control, _ = _attack(copy, port, "none", "kernel_surface", "i386_keyctl")
    reached = [line for line in control["kernel_surface"].splitlines() if "REACHED" in line]
    assert {line.split()[0] for line in reached} >= {"io_uring_setup", "io_uring_enter",
                                                      "io_uring_register", "perf_event_open"}  # fmt: skip
    assert control["i386_keyctl"] in ("CALLED\n", "x86_64 only\n"), control["i386_keyctl"]


TRAINER = """
import importlib.util, os, sys, threading, time
package = sys.argv[1] + "/sandbox"
spec = importlib.util.spec_from_file_location(
    "sandbox", package + "/__init__.py", submodule_search_locations=[package])
sandbox = importlib.util.module_from_spec(spec)
sys.modules["sandbox"] = sandbox
spec.loader.exec_module(sandbox)
program = '''
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/usr/bin/sleep", ["sleep", "%s"])
    os._exit(0)
time.sleep(%s)
'''
r = sandbox.run_python(program % ("{mark}", sys.argv[2]),
                       limits=sandbox.Limits(timeout_s=float(sys.argv[3])))
print(r.timed_out, r.returncode, flush=True)
"""


def _wait_for(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _trainer(copy, sleep_s: float, timeout_s: float, drop: bool) -> subprocess.Popen:
    d, exe = copy
    argv = [exe, "-I", "-c", TRAINER.format(mark=MARK), str(d), str(sleep_s), str(timeout_s)]
    kw = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return _spawn(argv, **kw) if drop else subprocess.Popen(argv, **kw)


@pytest.mark.parametrize("drop", [True, False], ids=["unprivileged", "as-is"])
def test_sandbox_processes_die_with_a_sigkilled_trainer(copy, drop):
    assert not setsid_children()
    trainer = _trainer(copy, 60, 60, drop)
    try:
        assert _wait_for(lambda: len(setsid_children()) == 1, 30), trainer.stderr.read1()
        launchers = _launchers(copy[0])
        assert launchers
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        assert _wait_for(lambda: not setsid_children() and not _launchers(copy[0]), 5)
    finally:
        trainer.kill()
        for pid in setsid_children():
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("drop", [True, False], ids=["unprivileged", "as-is"])
def test_a_sleeping_program_hits_the_wall_clock_in_the_sandbox(copy, drop):
    """The jail's own init ends a program past timeout_s, even while the trainer (which has a
    deadline of its own) is stopped."""
    trainer = _trainer(copy, 60, 1.0, drop)
    try:
        assert _wait_for(lambda: len(setsid_children()) == 1, 30), trainer.stderr.read1()
        trainer.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        assert _wait_for(lambda: not setsid_children(), 10)
        assert time.monotonic() - t0 < 3.0
        trainer.send_signal(signal.SIGCONT)
        out, _ = trainer.communicate(timeout=30)
        assert out.split() == [b"True", b"-9"]
    finally:
        trainer.send_signal(signal.SIGCONT)
        trainer.kill()


def _launchers(where: Path) -> list[int]:
    """The launchers and the zygote they were forked from (which shares their cmdline)."""
    scripts = [
        str(where / "sandbox" / name).encode() for name in ("jail_init.py", "jail_zygote.py")
    ]
    pids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmdline = f.read()
            if any(script in cmdline for script in scripts):
                pids.append(int(d))
        except (OSError, ValueError):
            pass
    return pids


VERIFY_TRAINER = """
import sys, threading
from rlvr.rewards import _verifier
_verifier.warm_up()
print(_verifier._worker.proc.pid, flush=True)
_verifier.verify_in_worker("10^{10^{10}}", "1", timeout_s=600)  # sympy busy for minutes
"""


def test_math_verify_worker_dies_with_a_sigkilled_trainer():
    trainer = subprocess.Popen([sys.executable, "-c", VERIFY_TRAINER], stdout=subprocess.PIPE)
    try:
        worker = int(trainer.stdout.readline())
        time.sleep(1.0)  # the worker is now deep in sympy, not reading its stdin
        assert _alive(worker)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        assert _wait_for(lambda: not _alive(worker), 5)
    finally:
        trainer.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


BUDGET = """
import importlib.util, sys
package = sys.argv[1] + "/sandbox"
spec = importlib.util.spec_from_file_location(
    "sandbox", package + "/__init__.py", submodule_search_locations=[package])
sandbox = sys.modules["sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
from sandbox.budget import per_process_bound
program = '''
import os, time
kids, refused = [], 0
for i in range(6):
    try:
        pid = os.fork()
    except OSError:
        refused += 1
        continue
    if pid == 0:
        try:
            b = b"\\\\1" * (300 << 20)
        except MemoryError:
            os._exit(3)
        time.sleep(1.0)
        os._exit(0)
    kids.append(pid)
print(refused, *[os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids])
'''
lim = sandbox.Limits(timeout_s=30, memory_mb=256, max_procs=3)
r = sandbox.run_python(program, limits=lim)
print(r.budget, per_process_bound(lim), r.stdout.strip(), r.stderr.strip()[-300:])
"""


def test_without_cgroup_delegation_the_per_process_bound_holds(copy):
    """A user who may not make a cgroup gets the per-process budget, and its bound holds: of
    six forks under max_procs=3 at most two start (RLIMIT_NPROC also counts the program and
    the namespace's init), and none gets 300 MB past memory_mb=256."""
    d, exe = copy
    p = _spawn([exe, "-I", "-c", BUDGET, str(d)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode(errors="replace")
    budget, bound, refused, *codes = out.decode().split()
    assert budget == "per-process", out
    assert int(refused) + len(codes) == 6 and 1 + len(codes) <= 3 and set(codes) <= {"3"}, out
    assert int(bound) == 4 * ((256 << 20) + 64 * (1 << 20)) + (16 << 20)
