"""Sandbox launcher: runs before the untrusted program, builds its jail, then execs it.

Forked for each sandbox in namespaces by the zygote (`jail_zygote.py`, which runs `launch`),
or for isolation "none" started as `python -I -S jail_init.py CONFIG_JSON`; either way with the
write end of a status pipe (fd `status_fd`). It imports only the standard library. The same
steps work as root and as any other user, because the user namespace comes first:

  A (this process, in the trainer's namespaces) joins the sandbox's cgroups where it has
     them (one memory and process budget for all it starts), arms a parent-death signal and
     reads the program's files into memory;
  A: unshare(user, mount, pid, network, IPC, UTS, cgroup); from the parent namespace, the
     zygote (asked over its id-map channel, `WRITE_MAPS`) or else a helper H that A forked
     before the unshare writes A's uid/gid maps (uid 1000 inside maps to a fresh uid as
     root, to the caller's own uid otherwise); A then forks C, pid 1 of the new pid
     namespace, and watches: when the trainer dies A kills C, and A's own parent-death
     signal does the same;
  C: re-arms the parent-death signal after each credential change, switches to uid/gid 1000
     (as root also clearing supplementary groups), forbids nested user namespaces, mounts a
     tmpfs root with the Python installation, /usr, /lib* and /dev/{null,zero,urandom} bound
     read-only and nosuid, a size-limited tmpfs at /tmp (the only writable place), writes the
     files there, pivots into the new root and detaches the old one (no path leads back to
     the host; no /proc), joins a session keyring of its own, drops every capability, sets
     the resource limits and PR_SET_NO_NEW_PRIVS, installs a seccomp filter refusing the
     keyring syscalls (add_key, request_key, keyctl), io_uring, bpf, perf_event_open and
     every syscall of another ABI (x32, i386) with EPERM, makes itself non-dumpable (the
     program cannot ptrace it), reports "ready", waits for its gate if it has one (a jail
     built ahead of its turn, `gate_fd`: "g" starts the program, EOF ends the jail), and
     forks D, which runs the program with an empty environment: in its own fresh process
     (`jail_zygote.run_here`: the zygote's interpreter, which has run nothing else, so no
     second interpreter starts) or by exec-ing one. C enforces the wall clock: when D outlives `timeout_s`, C exits, and the kernel
     kills every process left in the namespace (setsid or double-forked ones included); when
     D exits first, C reports its status and exits the same way.

Status lines (only this code writes the pipe; it is close-on-exec, and the program has no
/proc to reopen it): "pid <C's pid>", "ready", then "exit <code>" (negative: killed by that signal) or
"timeout"; "error <why>" when a setup step fails. The trainer trusts these lines, never the
program's exit status or output, to tell a failed jail from a failed program.

mode "none" (explicit opt-out): A writes the files to a plain temporary directory, sets the
limits, reports "ready", waits for its gate if it has one, and execs the program itself.
"""

import ctypes
import json
import os
import platform
import select
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script under -I
from jail_lockdown import (
    _call,
    _drop_capabilities,
    _own_keyring,
    _refuse_syscalls,
    _restrict,
    libc,
)
from reap import exited_within

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x20000, 0x2000000, 0x4000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x8000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
NAMESPACES |= CLONE_NEWUTS | CLONE_NEWCGROUP
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}
INNER_ID = 1000  # the program's uid and gid inside the namespace

STATUS = -1
RUN_HERE = None  # set by the zygote: D runs the program in its own process, no exec
WRITE_MAPS = None  # set by the zygote: it writes A's id maps, (pid, uid, gid, deny_setgroups)


def report(line):
    os.write(STATUS, (line.replace("\n", " ") + "\n").encode())


def _die_with_parent(parent_alive):
    """SIGKILL this process when its parent exits (re-armed after every credential change,
    which clears it); exit now if the parent is already gone."""
    _call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if not parent_alive():
        os._exit(1)


def _mount(src, dst, fstype, flags, data=None):
    enc = [None if x is None else x.encode() for x in (src, dst, fstype, data)]
    _call("mount", enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3])


def _kept_flags(fd):
    """The source mount's flags that a remount inside a user namespace must keep."""
    f = os.statvfs(fd).f_flag
    flags = MS_NOEXEC if f & os.ST_NOEXEC else 0
    flags |= MS_NODEV if f & os.ST_NODEV else 0
    flags |= MS_NODIRATIME if f & os.ST_NODIRATIME else 0
    if f & os.ST_NOATIME:
        return flags | MS_NOATIME
    return flags | (MS_RELATIME if f & os.ST_RELATIME else MS_STRICTATIME)


def _open_sources(paths):
    """O_PATH descriptors of the bind sources, opened with the caller's credentials (its
    uid may traverse /root, say, where the sandbox's own uid may not)."""
    out = {}
    for p in paths:
        is_dir = os.path.isdir(p)
        out[p] = (os.open(p, os.O_PATH | (os.O_DIRECTORY if is_dir else 0)), is_dir)
    return out


def _bind_ro(src, fd, is_dir, root):
    dst = root + src
    if is_dir:
        os.makedirs(dst, exist_ok=True)
        os.fchdir(fd)
        source = "."  # the directory fd, whatever the path to it
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
        source = src
    _mount(source, dst, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | _kept_flags(fd)
    if not src.startswith("/dev/"):
        flags |= MS_NODEV
    _mount(None, dst, None, flags)


def _enter_namespaces(cfg):
    """unshare every namespace, then have the id maps written from outside: by the zygote
    (`WRITE_MAPS`, one fork fewer) or by a helper forked before the unshare."""
    if WRITE_MAPS is not None:
        _call("unshare", NAMESPACES)
        WRITE_MAPS(os.getpid(), cfg["outer_uid"], cfg["outer_gid"], cfg["deny_setgroups"])
        return
    parent = os.getpid()
    r, w = os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(w)
        try:
            if os.read(r, 1) == b"1":
                _write_maps(parent, cfg["outer_uid"], cfg["outer_gid"], cfg["deny_setgroups"])
                os._exit(0)
        except BaseException as e:
            report(f"error writing the uid/gid maps: {type(e).__name__}: {e}")
        os._exit(1)
    os.close(r)
    try:
        _call("unshare", NAMESPACES)
        os.write(w, b"1")
    finally:
        os.close(w)
    _, status = os.waitpid(helper, 0)
    if status != 0:
        raise RuntimeError("the uid/gid maps were not written")


def _write_maps(pid, uid, gid, deny_setgroups):
    def put(name, text):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(text)

    if deny_setgroups:  # required before an unprivileged gid_map
        put("setgroups", "deny")
    put("uid_map", f"{INNER_ID} {uid} 1\n")
    put("gid_map", f"{INNER_ID} {gid} 1\n")


def _no_nested_user_namespaces():
    """Defence in depth: user namespaces created below this one would hand the program
    capabilities (over nothing of the host, but more kernel to attack)."""
    path = "/proc/sys/user/max_user_namespaces"
    if os.path.exists(path):
        with open(path, "w") as f:
            f.write("0")


def _jail(cfg, files, sources):
    root = cfg["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for path in cfg["links"]:
        os.symlink(os.readlink(path), root + path)
    for path in cfg["binds"]:
        fd, is_dir = sources[path]
        _bind_ro(path, fd, is_dir, root)
        os.close(fd)
    tmp = root + "/tmp"
    os.makedirs(tmp, exist_ok=True)
    _mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmp_bytes']},mode=700")
    _write_files(files, tmp)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"pivot_root: unknown syscall number on {platform.machine()}")
    if libc.syscall(number, b".", b".") != 0:
        raise OSError(ctypes.get_errno(), "pivot_root")
    _call("umount2", b".", MNT_DETACH)  # the old root, stacked under the new one
    os.chdir("/tmp")


def _write_files(files, workdir):
    for name, data in files.items():
        with open(os.path.join(workdir, name), "wb") as f:
            f.write(data)


def _exec(argv):
    try:
        os.execve(argv[0], argv, {})
    except BaseException as e:
        report(f"error exec {argv[0]}: {e}")
    os._exit(97)


def _init(cfg, files, lifeline):
    """C: pid 1 of the new pid namespace. `lifeline` reads EOF once A is gone (A is outside
    this pid namespace, so getppid() cannot tell). Never returns."""

    def parent_alive():
        return not select.select([lifeline], [], [], 0)[0]

    try:
        _die_with_parent(parent_alive)
        sources = _open_sources(cfg["binds"])
        if not cfg["deny_setgroups"]:
            os.setgroups([])
        os.setresgid(INNER_ID, INNER_ID, INNER_ID)
        os.setresuid(INNER_ID, INNER_ID, INNER_ID)
        _die_with_parent(parent_alive)
        _no_nested_user_namespaces()
        _own_keyring()
        _jail(cfg, files, sources)
        _drop_capabilities()
        _restrict(cfg["limits"])
        _refuse_syscalls()
        # not dumpable: the program (same uid, no capabilities) cannot ptrace this init or
        # write on its status descriptor; its exec makes the program itself dumpable again
        _call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
    except BaseException as e:
        report(f"error {type(e).__name__}: {e}")
        os._exit(97)
    report("ready")
    _wait_for_gate(cfg)
    pid = os.fork()
    if pid == 0:
        if RUN_HERE is not None:
            RUN_HERE(cfg["argv"][4:])
        _exec(cfg["argv"])
    _supervise(pid, cfg["timeout_s"])


def _wait_for_gate(cfg):
    """A gated sandbox (`gate_fd`) is built ahead of its turn: the program starts when the
    trainer writes "g" on the gate; EOF (the trainer is gone or dropped it) ends the jail."""
    gate = cfg.get("gate_fd")
    if gate is None:
        return
    go = os.read(gate, 1) == b"g"
    os.close(gate)
    if not go:
        os._exit(0)


def _wait_exit(pid, timeout_s):
    """True when `pid` exited within `timeout_s` (it is then still unreaped)."""
    exited = exited_within(pid, timeout_s)
    if exited is not None:
        return exited
    deadline = time.monotonic() + timeout_s  # kernels before 5.3, no pidfd: poll
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
            return True
        time.sleep(0.005)
    return False


def _supervise(pid, timeout_s):
    # pid 1 of a namespace ignores signals it has no handler for, the program's included
    if not _wait_exit(pid, timeout_s):
        report("timeout")
        os._exit(124)  # the kernel now kills every process in the namespace
    _, status = os.waitpid(pid, 0)
    report(f"exit {os.waitstatus_to_exitcode(status)}")
    os._exit(0)


def _pidfd(pid):
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # kernels before 5.3: poll every 50 ms
        return None


def _watch(child, parent):
    """A: wait for C; if the trainer dies first, kill C (and with it the namespace)."""
    parent_fd, child_fd = _pidfd(parent), _pidfd(child)
    if os.getppid() != parent:
        os.kill(child, signal.SIGKILL)
    fds = [fd for fd in (parent_fd, child_fd) if fd is not None]
    while True:
        ready, _, _ = select.select(fds, [], [], 0.05)
        if parent_fd in ready:
            os.kill(child, signal.SIGKILL)
        if os.waitpid(child, os.WNOHANG)[0] == child:
            os._exit(0)


def _join_cgroups(dirs):
    """Join the sandbox's cgroups (its whole memory and process budget, `budget.py`) before
    anything forks, so every process of the program is counted in them.

    A single-threaded launcher joins a cgroup v1 by writing "0" (this thread) to its `tasks`:
    its one thread is the whole process, and since Linux 6.0 that move skips the lock a
    whole-process move takes, which waits for every fork in progress on the machine (0.4 to
    8 ms a sandbox on the loaded 2-core machine; under 0.1 ms this way). Elsewhere, or with
    a second thread, the process moves whole through `cgroup.procs`."""
    single = len(os.listdir("/proc/self/task")) == 1
    for d in dirs:
        tasks = os.path.join(d, "tasks")  # cgroup v1 only
        if single and os.path.exists(tasks):
            name, value = tasks, "0"
        else:
            name, value = os.path.join(d, "cgroup.procs"), str(os.getpid())
        with open(name, "w") as f:
            f.write(value)


def main():
    launch(json.loads(sys.argv[1]))


def launch(cfg):
    """A: build the jail `cfg` describes (module docstring). Never returns."""
    global STATUS
    STATUS = cfg["status_fd"]
    os.set_inheritable(STATUS, False)
    if cfg.get("gate_fd") is not None:
        os.set_inheritable(cfg["gate_fd"], False)
    parent = cfg["parent"]
    _join_cgroups(cfg.get("cgroups", []))
    _die_with_parent(lambda: os.getppid() == parent)
    files = {}
    for name, src in cfg["files"].items():
        with open(src, "rb") as f:
            files[name] = f.read()
    if cfg["mode"] == "none":
        _write_files(files, cfg["workdir"])
        os.chdir(cfg["workdir"])
        _restrict(cfg["limits"])
        report("ready")
        _wait_for_gate(cfg)
        _exec(cfg["argv"])
    _enter_namespaces(cfg)
    lifeline, keep = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(keep)
        _init(cfg, files, lifeline)
    os.close(lifeline)
    if cfg.get("gate_fd") is not None:
        os.close(cfg["gate_fd"])  # C holds it
    report(f"pid {child}")  # for the trainer: when C is dead, so is every program process
    _watch(child, parent)


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:
        if STATUS >= 0:
            report(f"error {type(e).__name__}: {e}")
        os._exit(97)
