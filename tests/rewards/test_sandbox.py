"""The code sandbox: each guarantee of rlvr.rewards.sandbox, shown by a program that tries to
break it. Where it helps, the same program run with isolation="none" is the control that
proves the attempt would have worked without the sandbox."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr.rewards.sandbox import Limits, SandboxError, run_python

PROJECT_FILE = Path(__file__).resolve().parents[2] / "pyproject.toml"
FAST = Limits(timeout_s=2.0)


def _sandbox_processes(uid: int | None) -> int:
    """Processes of the fresh uid a sandbox ran as (root's case; other sandboxes on the machine
    have uids of their own), or of every fresh uid (>= 1,000,000) when it had none."""
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                owner = os.stat(f"/proc/{d}").st_uid
                n += owner == uid if uid is not None else owner >= 1_000_000
    return n


CONNECT = """
import socket
try:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
    s.sendall(b"leak")
    s.close()
    print("connected")
except OSError as e:
    print("refused", e.errno)
"""


def test_no_network(server):
    port, accepted = server
    r = run_python(CONNECT.format(port=port), limits=FAST)
    assert r.stdout.startswith("refused"), r
    control = run_python(CONNECT.format(port=port), limits=FAST, isolation="none")
    assert control.stdout.strip() == "connected"
    time.sleep(0.3)
    assert accepted == [b"leak"]  # only the control got through


WRITE = """
import os
for path in {paths!r}:
    try:
        with open(path, "w") as f:
            f.write("escaped")
        print("WROTE", path)
    except OSError as e:
        print("denied", path, e.errno)
with open("/tmp/inside.txt", "w") as f:
    f.write("ok")
print("inside ok", os.getcwd())
"""


def test_cannot_write_outside_its_temp_dir(tmp_path):
    target = tmp_path / "escape.txt"
    paths = [str(target), "/escape.txt", "/usr/escape.txt", str(PROJECT_FILE.parent / "x.txt"),
             os.path.realpath(os.__file__), "/dev/escape"]  # fmt: skip
    r = run_python(WRITE.format(paths=paths), limits=FAST)
    assert "WROTE" not in r.stdout, r.stdout
    assert r.stdout.count("denied") == len(paths)
    assert "inside ok /tmp" in r.stdout
    assert not target.exists() and not (PROJECT_FILE.parent / "x.txt").exists()


READ = """
import os
for path in {paths!r}:
    try:
        with open(path) as f:
            print("READ", path, len(f.read()))
    except OSError as e:
        print("denied", path, e.errno)
for d in ["/work", "/home", "/etc", "/proc", {project_dir!r}]:
    print("exists" if os.path.exists(d) else "absent", d)
"""


def test_cannot_read_project_files_or_system_secrets():
    paths = [str(PROJECT_FILE), "/etc/passwd", "/proc/self/environ", "/root/.bash_history"]
    src = READ.format(paths=paths, project_dir=str(PROJECT_FILE.parent))
    r = run_python(src, limits=FAST)
    assert "READ" not in r.stdout, r.stdout
    assert "exists" not in r.stdout, r.stdout
    control = run_python(src, limits=FAST, isolation="none")
    assert f"READ {PROJECT_FILE}" in control.stdout  # the guessed path is right


def test_empty_environment(monkeypatch):
    monkeypatch.setenv("RLVR_SECRET_TOKEN", "hunter2")
    r = run_python("import os; print(sorted(os.environ))", limits=FAST)
    assert "RLVR_SECRET_TOKEN" not in r.stdout and "PATH" not in r.stdout
    assert "HOME" not in r.stdout


def test_memory_limit():
    r = run_python(
        "x = bytearray(1 << 30)\nprint('allocated')", limits=Limits(timeout_s=5, memory_mb=256)
    )
    assert "allocated" not in r.stdout
    assert "MemoryError" in r.stderr


def test_wall_clock_and_cpu_limits():
    t0 = time.monotonic()
    r = run_python("while True: pass", limits=Limits(timeout_s=0.5))
    assert r.returncode != 0
    assert time.monotonic() - t0 < 4.0
    t0 = time.monotonic()
    r = run_python("import time; time.sleep(60)", limits=Limits(timeout_s=0.5))
    assert r.timed_out  # sleeping uses no CPU: only the wall clock stops it
    assert time.monotonic() - t0 < 4.0


def test_process_limit_counts_children():
    src = """
import os, time
n = 0
for _ in range(200):
    try:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
    except OSError:
        break
print("children", n)
"""
    r = run_python(src, limits=Limits(timeout_s=3, max_procs=16))
    n = int(r.stdout.split()[-1])
    assert 1 <= n < 16
    time.sleep(0.2)
    assert r.uid is not None or os.geteuid() != 0  # as root: a fresh uid to look for
    assert _sandbox_processes(r.uid) == 0  # the sleeping children died with the namespace


def test_fork_bomb_is_bounded_and_cleaned_up():
    before = len([d for d in os.listdir("/proc") if d.isdigit()])
    bomb = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    t0 = time.monotonic()
    r = run_python(bomb, limits=Limits(timeout_s=0.5, max_procs=32))
    assert time.monotonic() - t0 < 5.0
    assert r.timed_out or r.returncode != 0
    time.sleep(0.3)
    assert _sandbox_processes(r.uid) == 0
    after = len([d for d in os.listdir("/proc") if d.isdigit()])
    assert after < before + 10  # nothing left behind (other workers share the machine)
    assert run_python("print('still fine')", limits=FAST).stdout.strip() == "still fine"


def test_output_is_capped():
    r = run_python("print('x' * 10_000_000)", limits=Limits(timeout_s=5, max_output_bytes=1 << 16))
    assert len(r.stdout) <= 1 << 16
    assert r.returncode != 0  # SIGXFSZ / "File too large"


def test_open_files_limit():
    src = "fs = []\ntry:\n    while True: fs.append(open('/dev/null'))\nexcept OSError:\n    print(len(fs))"
    r = run_python(src, limits=Limits(timeout_s=5, max_open_files=32))
    assert 0 < int(r.stdout) < 32


def test_stdin_and_exit_status():
    r = run_python("import sys; print(sys.stdin.read().upper()); sys.exit(3)", stdin="abc")
    assert r.stdout.strip() == "ABC" and r.returncode == 3 and not r.timed_out


REFUSE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location(
    "sandbox", sys.argv[1] + "/__init__.py", submodule_search_locations=[sys.argv[1]])
sandbox = sys.modules["sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
for isolation in ("auto", "namespaces"):
    try:
        sandbox.run_python("print('RAN')", isolation=isolation)
    except sandbox.SandboxUnavailable as e:
        print("refused", isolation, "reward.sandbox_isolation: none" in str(e))
print(sandbox.run_python("print('opted out')", isolation="none").stdout.strip())
"""


def test_without_namespaces_model_code_runs_only_after_an_explicit_opt_out():
    """Where user namespaces are forbidden (here: max_user_namespaces=0 in a user namespace
    of its own), "auto" and "namespaces" refuse to run anything; only "none" runs."""
    shell = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" -I -c "$1" "$2"'
    sandbox_py = Path(__file__).resolve().parents[2] / "src/rlvr/rewards/sandbox"
    exe = os.path.realpath(sys.executable)
    r = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", shell, exe, REFUSE,
                        str(sandbox_py)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.stdout.split("\n") == [
        "refused auto True",
        "refused namespaces True",
        "opted out",
        "",
    ], r.stderr


SMALL_NS = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location(
    "sandbox", sys.argv[1] + "/__init__.py", submodule_search_locations=[sys.argv[1]])
sandbox = sys.modules["sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
print(sandbox._fresh_id())
print(sandbox.run_python("import os; print(os.getuid(), os.path.exists('/proc'))").stdout)
"""


def test_root_of_a_namespace_that_maps_one_uid_is_still_isolated():
    """Root in a container that maps few ids has no fresh uid to give the program; it runs
    as that root's own uid, in the same namespaces, as a non-root user's program does."""
    sandbox_py = Path(__file__).resolve().parents[2] / "src/rlvr/rewards/sandbox"
    r = subprocess.run(["unshare", "--user", "--map-root-user", os.path.realpath(sys.executable),
                        "-I", "-c", SMALL_NS, str(sandbox_py)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.stdout.split("\n")[:2] == ["None", "1000 False"], r.stderr


def test_a_program_cannot_forge_a_sandbox_failure():
    """Printing the jail's failure message and exiting with its old status is the program's
    own failure, reported as such; nothing is raised."""
    src = "import os\nos.write(2, b'rlvr sandbox setup failed: x\\n')\nos._exit(97)"
    for fd in range(3, 64):  # and no inherited descriptor reaches the jail's status pipe
        src += f"\ntry:\n    os.write({fd}, b'error forged\\n')\nexcept OSError:\n    pass"
    r = run_python(src, limits=FAST)
    assert r.returncode == 97 and "setup failed" in r.stderr and not r.timed_out


def test_a_real_sandbox_failure_raises():
    with pytest.raises(SandboxError, match="setup failed"):
        run_python("print(1)", extra_files={"no/such/dir.py": ""}, limits=FAST)


def test_own_keyring_and_a_non_dumpable_init():
    """As whoever runs the suite (root in CI): model code can neither read nor add to the
    trainer's session keyring (the keyring syscalls fail with EPERM and the sandbox has a
    session keyring of its own), nor ptrace the jail's init. The control, isolation="none",
    reads the trainer's keyring and leaves a key in it."""
    sys.path.insert(0, str(Path(__file__).parent))
    from sandbox_attacks import ATTACKS, _keyctl, key_in_session

    _keyctl(1, None)  # this test process's own session keyring, as a login session has one
    for isolation, expected, left in (("auto", "denied 1\ndenied 1\n", False), ("none", "READ\nADDED\n", True)):  # fmt: skip
        key = f"rlvr-probe-root-{isolation}-{os.getpid()}"
        r = run_python(ATTACKS["keyring"].format(key=key), isolation=isolation, limits=FAST)
        assert r.stdout == expected and key_in_session(key) is left, (isolation, r)
    r = run_python(ATTACKS["ptrace_init"], limits=FAST)
    assert r.stdout == "denied 1\n", r


def test_kernel_surface_syscalls_and_other_abis_are_refused():
    """As whoever runs the suite (root in CI): io_uring_setup, io_uring_enter,
    io_uring_register, bpf and perf_event_open fail with the seccomp filter's EPERM, and so
    does keyctl called through the i386 ABI (`int 0x80`, x86_64 only). The control,
    isolation="none": the kernel sees each call and answers its deliberately bad arguments
    with its own errno (EFAULT, EBADF, EINVAL), and the i386 keyctl runs."""
    sys.path.insert(0, str(Path(__file__).parent))
    from sandbox_attacks import ATTACKS

    names = ["io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open"]
    for isolation, verdict, abi in (("auto", "denied", "denied 1\n"), ("none", "REACHED", "CALLED\n")):  # fmt: skip
        r = run_python(ATTACKS["kernel_surface"].format(), isolation=isolation, limits=FAST)
        lines = [line.split() for line in r.stdout.splitlines()]
        assert [line[:2] for line in lines] == [[n, verdict] for n in names], (isolation, r)
        assert all((line[2] == "1") is (verdict == "denied") for line in lines), (isolation, r)
        r = run_python(ATTACKS["i386_keyctl"].format(), isolation=isolation, limits=FAST)
        assert r.stdout in (abi, "x86_64 only\n"), (isolation, r)
