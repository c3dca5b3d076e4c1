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
import json
import time
from pathlib import Path

import torch
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from rlvr.config.load import load_config, parse_overrides
from rlvr.config.safe_yaml import load_yaml, read_text
from rlvr.config.schema import ConfigError
from rlvr.rm.config import RMConfig, dump, help_text, rm_config
from rlvr.rm.fit import fit, make_optimizer, steps_per_epoch
from rlvr.rm.metrics import rm_metrics
from rlvr.rm.model import RewardModel
from rlvr.rm.records import Record, read_records, write_records
from rlvr.run.checkpoint import load_trainer_state, resume_checkpoint, save_checkpoint
from rlvr.run.private import narrow, open_private, private_dir, write_private
from rlvr.run.rundir import prepare_run_dir, truncate_jsonl, unlock_run_dir

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
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    run_dir = prepare_run_dir(cfg, resume=resume is not None)
    try:
        if resume is None:
            write_private(run_dir / "rm.yaml", dump(rcfg))
        summary = train_reward_model(cfg, rcfg, run_dir, resume is not None, not args.no_progress)
    finally:
        unlock_run_dir(run_dir)
    ev = summary["eval"]
    print(f"run directory: {run_dir}")
    print(
        f"held-out: accuracy {ev['accuracy']:.3f}, AUC {_fmt(ev['auc'])}, AUC on well-formed "
        f"responses {_fmt(ev['auc_well_formed'])} ({summary['wall_time_s']:.0f} s)"
    )
    return 0


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def collect_data(cfg, rcfg: RMConfig, run_dir: Path, console: Console) -> tuple[list, list]:
    """The labelled train and held-out responses: read back when written, else sampled."""
    paths = run_dir / "data" / "train.jsonl", run_dir / "data" / "eval.jsonl"
    if all(p.is_file() for p in paths):
        return read_records(paths[0]), read_records(paths[1])
    import dataclasses

    from rlvr.data.prompts import load_prompts
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rewards.scoring import Scorer
    from rlvr.rm.collect import sample_records
    from rlvr.rollout import build_engine

    data = dataclasses.replace(cfg.data, train_size=max(cfg.data.train_size, rcfg.train_prompts))
    train = dataclasses.replace(cfg.train, eval_size=rcfg.eval_prompts)
    rollout = dataclasses.replace(cfg.rollout, prompts_per_step=1)
    cfg = dataclasses.replace(cfg, data=data, train=train, rollout=rollout)
    tok = load_tokenizer(cfg.model.name_or_path)
    model = load_model(cfg.model.name_or_path, dtype=cfg.model.dtype).eval()
    source = load_prompts(cfg, tok, getattr(model.config, "max_position_embeddings", None))
    engine = build_engine(cfg, model, tok)  # the model's device, no tools
    scorer = Scorer.build(cfg, source.task, has_answer=source.has_answer)
    n, seed = rcfg.samples_per_prompt, rcfg.seed
    console.print(f"sampling {n} responses to {rcfg.train_prompts} + {len(source.eval)} prompts")
    records = sample_records(
        engine, tok, scorer, source.train[: rcfg.train_prompts], cfg, n=n, seed=seed, split="train"
    )
    held_out = sample_records(
        engine, tok, scorer, source.eval[: rcfg.eval_prompts], cfg, n=n, seed=seed, split="eval",
        first_group=len(source.train),
    )  # fmt: skip
    write_records(paths[1], held_out)
    write_records(paths[0], records)
    return records, held_out


def evaluate_rm(rm: RewardModel, records: list[Record]) -> dict:
    logits = rm.score([r.prompt for r in records], [r.response for r in records])
    labels = torch.tensor([r.correct for r in records])
    wf = torch.tensor([r.well_formed for r in records])
    return rm_metrics(logits, labels, wf)


def train_reward_model(cfg, rcfg: RMConfig, run_dir: Path, resume: bool, progress: bool) -> dict:
    console = Console(stderr=True, soft_wrap=True)
    t0 = time.time()
    records, held_out = collect_data(cfg, rcfg, run_dir, console)
    t_data = time.time() - t0
    ckpt = resume_checkpoint(run_dir, rcfg.save_every, warn=console.print) if resume else None
    backbone = rcfg.backbone or cfg.model.name_or_path
    if ckpt is None:
        try:
            rm = RewardModel.from_backbone(
                backbone, rcfg.seed, rcfg.max_length, rcfg.extra_layers, rcfg.arch,
                [r.prompt for r in records],
            )  # fmt: skip
        except ValueError as e:
            raise ConfigError(str(e)) from None
        start, opt_state = 0, None
        truncate_jsonl(run_dir / "metrics.jsonl", 0)
    else:
        rm = RewardModel.load(ckpt, rcfg.max_length)
        state = load_trainer_state(ckpt, required=("step", "optimizer"))
        start, opt_state = state["step"], state["optimizer"]
        truncate_jsonl(run_dir / "metrics.jsonl", start, one_per_step=True)
        console.print(f"resuming {run_dir} from {ckpt.name} (step {start})")
    optimizer = make_optimizer(rm, rcfg.lr)
    if opt_state is not None:
        optimizer.load_state_dict(opt_state)
    per_epoch = steps_per_epoch(records, rcfg.batch_groups)
    total = per_epoch * rcfg.epochs
    bar = Progress(
        TextColumn("[bold]rm step"), MofNCompleteColumn(), BarColumn(),
        TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
        console=console, disable=not progress,
    )  # fmt: skip
    task = bar.add_task("rm", total=total, completed=start, info="")
    with open_private(run_dir / "metrics.jsonl", "a") as log, bar:

        def on_step(step: int, row: dict) -> None:
            if step % per_epoch == 0:  # an epoch's end: the held-out numbers
                ev = evaluate_rm(rm, held_out)
                row.update({f"eval/{k}": v for k, v in ev.items()})
            log.write(json.dumps({"step": step, **row}) + "\n")
            log.flush()
            info = f"loss {row['rm/loss']:.4f}"
            if "eval/auc" in row:
                info += f"  eval auc {_fmt(row['eval/auc'])}"
            bar.update(task, completed=step, info=info)
            if (rcfg.save_every and step % rcfg.save_every == 0) or step == total:
                save_checkpoint(run_dir, step, rm.model, rm.tokenizer,
                                {"optimizer": optimizer.state_dict()}, keep=2)  # fmt: skip

        fit(rm, records, optimizer, loss=rcfg.loss, epochs=rcfg.epochs,
            batch_groups=rcfg.batch_groups, seed=rcfg.seed, start_step=start, on_step=on_step)  # fmt: skip
    rm.save(private_dir(run_dir / "model"))
    narrow(run_dir / "model")  # save_pretrained's files, inside a 0700 directory
    summary = {
        "eval": evaluate_rm(rm, held_out),
        "train": evaluate_rm(rm, records),
        "loss": rcfg.loss,
        "arch": rcfg.arch,
        "steps": total,
        "train_responses": len(records),
        "eval_responses": len(held_out),
        "policy": cfg.model.name_or_path,
        "backbone": backbone,
        "task": cfg.data.path or cfg.data.task,
        "temperature": cfg.rollout.temperature,
        "model_dir": str(run_dir / "model"),
        "data_time_s": t_data,
        "wall_time_s": time.time() - t0,
    }
    write_private(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary
