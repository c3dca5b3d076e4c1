"""`rlvr rm`: collect responses from a policy, label them with the rule, train a reward model.

    RUN_DIR/config.yaml, rm.yaml     the policy/task/sampling config and the rm.* keys
    RUN_DIR/data/train.jsonl, eval.jsonl   the rule-labelled responses (written once)
    RUN_DIR/metrics.jsonl            per optimiser step: rm/loss, ...; held-out rows per epoch
    RUN_DIR/checkpoints/step-N/      the reward model, tokenizer, optimiser (verified)
    RUN_DIR/model/                   the final reward model (the `reward_model` reward and
                                     `reward.model` load it; so does `reward.model=RUN_DIR`)
    RUN_DIR/summary.json             held-out accuracy and AUC against the rule labels

`--resume RUN_DIR` continues from the newest good checkpoint: the data is read back, the
batch order is a function of (seed, epoch), so the run ends with the weights of the
uninterrupted one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from rlvr.config.load import load_config, parse_overrides
from rlvr.config.safe_yaml import load_yaml, read_text
from rlvr.config.schema import ConfigError
from rlvr.rm.config import help_text, rm_config

SUMMARY = "train an outcome reward model on a policy's rule-labelled responses"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlvr rm",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train an outcome reward model on a policy's responses labelled by the "
        "rule reward (pointwise BCE or pairwise Bradley-Terry); training keys "
        "(--model.name_or_path, --data.task, --rollout.temperature, ...) pick the policy, "
        "task and sampling.",
        epilog="rm keys:\n" + help_text(),
    )
    p.add_argument("config", nargs="?", help="YAML file: training sections plus an rm: section")
    p.add_argument("--output-dir", help="run directory (default runs/<timestamp>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest checkpoint")
    p.add_argument("--seed", type=int, help="rm.seed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _configs(args, overrides: dict) -> tuple:
    """(training Config, RMConfig, resumed run directory or None)."""
    rm_changes = overrides.pop("rm", {})
    if args.seed is not None:
        rm_changes["seed"] = args.seed
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "rm.yaml").is_file():
            raise ConfigError(f"--resume: {run_dir} holds no rm.yaml (not an `rlvr rm` run)")
        if overrides or rm_changes or args.config:
            raise ConfigError("--resume: the run's keys cannot change (they are its math)")
        cfg = load_config(
            run_dir / "config.yaml", {"train": {"output_dir": str(run_dir.resolve())}}
        )
        return cfg, rm_config(_yaml_file(run_dir / "rm.yaml"), "rm.yaml"), run_dir
    file_rm = {}
    if args.config:
        raw = _yaml_file(args.config) or {}
        file_rm = raw.get("rm", {}) if isinstance(raw, dict) else {}
    from rlvr.run.stored_config import resolve_paths

    cfg = _without_rm_section(args.config, overrides)
    if args.output_dir:
        cfg = _with_output(cfg, args.output_dir)
    return resolve_paths(cfg), rm_config({**file_rm, **rm_changes}), None


def _yaml_file(path):
    """A YAML file read within the config budget (rlvr.config.safe_yaml): ConfigError otherwise."""
    return load_yaml(read_text(path), str(path))


def _without_rm_section(path, overrides):
    if path is None:
        return load_config(None, overrides)
    raw = _yaml_file(path) or {}
    raw.pop("rm", None)
    tmp = Path(path).with_name(f".{Path(path).name}.rlvr-rm.yaml")
    tmp.write_text(yaml.safe_dump(raw))
    try:
        return load_config(tmp, overrides)
    finally:
        tmp.unlink(missing_ok=True)


def _with_output(cfg, output_dir: str):
    import dataclasses

    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, output_dir=output_dir))


def run(argv: list[str]) -> int:
    from rlvr.cli.arguments import split_overrides

    over_argv, rest = split_overrides(argv)
    args, unknown = _parser().parse_known_args(rest)
    cfg, rcfg, resume = _configs(args, parse_overrides(over_argv + unknown))
    from rlvr.rm.run import run_reward_model, shown  # after parsing: --help needs no torch

    run_dir, summary = run_reward_model(cfg, rcfg, resume is not None, not args.no_progress)
    ev = summary["eval"]
    print(f"run directory: {run_dir}")
    print(
        f"held-out: accuracy {ev['accuracy']:.3f}, AUC {shown(ev['auc'])}, AUC on well-formed "
        f"responses {shown(ev['auc_well_formed'])} ({summary['wall_time_s']:.0f} s)"
    )
    return 0
