"""One `rlvr rm` run (docs/iterative_rl.md): collect a policy's responses, label them with the
rule reward, train the reward model on them, evaluate it; the files are those `rlvr.cli.rm`
lists."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from rlvr.config.schema import ConfigError
from rlvr.rm.config import RMConfig, dump
from rlvr.rm.fit import fit, make_optimizer, steps_per_epoch
from rlvr.rm.metrics import rm_metrics
from rlvr.rm.model import RewardModel
from rlvr.rm.records import Record, read_records, write_records
from rlvr.run.checkpoint import load_trainer_state, resume_checkpoint, save_checkpoint
from rlvr.run.private import narrow, open_private, private_dir, write_private
from rlvr.run.rundir import prepare_run_dir, truncate_jsonl, unlock_run_dir


def shown(x: float | None) -> str:
    """A metric as printed: three decimals, "n/a" when undefined (AUC of one class)."""
    return "n/a" if x is None else f"{x:.3f}"


def run_reward_model(cfg, rcfg: RMConfig, resume: bool, progress: bool) -> tuple[Path, dict]:
    """(the run directory, its summary): the whole run, resumed when `resume`."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    run_dir = prepare_run_dir(cfg, resume=resume)
    try:
        if not resume:
            write_private(run_dir / "rm.yaml", dump(rcfg))
        return run_dir, train_reward_model(cfg, rcfg, run_dir, resume, progress)
    finally:
        unlock_run_dir(run_dir)


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
    try:
        records = sample_records(
            engine, tok, scorer, source.train[: rcfg.train_prompts], cfg, n=n, seed=seed,
            split="train",
        )  # fmt: skip
        held_out = sample_records(
            engine, tok, scorer, source.eval[: rcfg.eval_prompts], cfg, n=n, seed=seed,
            split="eval", first_group=len(source.train),
        )  # fmt: skip
    finally:
        engine.close()  # what it started (launched vLLM servers) ends with the sampling
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
                info += f"  eval auc {shown(row['eval/auc'])}"
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
