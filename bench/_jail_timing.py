"""The sandbox's zygote with each step of the jail timed, for `bench/code_reward.py`'s breakdown.

Started in place of `jail_zygote.py` (same argument, the socket's descriptor), it imports the
checkout's sandbox `jail_zygote` and `jail_init`, wraps the steps below with a timer, and
serves as the real zygote does. Each timed step appends "name start_ns end_ns" (the monotonic
clock, which every process of the machine shares) to /tmp/rlvr-jail-timing-<trainer pid>,
through a descriptor the launcher and the jail's init inherit; the program's process closes
it before it runs anything (`run_here` closes every descriptor above 2), so the program never
holds it. The steps run unchanged: a jail built here is the jail the trainer gets.
"""

import functools
import os
import sys
import time

SANDBOX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src/rlvr/rewards/sandbox")
sys.path.insert(0, os.path.realpath(SANDBOX))  # started with -I -S: the checkout's sandbox
import jail_init  # noqa: E402
import jail_zygote  # noqa: E402

LOG = os.open(
    f"/tmp/rlvr-jail-timing-{os.getppid()}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
)

# jail_init's steps: A's (cgroups, namespaces, fork of the init) and C's, in order
STEPS = {
    jail_init: ("_join_cgroups", "_enter_namespaces", "_open_sources", "_own_keyring", "_jail",
                "_drop_capabilities", "_restrict", "_refuse_syscalls", "_wait_for_gate",
                "_wait_exit"),
    jail_zygote: ("_fork_launcher", "_ask_for_maps"),
}  # fmt: skip


def _timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.monotonic_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            os.write(LOG, f"{name} {t0} {time.monotonic_ns()}\n".encode())

    return wrapper


def _mark(name):
    t = time.monotonic_ns()
    os.write(LOG, f"{name} {t} {t}\n".encode())


def _report(line, original=jail_init.report):
    _mark("status:" + line.split()[0])
    original(line)


def _run_here(argv, original=jail_zygote.run_here):
    _mark("program process starts")
    original(argv)


def main():
    for module, names in STEPS.items():
        for name in names:
            setattr(module, name, _timed(name, getattr(module, name)))
    jail_init.report = _report
    jail_zygote.run_here = _run_here
    jail_zygote.main()


if __name__ == "__main__":
    main()
