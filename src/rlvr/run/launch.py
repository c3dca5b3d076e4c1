"""`rlvr train --nproc N`: N ranks on this machine under torchrun, with this process between
them and the user. torchrun starts each rank in a session of its own, so a Ctrl-C in the
terminal or a SIGTERM to the command would reach torchrun alone, which kills its ranks after
30 s whatever they are doing. Here torchrun runs in a session of its own as well, and a SIGINT
or SIGTERM this launcher receives goes to every rank's process group instead: each rank
finishes its step, saves and exits 0, as one process does on Ctrl-C; a second signal is
passed on the same way and ends the ranks at once. torchrun itself stops when this launcher
dies (`PR_SET_PDEATHSIG`), so no rank outlives it.

Nothing here imports torch: the command line answers before torch loads."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# After a forwarded stop, how long the ranks may take to finish their step and save before
# they are killed (a step of a large model on a slow machine takes minutes, not hours).
STOP_GRACE_S = 1800.0
_PR_SET_PDEATHSIG = 1


def torchrun_rank() -> bool:
    """Whether this process is one of several ranks started by torchrun."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def is_main_rank() -> bool:
    """Rank 0 of a torchrun job, or a process on its own."""
    return os.environ.get("RANK", "0") == "0"


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """`torchrun --standalone --nproc-per-node N -m rlvr train ...`, all on loopback: torchrun
    would otherwise give the ranks this machine's hostname as MASTER_ADDR, and where that name
    does not resolve (containers, CI sandboxes) every rank waits out the store's 300 s connect
    timeout. `--nproc N` / `--nproc=N` is dropped from `argv`, the rest kept as given."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            rest.append(a)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--local-addr=127.0.0.1",
        f"--nproc-per-node={nproc}",
        "-m",
        "rlvr",
        "train",
        *rest,
    ]


def launch(nproc: int, argv: list[str]) -> int:
    """Run the ranks and return torchrun's exit code; signals go to the ranks (module doc)."""
    env = dict(os.environ)
    loopback = [n for _, n in socket.if_nameindex() if n.startswith("lo")]
    if loopback and "GLOO_SOCKET_IFNAME" not in env:  # gloo binds by hostname too
        env["GLOO_SOCKET_IFNAME"] = loopback[0]
    proc = subprocess.Popen(
        torchrun_command(nproc, argv), env=env, start_new_session=True, preexec_fn=_die_with_parent
    )
    stopping: list[float] = []

    def forward(signum, frame) -> None:
        stopping.append(time.monotonic())
        ranks = children(proc.pid)
        for pid in ranks:  # each rank leads its own process group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signum)
        if not ranks:  # none started yet (or all gone): torchrun stops what it has
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                return proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                if stopping and time.monotonic() - stopping[0] > STOP_GRACE_S:
                    _kill_all(proc.pid)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from /proc; none where there is no /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[1]) == pid:  # fields after the name: state, ppid, ...
                out.append(int(stat.parent.name))
    return sorted(out)


def _kill_all(pid: int) -> None:
    for child in children(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _die_with_parent() -> None:
    """In torchrun, before it runs: SIGTERM when this launcher dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
