"""Sandbox launcher: runs before the untrusted program, sets up its jail, then execs it.

Started by `rlvr.rewards.sandbox` as `python -I -S _sandbox_init.py CONFIG_JSON`, inside
`unshare --net --mount --pid --fork --kill-child` (plus `--user --map-root-user` when not
root). It imports only the standard library. Steps, all before any untrusted byte runs:

  1. make every mount private, so nothing below leaks to the host;
  2. mount a small tmpfs as the new root, bind the Python installation, /usr, /lib*, and
     /dev/{null,zero,urandom} into it read-only and nosuid, and mount a second size-limited
     tmpfs at /tmp (the program's working directory, the only writable place);
  3. chroot into it, chdir /tmp;
  4. set the resource limits;
  5. drop privileges: as real root, switch to an unprivileged uid/gid that owns no files and
     no other process (RLIMIT_NPROC then counts only this sandbox); inside a user namespace,
     enter a second, nested user namespace, which leaves no capability over the mounts;
     then PR_SET_NO_NEW_PRIVS, so no setuid binary can give privileges back;
  6. fork (see main) and exec the program with an empty environment.
mode "none" (no namespaces) does only steps 4 and 6, in a plain temporary directory.
"""

import ctypes
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 1, 2, 4, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38

libc = ctypes.CDLL(None, use_errno=True)


def _call(name, *args):
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args!r}: {os.strerror(err)}")


def _mount(src, dst, fstype, flags, data=None):
    enc = [None if x is None else x.encode() for x in (src, dst, fstype, data)]
    _call("mount", enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3])


def _bind_ro(src, root):
    dst = root + src
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    _mount(src, dst, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
    if not src.startswith("/dev/"):
        flags |= MS_NODEV
    _mount(None, dst, None, flags)


def _jail(cfg):
    root = cfg["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for path in cfg["links"]:
        os.symlink(os.readlink(path), root + path)
    for path in cfg["binds"]:
        _bind_ro(path, root)
    tmp = root + "/tmp"
    os.makedirs(tmp, exist_ok=True)
    _mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmp_bytes']},mode=700")
    _install_files(cfg, tmp)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    os.chroot(root)
    os.chdir("/tmp")


def _install_files(cfg, workdir):
    for name, src in cfg["files"].items():
        dst = os.path.join(workdir, name)
        with open(src, "rb") as f, open(dst, "wb") as g:
            g.write(f.read())
    uid = cfg["uid"]
    if uid is not None:
        os.chown(workdir, uid, uid)
        for name in cfg["files"]:
            os.chown(os.path.join(workdir, name), uid, uid)


def _limits(lim):
    for name, value in lim.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def main():
    cfg = json.loads(sys.argv[1])
    if cfg["mode"] == "none":
        _install_files(cfg, cfg["workdir"])
        os.chdir(cfg["workdir"])
    else:
        _jail(cfg)
    _limits(cfg["limits"])
    if cfg["mode"] == "root":
        uid = cfg["uid"]
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    elif cfg["mode"] == "userns":
        _call("unshare", CLONE_NEWUSER)
    _call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if cfg["mode"] != "none":
        # This process is pid 1 of the new pid namespace, which the kernel shields from
        # signals it has no handler for (RLIMIT_CPU's SIGXCPU included): run the program as
        # pid 2 and pass on its fate. When pid 1 exits, the kernel kills the whole namespace.
        pid = os.fork()
        if pid:
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)
    os.execve(cfg["argv"][0], cfg["argv"], {})


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:
        # exit status 97 tells the runner that the jail, not the program, failed
        os.write(2, f"rlvr sandbox setup failed: {type(e).__name__}: {e}\n".encode())
        os._exit(97)
