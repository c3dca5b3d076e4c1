"""`rlvr train`: train a policy, on this process or on `--nproc N` ranks under torchrun.
Config keys are dotted overrides (`--algo.clip_high=0.28`); `rlvr train --help` lists every
key with the value the run would use and its documentation."""

from __future__ import annotations

import argparse
import json
import os
import sys

from rlvr.cli.arguments import split_overrides, train_request
from rlvr.config.placement import check_ranks
from rlvr.run.launch import is_main_rank, launch, torchrun_rank

SUMMARY = "train a policy with GRPO/DAPO (no arguments: the built-in offline demo)"


def run(argv: list[str]) -> int:
    nproc = _nproc(argv)
    world = os.environ.get("WORLD_SIZE")
    if nproc > 1 and world not in (None, str(nproc)):  # not torchrun's ranks of this launch
        from rlvr.config.schema import ConfigError

        raise ConfigError(
            f"--nproc {nproc}: WORLD_SIZE={world} is set in this environment (a launcher's, or "
            f"one left by a library in this process): unset it to start {nproc} ranks"
        )
    if nproc > 1 and world is None:
        # every check here, in the launcher: a refused config is one line, no rank started
        cfg = train_request(argv).cfg
        check_ranks(cfg, nproc)
        _check_engine(cfg, nproc)
        return launch(nproc, argv)
    request = train_request(argv)
    args, cfg = request.args, request.cfg
    if request.note and is_main_rank():
        sys.stderr.write(request.note + "\n")
    from rlvr.training.trainer import no_eval_reason, train

    run_dir = train(
        cfg,
        resume_dir=request.resume,
        show_progress=not args.no_progress,
        destroy_process_group=not torchrun_rank(),  # main() ends a rank with os._exit
    )
    summary = run_dir / "summary.json"
    if request.resume is None and summary.exists() and is_main_rank():
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


def _check_engine(cfg, nproc: int) -> None:
    """The engine's limits, checked before the ranks start (inside them each rank would
    print its own error): for vllm, an install that runs on this device with N ranks, and a
    model whose attention vLLM's CPU backend runs."""
    if cfg.rollout.engine != "vllm":
        return
    from rlvr.config.schema import ConfigError
    from rlvr.rollout.vllm_release import VLLMEngineError, check_environment, check_model
    from rlvr.training.setup import resolve_device

    device = resolve_device(cfg.model.device)
    try:
        # server mode: vLLM runs in its servers, none in the ranks
        server = cfg.rollout.vllm.mode == "server"
        check_environment(device, 1 if server else nproc)
        check_model(cfg.model.name_or_path, device)
    except VLLMEngineError as e:
        raise ConfigError(str(e)) from None


def _nproc(argv: list[str]) -> int:
    """`--nproc N` / `--nproc=N` (1 when absent), read before the config is."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--nproc", type=int, default=1)
    return p.parse_known_args(split_overrides(argv)[1])[0].nproc
