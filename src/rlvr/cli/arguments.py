"""The command line's shared pieces: dotted overrides taken out before argparse, and
`rlvr train`'s arguments resolved into the config that would run, which `rlvr train --help`
and `rlvr config show` print (presets and the built-in model's defaults applied)."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from rlvr.config.load import help_text, load_config, parse_overrides
from rlvr.config.presets import preset_names
from rlvr.config.schema import Config, ConfigError
from rlvr.run.stored_config import RESUME_SAFE, check_run_code, pop_code_overrides, resolve_paths

# `--section.key=value`: taken out before argparse, which reads any argument holding a space
# as a positional one (the config file), so `--data.prompt_template={question} Answer now.`
# as one argv element stays an override.
_OVERRIDE = re.compile(r"--?[A-Za-z_]\w*\.[A-Za-z_]\w*=")


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(override arguments, the rest)."""
    overrides = [a for a in argv if _OVERRIDE.match(a)]
    return overrides, [a for a in argv if not _OVERRIDE.match(a)]


def train_parser(prog: str = "rlvr train", shown: Config | None = None) -> argparse.ArgumentParser:
    """`rlvr train`'s arguments; `shown` is the config whose values the help lists (the
    default run's when None)."""
    p = argparse.ArgumentParser(
        prog=prog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train with GRPO / DAPO. With no arguments: the dapo preset on the built-in "
        "tiny model and the built-in arithmetic task, on the CPU.",
        epilog="config keys, with the values this run would use (override with "
        "--section.key=value):\n" + help_text(shown or load_config(None, check=False)),
    )
    p.add_argument("config", nargs="?", help="YAML file holding changes to the preset")
    p.add_argument("--preset", help=f"one of {preset_names()}")
    p.add_argument("--output-dir", help="run directory (default runs/<timestamp>)")
    p.add_argument("--max-steps", type=int, help="rollout steps (train.max_steps)")
    p.add_argument("--seed", type=int, help="run seed (train.seed)")
    p.add_argument(
        "--agent",
        metavar="MODULE:FUNCTION",
        help="fn(client, row) -> reward makes each rollout through the run's OpenAI-compatible "
        "endpoint (env.agent; docs/environments.md)",
    )
    p.add_argument(
        "--env",
        metavar="KIND:TARGET",
        help="an environment of another framework gives the prompts, rollouts and rewards, "
        "e.g. verifiers:my_env:load_environment (env.environment; docs/environments.md)",
    )
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
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar: a plain line every train.log_every steps instead",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="data-parallel processes on this machine (launches torchrun)",
    )
    return p


@dataclass(frozen=True)
class TrainRequest:
    """`rlvr train`'s arguments: the parsed flags, the config that would run and, resuming,
    the run directory and which of the run's own code it imports (`note`)."""

    args: argparse.Namespace
    cfg: Config
    resume: Path | None
    note: str | None = None


def train_request(argv: list[str], prog: str = "rlvr train", check: bool = True) -> TrainRequest:
    """Parse `rlvr train`'s arguments and resolve the config they run (ConfigError when
    they do not validate; `check=False` resolves without judging, for help). `--help` lists
    the values of this config, or of the default run when the other arguments do not resolve."""
    if "-h" in argv or "--help" in argv:
        rest = [a for a in argv if a not in ("-h", "--help")]
        try:
            shown = train_request(rest, prog, check=False).cfg
        except (ConfigError, FileNotFoundError):
            shown = None
        train_parser(prog, shown).parse_args(["--help"])  # prints and exits
    overrides_argv, rest_argv = split_overrides(argv)
    args, rest = train_parser(prog, Config()).parse_known_args(rest_argv)
    overrides = parse_overrides(overrides_argv + rest)
    for key, value in (
        ("max_steps", args.max_steps),
        ("seed", args.seed),
        ("output_dir", args.output_dir),
        ("save_every", args.save_every),
    ):
        if value is not None:
            overrides.setdefault("train", {})[key] = value
    if args.agent is not None:
        overrides.setdefault("env", {})["agent"] = args.agent
    if args.env is not None:
        overrides.setdefault("env", {})["environment"] = args.env
    if not args.resume:
        # local paths made absolute: config.yaml then resumes from any working directory
        cfg = resolve_paths(load_config(args.config, overrides, preset=args.preset, check=check))
        return TrainRequest(args, cfg, None)
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
    cfg = load_config(run_dir / "config.yaml", overrides, check=check)
    note = check_run_code(cfg, named, args.trust_run_code, f"--resume {run_dir}")
    return TrainRequest(args, cfg, run_dir, note)
