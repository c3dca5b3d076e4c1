"""`rlvr train`: train a policy, on this process or on `--nproc N` ranks under torchrun.
Config keys are dotted overrides (`--algo.clip_high=0.28`); `rlvr train --help` lists every
key with the value the run would use and its documentation."""

from __future__ import annotations

import argparse
import json
import os
import sys

from rlvr.cli.arguments import split_overrides, train_request
from rlvr.run.distributed import torchrun_rank

SUMMARY = "train a policy with GRPO/DAPO (no arguments: the built-in offline demo)"


def run(argv: list[str]) -> int:
    if _nproc(argv) > 1 and "WORLD_SIZE" not in os.environ:
        train_request(argv)  # a config error is one line here, not one per rank
        return _launch_torchrun(_nproc(argv), argv)
    request = train_request(argv)
    args, cfg = request.args, request.cfg
    if request.note:
        sys.stderr.write(request.note + "\n")
    from rlvr.training.trainer import no_eval_reason, train

    run_dir = train(
        cfg,
        resume_dir=request.resume,
        show_progress=not args.no_progress,
        destroy_process_group=not torchrun_rank(),  # main() ends a rank with os._exit
    )
    summary = run_dir / "summary.json"
    if request.resume is None and summary.exists():
        s = json.loads(summary.read_text())
        print(f"run directory: {run_dir}")
        before, after = s["eval_before"].get("accuracy"), s["eval_after"].get("accuracy")
        if before is None or after is None:
            print(
                f"{s['steps']} steps, {s['wall_time_s']:.0f} s "
                f"(no held-out evaluation: {no_eval_reason(cfg)})"
            )
        else:
            print(
                f"held-out accuracy: {before:.3f} -> {after:.3f} ({s['steps']} steps, "
                f"{s['wall_time_s']:.0f} s)"
            )
    return 0


def _nproc(argv: list[str]) -> int:
    """`--nproc N` / `--nproc=N` (1 when absent), read before the config is."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--nproc", type=int, default=1)
    return p.parse_known_args(split_overrides(argv)[1])[0].nproc


def _launch_torchrun(nproc: int, argv: list[str]) -> int:
    """`rlvr train --nproc N ...` = `torchrun --standalone --nproc-per-node N -m rlvr train ...`,
    all on loopback: torchrun would otherwise give the ranks this machine's hostname as
    MASTER_ADDR, and where that name does not resolve (containers, CI sandboxes) every rank
    waits out the store's 300 s connect timeout."""
    import socket
    import subprocess

    rest, skip = [], False
    for a in argv:  # drop --nproc N / --nproc=N, keep everything else as given
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            rest.append(a)
    cmd = [
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
    env = dict(os.environ)
    loopback = [n for _, n in socket.if_nameindex() if n.startswith("lo")]
    if loopback and "GLOO_SOCKET_IFNAME" not in env:  # gloo binds by hostname too
        env["GLOO_SOCKET_IFNAME"] = loopback[0]
    return subprocess.call(cmd, env=env)
