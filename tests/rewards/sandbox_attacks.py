"""Escape attempts against the sandbox, run by tests/rewards/test_sandbox_unprivileged.py as
an unprivileged user (and by the root test suite as root). Stdlib only: it loads
the sandbox package from the directory in argv[1] (a world-readable copy of
rlvr/rewards/sandbox as its `sandbox/`), so it needs neither the venv nor the rlvr package's dependencies.

argv: SANDBOX_DIR PORT DECOY_PID WRITABLE_DIR ISOLATION [ATTACK ...] (none named: every
attack). Prints one JSON object: for each attack, the program's stdout (and, for "setsid",
whether its child outlived the run).
"""

import importlib.util
import json
import os
import sys
import time

MARK = "4321.25"  # the setsid child's `sleep` argument, to find it afterwards

ATTACKS = {
    "environ": """
try:
    with open("/proc/{trainer}/environ", "rb") as f:
        print("READ", f.read().decode(errors="replace"))
except OSError as e:
    print("denied", e.errno)
""",
    "write": """
for path in [{target!r}, "/escape.txt", "/usr/escape.txt"]:
    try:
        with open(path, "w") as f:
            f.write("escaped")
        print("WROTE", path)
    except OSError as e:
        print("denied", e.errno)
with open("/tmp/inside.txt", "w") as f:
    f.write("ok")
print("inside ok")
""",
    "connect": """
import socket
try:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
    s.sendall(b"leak")
    s.close()
    print("CONNECTED")
except OSError as e:
    print("refused", e.errno)
""",
    "kill": """
import os, signal
for pid in ({trainer}, {decoy}):
    try:
        os.kill(pid, signal.SIGKILL)
        print("KILLED", pid)
    except OSError as e:
        print("denied", e.errno)
""",
    "setsid": """
import os
r, w = os.pipe()  # close-on-exec: EOF once the grandchild runs sleep and the others closed it
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/usr/bin/sleep", ["sleep", "{mark}"])
    os._exit(0)
os.close(w)
os.read(r, 1)
print("started")
""",
    "userns": """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("UNSHARED" if libc.unshare(0x10000000) == 0 else "denied %d" % ctypes.get_errno())
""",
    "keyring": """
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
add_key, keyctl = {{"x86_64": (248, 250), "aarch64": (217, 219)}}[platform.machine()]
# read the session keyring it was started in, then add a key to it
buf = ctypes.create_string_buffer(4096)
got = libc.syscall(keyctl, 11, -3, buf, 4096)  # KEYCTL_READ of @s: the serials it holds
print("READ" if got >= 0 else "denied %d" % ctypes.get_errno())
r = libc.syscall(add_key, b"user", b"{key}", b"x" * 64, 64, -3)
print("ADDED" if r >= 0 else "denied %d" % ctypes.get_errno())
""",
    "kernel_surface": """
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
numbers = {{"x86_64": (425, 426, 427, 321, 298), "aarch64": (425, 426, 427, 280, 241)}}
names = ("io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open")
# arguments the kernel refuses with its own errno (EFAULT: a NULL struct; EBADF: fd -1;
# EINVAL: no such bpf command), so EPERM can only be the filter's
m1 = ctypes.c_long(-1)
args = ((8, None), (m1, 0, 0, 0, None, 0), (m1, 0, None, 0), (0xFFFF, None, 0), (None, 0, m1, m1, 0))
for name, nr, a in zip(names, numbers[platform.machine()], args):
    r = libc.syscall(nr, *a)
    print(name, "denied %d" % ctypes.get_errno() if r < 0 and ctypes.get_errno() == 1 else "REACHED %d" % ctypes.get_errno())
""",
    "i386_keyctl": """
import ctypes, mmap, platform
# x86_64 machine code: keyctl(KEYCTL_GET_KEYRING_ID, @s, 0) through the i386 ABI (int 0x80,
# keyctl is 288 there), whose numbers a filter written for x86_64's would not match
code = bytes.fromhex("b820010000" "bb00000000" "b9fdffffff" "31d2" "cd80" "c3")
if platform.machine() != "x86_64":
    print("x86_64 only")
else:
    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    r = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
    print("denied %d" % -r if r < 0 else "CALLED")
""",
    "ptrace_init": """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("ATTACHED" if libc.ptrace(16, 1, 0, 0) == 0 else "denied %d" % ctypes.get_errno())
""",
    "identity": """
import os
print(os.getuid(), os.getgid(), os.getpid(), sorted(os.environ), os.path.exists("/proc/1"))
""",
}


def _keyctl(*args) -> int:
    """keyctl(2) on this machine (x86_64, aarch64)."""
    import ctypes
    import platform

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall({"x86_64": 250, "aarch64": 219}[platform.machine()], *args)


def key_in_session(name: str) -> bool:
    """Whether this process's session keyring holds a "user" key `name` (KEYCTL_SEARCH)."""
    return _keyctl(10, -3, b"user", name.encode(), 0) >= 0


def setsid_children():
    pids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", MARK.encode()]:
                    pids.append(int(d))
        except (OSError, ValueError):
            pass
    return pids


def main():
    where, port, decoy, writable, isolation = sys.argv[1:6]
    only = set(sys.argv[6:]) or set(ATTACKS)
    package = os.path.join(where, "sandbox")
    spec = importlib.util.spec_from_file_location(
        "sandbox", os.path.join(package, "__init__.py"), submodule_search_locations=[package]
    )
    sandbox = importlib.util.module_from_spec(spec)
    sys.modules["sandbox"] = sandbox
    spec.loader.exec_module(sandbox)
    key = f"rlvr-probe-{isolation}-{os.getpid()}"
    fill = dict(trainer=os.getpid(), decoy=int(decoy), port=int(port), mark=MARK, key=key,
                target=os.path.join(writable, f"escape-{isolation}.txt"))  # fmt: skip
    _keyctl(1, None)  # a session keyring of this script's own, as a trainer's login session has
    out = {"uid": os.getuid(), "isolation": sandbox.available_isolation()}
    for name, src in ATTACKS.items():
        if name not in only:
            continue
        if name == "kill" and isolation == "none":  # the control would kill this script
            src = src.replace("({trainer}, {decoy})", "({decoy},)")
        r = sandbox.run_python(src.format(**fill), isolation=isolation,
                               limits=sandbox.Limits(timeout_s=3))  # fmt: skip
        out[name] = r.stdout
        if name == "keyring":  # did the key reach the trainer's session keyring?
            out["keyring_left"] = key_in_session(key)
        if name == "setsid":
            deadline = time.monotonic() + 3.0
            while (left := setsid_children()) and time.monotonic() < deadline:
                time.sleep(0.05)
            out["setsid_left"] = len(left)
            for pid in left:  # the control run's child: tidy up
                os.kill(pid, 9)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
