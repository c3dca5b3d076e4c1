"""Every sandboxed program gets a process of its own, forked from the zygote: what one program
leaves (module state, builtins, environment, descriptors, memory) never reaches the next, the
program runs as `python -I -S -B` would run it, and the zygote goes away with its trainer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from rlvr.rewards.sandbox import Limits, run_python
from rlvr.rewards.sandbox import zygote as zygote_module

FAST = Limits(timeout_s=5.0)

LEAVE = """
import builtins, os, sys
sys.left_behind = "SECRET-" + "71f3"
builtins.left_behind = sys.left_behind
os.environ["LEFT_BEHIND"] = sys.left_behind
keep = {"secret": sys.left_behind}
open("/tmp/left-behind", "w").write(sys.left_behind)
print(os.getpid())
"""

LOOK = """
import builtins, gc, json, os, sys
found = [hasattr(sys, "left_behind"), hasattr(builtins, "left_behind"),
         "LEFT_BEHIND" in os.environ, os.path.exists("/tmp/left-behind")]
mark = "SECRET-" + "71f3"
mine = globals()  # holds `mark` itself
found.append(any(isinstance(o, dict) and o is not mine and mark in o.values()
                 for o in gc.get_objects()))
fds = []
for fd in range(3, 256):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
print(json.dumps({"found": found, "fds": fds, "env": dict(os.environ), "argv": sys.argv,
                  "flags": [sys.flags.isolated, sys.flags.no_site, sys.flags.dont_write_bytecode],
                  "pid": os.getpid()}))
"""


def test_nothing_one_program_leaves_reaches_the_next():
    first = run_python(LEAVE, limits=FAST)
    assert first.returncode == 0, first.stderr
    for _ in range(3):  # and after several others
        r = run_python(LOOK, limits=FAST)
        assert r.returncode == 0, r.stderr
        seen = json.loads(r.stdout)
        assert seen["found"] == [False] * 5, seen
        assert seen["fds"] == [], seen  # only stdin, stdout and stderr are open
        assert seen["env"] == {} and seen["argv"] == ["main.py"]
        assert seen["flags"] == [1, 1, 1]


def test_exit_status_traceback_threads_and_atexit_as_an_interpreter_has_them():
    r = run_python("import sys\nsys.exit(3)", limits=FAST)
    assert r.returncode == 3
    r = run_python("import sys\nsys.exit('a message')", limits=FAST)
    assert (r.returncode, r.stderr) == (1, "a message\n")
    r = run_python("def f():\n    1/0\nf()", limits=FAST)
    assert r.returncode == 1 and "ZeroDivisionError" in r.stderr and "line 2, in f" in r.stderr
    r = run_python(
        "import atexit, threading, time\n"
        "atexit.register(print, 'atexit')\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
        "print('main')",
        limits=FAST,
    )
    assert (r.returncode, r.stdout) == (0, "main\nthread\natexit\n"), r
    r = run_python("import sys\nprint(sys.stdin.read().upper())", stdin="x" * 200_000, limits=FAST)
    assert r.stdout == "X" * 200_000 + "\n"  # larger than a pipe: written while it reads


def test_the_zygote_runs_no_program_and_serves_many():
    run_python("print(1)", limits=FAST)
    z = zygote_module.zygote()
    pid = z.proc.pid
    for _ in range(5):
        assert run_python("print(2)", limits=FAST).stdout == "2\n"
    assert zygote_module.zygote().proc.pid == pid  # one zygote for the process
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[-3].endswith(b"jail_zygote.py")
    children = [t for t in os.listdir(f"/proc/{pid}/task")]
    assert len(children) == 1  # single-threaded, as a fork needs


def test_a_dead_zygote_is_replaced():
    run_python("print(1)", limits=FAST)
    old = zygote_module.zygote().proc
    old.kill()
    old.wait()
    assert run_python("print(3)", limits=FAST).stdout == "3\n"
    assert zygote_module.zygote().proc.pid != old.pid


TRAINER = """
import sys, time
from rlvr.rewards.sandbox import run_python, zygote
run_python("print(1)")
print(zygote.zygote().proc.pid, flush=True)
time.sleep(60)
"""


def test_the_zygote_exits_with_its_trainer():
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE)
    try:
        pid = int(trainer.stdout.readline())
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait()
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break  # exited; its parent (the dead trainer's reaper) reaps it
            time.sleep(0.02)
        alive = os.path.exists(f"/proc/{pid}")
        if alive:
            with open(f"/proc/{pid}/stat") as f:
                alive = f.read().rsplit(")", 1)[1].split()[0] != "Z"
        assert not alive
    finally:
        trainer.kill()
