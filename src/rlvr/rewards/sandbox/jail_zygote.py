"""The zygote: an interpreter that has imported `jail_init` (and the standard-library modules
sandboxed programs use) once, and forks a fresh launcher for every sandbox.

Started by `rlvr.rewards.sandbox` as `python -I -S -B jail_zygote.py FD`, FD one end of a
SOCK_SEQPACKET socket pair. Each request is a sandbox's configuration (JSON: paths, ids and
limits, never a program's text, which the launcher reads from its files after the fork) with
four descriptors attached: the program's stdin, stdout and stderr and the status pipe's write
end, and a fifth for a gated sandbox: its gate's read end (`jail_init`). The zygote forks A,
which takes those as its own, starts a session and runs `jail_init.launch`, the same steps a
freshly started launcher runs, except that D runs the program in its own fresh process
instead of exec-ing another interpreter (`run_here`): every program still gets a process
that ran nothing before it, forked from a zygote that never ran any program.

A launcher that has unshared its namespaces cannot write its own uid/gid maps; it asks the
zygote over a second socket pair that only launchers hold (closed before the jail's init is
forked), so no helper process is forked for it (0.3 ms of CPU a sandbox).

Replies: "pid <A's pid>". A request "reap <pid>" reaps that launcher: the zygote keeps every
launcher a zombie until the trainer has finished with it, so its pid cannot be reused by an
unrelated process the trainer might then signal. When the trainer's end closes (it exited or
died), the zygote exits, and every launcher, armed with a parent-death signal, dies with it,
taking its jail along.
"""

import array
import atexit
import contextlib
import functools
import gc
import json
import os
import runpy
import select
import socket
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jail_init
import jail_lockdown

# imported once here, not by each program: the code harness's own imports
PRELOAD = ("builtins", "contextlib", "importlib", "json", "math", "pkgutil", "runpy", "traceback")


def run_here(argv):
    """D forked from a zygote (`jail_zygote.py`): run the program in this process, which
    runs no other, as `python -I -S -B` would run `argv`, with an empty environment and only
    stdin, stdout and stderr open; exits with the program's status. Never returns."""
    os.closerange(3, 1 << 16)
    os.environ.clear()
    sys.argv = list(argv)
    try:
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:  # what an interpreter does at exit: join the program's threads, run its atexit
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):  # closed or full: the status still goes out
            stream.flush()
    os._exit(code & 0xFF)


def _fork_launcher(sock, maps, cfg, fds):
    """Fork A for `cfg` with `fds`; `maps`: the id-map channel's two ends (the zygote's, the
    launchers')."""
    cfg["parent"] = os.getpid()  # the launcher's parent-death signal follows the zygote
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    try:
        sock.close()
        maps[0].close()
        jail_init.WRITE_MAPS = functools.partial(_ask_for_maps, maps[1])
        for target, fd in zip((0, 1, 2), fds[:3]):  # received fds are >= 3: 0-2 are open
            os.dup2(fd, target)
        status = fds[3]
        for fd in set(fds[:3]) - {0, 1, 2}:
            os.close(fd)
        cfg["status_fd"] = status
        cfg["gate_fd"] = fds[4] if len(fds) == 5 else None
        jail_init.RUN_HERE = run_here
        os.setsid()
        jail_init.launch(cfg)
    except BaseException as e:
        if jail_init.STATUS >= 0:
            jail_init.report(f"error {type(e).__name__}: {e}")
    os._exit(97)


def serve(sock):
    """Answer the trainer's requests on `sock` and the launchers' id-map requests until the
    trainer's end closes."""
    maps = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    while True:
        ready = select.select([sock, maps[0]], [], [])[0]
        if maps[0] in ready:
            _write_maps_for(maps[0])
        if sock in ready and not _answer(sock, maps):
            return


def _answer(sock, maps):
    """One request of the trainer's; False once its end has closed."""
    try:
        msg, ancdata, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(5 * 4))
    except OSError:
        return False
    if not msg:
        return False
    if msg.startswith(b"reap "):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(int(msg[5:]), 0)
        return True
    fds = _descriptors(ancdata)
    if len(fds) not in (4, 5):
        for fd in fds:
            os.close(fd)
        sock.send(b"error expected 4 or 5 descriptors")
        return True
    try:
        pid = _fork_launcher(sock, maps, json.loads(msg), fds)
    except (OSError, ValueError) as e:
        for fd in fds:
            os.close(fd)
        sock.send(f"error {type(e).__name__}: {e}".encode())
        return True
    sock.send(f"pid {pid}".encode())
    return True


def _descriptors(ancdata):
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


def _write_maps_for(maps):
    """A launcher that has unshared its namespaces asks for its id maps (it cannot write them
    from inside): [pid, uid, gid, deny_setgroups], with the write end of a pipe for the reply,
    "ok" or the error."""
    try:
        msg, ancdata, _, _ = maps.recvmsg(4096, socket.CMSG_SPACE(4))
    except OSError:
        return
    fds = _descriptors(ancdata)
    try:
        pid, uid, gid, deny = json.loads(msg)
        jail_init._write_maps(int(pid), int(uid), int(gid), bool(deny))
        reply = b"ok"
    except (OSError, ValueError, TypeError) as e:
        reply = f"{type(e).__name__}: {e}".encode()
    for fd in fds:
        with contextlib.suppress(OSError):
            os.write(fd, reply)
        os.close(fd)


def _ask_for_maps(chan, pid, uid, gid, deny):
    """A's side of `_write_maps_for`; closes A's end of the channel (its jail never holds it)."""
    r, w = os.pipe()
    try:
        chan.sendmsg([json.dumps([pid, uid, gid, deny]).encode()],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [w]))])  # fmt: skip
    finally:
        os.close(w)
        chan.close()
    reply = os.read(r, 4096)
    os.close(r)
    if reply != b"ok":
        raise RuntimeError(f"the uid/gid maps were not written: {reply.decode(errors='replace')}")


def main():
    for name in PRELOAD:
        __import__(name)
    # what the zygote holds is never collected: frozen, it is left out of the collections its
    # forks run, which would write to (and so copy) the pages holding it
    jail_lockdown.prepare()
    gc.freeze()
    sock = socket.socket(fileno=int(sys.argv[1]))
    serve(sock)
    os._exit(0)


if __name__ == "__main__":
    main()
