"""`rlvr train | eval`: the command line. Config keys are dotted overrides (`--algo.clip_high=0.28`);
`rlvr train --help` lists every key with its default and documentation."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from rlvr.ablate import cmd_ablate
from rlvr.config import ConfigError, help_text, load_config, parse_overrides
from rlvr.data import DatasetError
from rlvr.evaluate import cmd_eval
from rlvr.plots import cmd_plot
from rlvr.rewards.combine import RewardError
from rlvr.rm.command import cmd_rm
from rlvr.run.checkpoint import CheckpointError
from rlvr.run.distributed import torchrun_rank
from rlvr.run.health import TrainingHealthError
from rlvr.run.stored_config import (
    RESUME_SAFE,
    check_run_code,
    pop_code_overrides,
    resolve_paths,
)

TRAIN_EPILOG = "config keys (override with --section.key=value):\n"


def _train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlvr train",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train with GRPO / DAPO. With no arguments: the dapo preset on the built-in "
        "tiny model and the built-in arithmetic task, on the CPU.",
        epilog=TRAIN_EPILOG + help_text(),
    )
    p.add_argument("config", nargs="?", help="YAML file holding changes to the preset")
    p.add_argument("--preset", help="grpo, dapo (default) or dr_grpo")
    p.add_argument("--output-dir", help="run directory (default runs/<timestamp>)")
    p.add_argument("--max-steps", type=int, help="rollout steps (train.max_steps)")
    p.add_argument("--seed", type=int, help="run seed (train.seed)")
    p.add_argument("--save-every", type=int, help="checkpoint interval in steps (train.save_every)")
    p.add_argument(
        "--resume", metavar="RUN_DIR", help="continue a run from its newest good checkpoint"
    )
    p.add_argument(
        "--trust-run-code",
        action="store_true",
        help="--resume: import the rewards and tools (module:function, file.py:function) the "
        "run's config.yaml names without naming them again",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="data-parallel processes on this machine (launches torchrun)",
    )
    return p


# `--section.key=value`: taken out before argparse, which reads any argument holding a space
# as a positional one (the config file), so `--data.prompt_template={question} Answer now.`
# as one argv element stays an override.
_OVERRIDE = re.compile(r"--?[A-Za-z_]\w*\.[A-Za-z_]\w*=")


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(override arguments, the rest)."""
    overrides = [a for a in argv if _OVERRIDE.match(a)]
    return overrides, [a for a in argv if not _OVERRIDE.match(a)]


def cmd_train(argv: list[str]) -> int:
    overrides_argv, rest_argv = split_overrides(argv)
    args, rest = _train_parser().parse_known_args(rest_argv)
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        return _launch_torchrun(args.nproc, argv)
    overrides = parse_overrides(overrides_argv + rest)
    for key, section, value in (
        ("max_steps", "train", args.max_steps),
        ("seed", "train", args.seed),
        ("output_dir", "train", args.output_dir),
        ("save_every", "train", args.save_every),
    ):
        if value is not None:
            overrides.setdefault(section, {})[key] = value
    from rlvr.train.trainer import train

    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"--resume: {run_dir} holds no config.yaml (not a run directory)")
        named = pop_code_overrides(overrides)
        bad = [
            f"{s}.{k}"
            for s, kv in overrides.items()
            for k in kv
            if (s, k) not in RESUME_SAFE and not (s == "train" and k == "output_dir")
        ]
        if bad or args.config or args.preset:
            raise ConfigError(
                f"--resume: cannot change {', '.join(bad) or 'the config/preset'} "
                f"(it would change the run's math); allowed: "
                f"{', '.join(f'{s}.{k}' for s, k in sorted(RESUME_SAFE))}"
            )
        overrides.setdefault("train", {})["output_dir"] = str(run_dir.resolve())
        cfg = load_config(run_dir / "config.yaml", overrides)
        note = check_run_code(cfg, named, args.trust_run_code, f"--resume {run_dir}")
        if note:
            sys.stderr.write(note + "\n")
        train(
            cfg,
            resume_dir=run_dir,
            show_progress=not args.no_progress,
            destroy_process_group=not torchrun_rank(),  # main() ends a rank with os._exit
        )
        return 0
    # local paths made absolute: config.yaml then resumes from any working directory
    cfg = resolve_paths(load_config(args.config, overrides, preset=args.preset))
    run_dir = train(
        cfg, show_progress=not args.no_progress, destroy_process_group=not torchrun_rank()
    )
    summary = run_dir / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        print(f"run directory: {run_dir}")
        before, after = s["eval_before"].get("accuracy"), s["eval_after"].get("accuracy")
        if before is None or after is None:  # train.eval_size=0: no held-out evaluation
            print(f"{s['steps']} steps, {s['wall_time_s']:.0f} s (no held-out evaluation)")
        else:
            print(
                f"held-out accuracy: {before:.3f} -> {after:.3f} ({s['steps']} steps, "
                f"{s['wall_time_s']:.0f} s)"
            )
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
    from rlvr.train.policy import export_merged

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
            "usage: rlvr {train,eval,export,plot,ablate,rm} ...\n\n  train   train a policy with GRPO/DAPO "
            "(no arguments: the built-in offline demo)\n  eval    avg@k, pass@k, greedy accuracy "
            "of a model, run or checkpoint on a task or dataset\n  export  a run's model as a plain Hugging Face model "
            "(--merge folds in LoRA)\n  plot    training curves (PNG) from run directories\n"
            "  ablate  DAPO's ablation ladder (naive GRPO ... DAPO) over seeds, with a report\n"
            "  rm      train an outcome reward model on a policy's rule-labelled responses\n"
            "\nrlvr COMMAND --help for details."
        )
        return 0
    if "--no-progress" in argv:  # none of transformers' bars either (loading, saving shards)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        return COMMANDS[argv[0]](argv[1:])
    except (ConfigError, FileNotFoundError, CheckpointError, DatasetError) as e:
        sys.stderr.write(f"error: {e}\n")  # plain text: a message may hold [brackets]
        return 2
    except RewardError as e:  # under reward.on_error=raise; on_error=zero scores it 0
        sys.stderr.write(f"error: {e} (reward.on_error=zero scores such samples 0)\n")
        return 1
    except TrainingHealthError as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    except OSError as e:  # a read-only or full output directory, a file removed mid-run
        where = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"error: {where}{e.strerror or e}\n")
        return 2
