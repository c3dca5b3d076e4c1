"""`rlvr train | eval | export | plot | ablate | rm | config`: the command line. Config keys
are dotted overrides (`--algo.clip_high=0.28`); `rlvr train --help` lists every key with the
value the run would use and its documentation, `rlvr config show` the whole resolved config."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rlvr.cli.ablate import cmd_ablate
from rlvr.cli.arguments import split_overrides, train_request
from rlvr.cli.eval import cmd_eval
from rlvr.cli.plot import cmd_plot
from rlvr.cli.rm import cmd_rm
from rlvr.config.load import dump_yaml
from rlvr.config.schema import ConfigError
from rlvr.data.errors import DatasetError
from rlvr.models import progress_bars
from rlvr.rewards.combine import RewardError
from rlvr.rollout.server import ServerError
from rlvr.run.checkpoint import CheckpointError
from rlvr.run.distributed import torchrun_rank
from rlvr.run.health import TrainingHealthError


def cmd_train(argv: list[str]) -> int:
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


def cmd_config(argv: list[str]) -> int:
    """`rlvr config show [train arguments]`: the resolved config.yaml of that run, printed."""
    if not argv or argv[0] not in ("show",):
        if argv and argv[0] not in ("-h", "--help"):
            sys.stderr.write(f"rlvr config: unknown subcommand {argv[0]!r}; valid: show\n")
            return 2
        print(
            "usage: rlvr config show [rlvr train arguments]\n\n  show    the config those "
            "arguments would run (presets and the built-in model's defaults applied), as YAML"
        )
        return 0
    request = train_request(argv[1:], prog="rlvr config show")
    sys.stdout.write(dump_yaml(request.cfg))
    return 0


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


def cmd_export(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="rlvr export",
        description="Write a plain Hugging Face model from a run directory or a checkpoint; "
        "a LoRA adapter is merged into its base (--merge).",
    )
    p.add_argument("source", help="run directory (newest good checkpoint) or checkpoint directory")
    p.add_argument("--output", required=True, help="directory to write the model to")
    p.add_argument("--merge", action="store_true", help="merge a LoRA adapter into its base")
    args = p.parse_args(argv)
    import json as _json

    from rlvr.run.checkpoint import latest_good_checkpoint, verify_checkpoint
    from rlvr.training.policy import export_merged

    source = Path(args.source)
    if (source / "config.yaml").is_file() and (source / "checkpoints").is_dir():
        ckpt = latest_good_checkpoint(source)
        if ckpt is None:
            raise CheckpointError(f"{source}: no intact checkpoint to export")
    else:
        ckpt = source
        verify_checkpoint(ckpt)
    adapter = ckpt / "adapter_config.json"
    if adapter.is_file():
        if not args.merge:
            raise ConfigError(f"{ckpt} holds a LoRA adapter: pass --merge to fold it into its base")
        base = _json.loads(adapter.read_text())["base_model_name_or_path"]
        export_merged(ckpt, base, Path(args.output))
    else:
        from rlvr.models import load_model, load_tokenizer

        load_model(str(ckpt)).save_pretrained(args.output)
        load_tokenizer(str(ckpt)).save_pretrained(args.output)
    print(f"wrote {args.output}")
    return 0


COMMANDS = {
    "train": cmd_train,
    "eval": cmd_eval,
    "export": cmd_export,
    "plot": cmd_plot,
    "ablate": cmd_ablate,
    "rm": cmd_rm,
    "config": cmd_config,
}


def main(argv: list[str] | None = None) -> int:
    rc = _main(argv)
    if torchrun_rank():
        # A rank ends here without interpreter teardown: destroying gloo's process group can
        # deadlock on the GIL (distributed.shutdown), and leaving it to teardown aborts.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(
                f"rlvr: unknown command {argv[0]!r}; valid: {', '.join(COMMANDS)}", file=sys.stderr
            )
            return 2
        print(
            "usage: rlvr {train,eval,export,plot,ablate,rm,config} ...\n\n  train   train a policy with GRPO/DAPO "
            "(no arguments: the built-in offline demo)\n  eval    avg@k, pass@k, greedy accuracy "
            "of a model, run or checkpoint on a task or dataset\n  export  a run's model as a plain Hugging Face model "
            "(--merge folds in LoRA)\n  plot    training curves (PNG) from run directories\n"
            "  ablate  DAPO's ablation ladder (naive GRPO ... DAPO) over seeds, with a report\n"
            "  rm      train an outcome reward model on a policy's rule-labelled responses\n"
            "  config  config show [train arguments]: the config a run would use, as YAML\n"
            "\nrlvr COMMAND --help for details."
        )
        return 0
    quiet = "--no-progress" in argv
    if quiet:  # none of transformers' bars either (loading, saving shards), in child processes
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        with progress_bars(not quiet):  # and in this one, where transformers is imported
            return COMMANDS[argv[0]](argv[1:])
    except (ConfigError, FileNotFoundError, CheckpointError, DatasetError) as e:
        sys.stderr.write(f"error: {e}\n")  # plain text: a message may hold [brackets]
        return 2
    except RewardError as e:  # under reward.on_error=raise; on_error=zero scores it 0
        sys.stderr.write(f"error: {e} (reward.on_error=zero scores such samples 0)\n")
        return 1
    except (TrainingHealthError, ServerError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    except OSError as e:  # a read-only or full output directory, a file removed mid-run
        where = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"error: {where}{e.strerror or e}\n")
        return 2
