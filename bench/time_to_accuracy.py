"""Time to 90% held-out accuracy: rlvr's default run against TRL's GRPOTrainer.

    python bench/time_to_accuracy.py                        # rlvr-tiny, budget 30 min a run
    python bench/time_to_accuracy.py --max-minutes 10 --eval-every 5
    python bench/time_to_accuracy.py --model random-tiny --max-minutes 1   # test the script

rlvr: `rlvr train` with no arguments (preset dapo on the built-in arithmetic task with the
built-in `rlvr-tiny` model and its tiny defaults), with `train.eval_every` set so accuracy is
tracked, `train.max_steps` raised so the time budget rather than the default 60 steps ends a
run that has not reached the target (the schedule does not depend on max_steps, so the
first 60 steps are the default run's), and nothing else changed.

TRL: as close as it allows. Same model files, tokenizer, training prompts (the task's train
split, rendered by the same chat template), reward (the task verifier, 1 correct / -1 wrong,
plus DAPO's soft overlong punishment with the same L_max and L_cache via TRL's
`get_soft_overlong_punishment`), 16 prompts x G=8 per step, temperature, max completion
length, lr, warm-up length, grad-norm clip, AdamW betas and weight decay, `loss_type="dapo"`
(token-mean over the batch), clip 0.2 / `epsilon_high` 0.28, beta 0, `mask_truncated_completions`
(rlvr's overlong filter), one optimiser step per generation batch, same threads, no gradient checkpointing (on by
default in TRL). What TRL
lacks: dynamic sampling (rlvr keeps only groups with mixed outcomes, refilling from up to 4
generation batches); its warm-up starts at lr 0 where rlvr's starts at lr / warmup_steps.

Both are evaluated by rlvr's own evaluator (`rlvr.training.evaluation.evaluate`, the same held-out
prompts, engine, sampling parameters and seed): rlvr every `eval_every` steps inside its
run; TRL from a callback on the live model every `eval_every` optimiser steps. Time to
target = wall time from the start of training (after loading and rlvr's initial evaluation)
to the end of the step whose evaluation first reaches `--target`, minus the time spent in
evaluations: only training is timed. Each run is a subprocess with `--max-minutes` of
training time; a run that does not reach the target reports the budget as a lower bound.
With `--repeats N` the runs alternate (rlvr, TRL, rlvr, ...) and the medians are compared.

The learning rate is a setting a TRL user would tune for TRL: `--trl-lrs 2e-4,3e-4,5e-4` runs
TRL once per value (rlvr keeps its default) and also compares rlvr with TRL's best of them
(`speedup_vs_trl_best_lr`), so a gap cannot come from an lr that suits only rlvr.

The last line printed is one JSON object: `speedup_time_to_accuracy` (TRL time / rlvr time;
a lower bound when TRL did not reach the target, flagged by `trl_reached`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from _shared import peak_rss_mib, set_threads, trl_dataset, trl_task_reward  # noqa: E402


class _Stop(Exception):
    """Raised inside rlvr's loop once the target is reached or the budget is spent."""


def rlvr_config(args):
    from rlvr.config.load import load_config
    from rlvr.config.presets import TINY_DEFAULTS

    overrides: dict = {
        "model": {"name_or_path": args.model_path},
        "train": {
            "eval_every": args.eval_every,
            "max_steps": args.max_steps,
            "output_dir": str(Path(args.work_dir) / "rlvr"),
            "seed": args.seed,
        },
    }
    if args.model_path != "rlvr-tiny":  # a test model: keep the built-in model's defaults
        for section, values in TINY_DEFAULTS.items():
            overrides[section] = {**values, **overrides.get(section, {})}
        overrides["train"]["max_steps"] = args.max_steps
    if args.lr is not None:  # a TRL run at another learning rate (--trl-lrs)
        overrides["optim"] = {**overrides.get("optim", {}), "lr": args.lr}
    return load_config(None, overrides)


class Clock:
    """Training time: wall time since `start()`, minus the time spent in evaluations."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.in_eval = 0.0
        self.curve: list[dict] = []
        self.reached: dict | None = None

    def start(self) -> None:
        self.t0, self.in_eval = time.perf_counter(), 0.0

    def train_seconds(self) -> float:
        return time.perf_counter() - self.t0 - self.in_eval

    def record(self, step: int, ev: dict, eval_s: float, train_s: float, target: float) -> bool:
        self.in_eval += eval_s
        row = {"step": step, "train_s": train_s, "accuracy": ev.get("accuracy", 0.0)}
        self.curve.append(row)
        print(f"  step {step:4d}  train {train_s:7.1f} s  held-out acc {row['accuracy']:.3f}")
        sys.stdout.flush()
        if self.reached is None and row["accuracy"] >= target:
            self.reached = row
            return True
        return False


def child_rlvr(args) -> dict:
    import rlvr.training.setup as rs  # builds the run: its tokenizer loader, Run.evaluate
    import rlvr.training.trainer as rt  # the loop: run_step

    cfg = rlvr_config(args)
    clock = Clock()
    state = {"step": 0, "samples": 0, "gen_batches": 0}
    run_step, evaluate = rt.run_step, rs.evaluate

    def counted_run_step(*a, **k):
        if clock.train_seconds() > args.max_minutes * 60:
            raise _Stop
        metrics, examples = run_step(*a, **k)
        state["step"] += 1
        groups = metrics.get("groups/generated")  # refill batches may be smaller than a step's
        if groups is None:
            groups = metrics.get("groups/gen_batches", 1) * cfg.rollout.prompts_per_step
        state["samples"] += int(groups) * cfg.rollout.group_size
        state["gen_batches"] += int(metrics.get("groups/gen_batches", 1))
        return metrics, examples

    def timed_evaluate(*a, **k):
        train_s = clock.train_seconds()
        t0 = time.perf_counter()
        ev = evaluate(*a, **k)
        dur = time.perf_counter() - t0
        if state["step"] == 0 and not clock.curve:  # the evaluation before training
            clock.record(0, ev, 0.0, 0.0, args.target)
            clock.start()
            return ev
        if clock.curve and clock.curve[-1]["step"] == state["step"]:  # the final evaluation
            clock.in_eval += dur
            return ev
        if clock.record(state["step"], ev, dur, train_s, args.target):
            raise _Stop
        return ev

    rt.run_step, rs.evaluate = counted_run_step, timed_evaluate
    with contextlib.suppress(_Stop):  # the target reached, or the budget spent
        rt.train(cfg, show_progress=False)
    return {
        "curve": clock.curve,
        "reached": clock.reached,
        "steps": state["step"],
        "samples": state["samples"],
        "gen_batches": state["gen_batches"],
        "train_s": clock.reached["train_s"] if clock.reached else clock.train_seconds(),
        "config": {"preset": cfg.preset, "lr": cfg.optim.lr, "engine": cfg.rollout.engine},
    }


def child_trl(args) -> dict:
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.rewards import get_soft_overlong_punishment

    from rlvr.data.prompts import load_prompts
    from rlvr.models import eos_ids, load_tokenizer, resolve_model_path
    from rlvr.rewards.scoring import Scorer
    from rlvr.rollout import ENGINES
    from rlvr.training.evaluation import evaluate
    from rlvr.training.overlap import Generator
    from rlvr.training.settings import eval_params

    cfg = rlvr_config(args)
    r, a, o = cfg.rollout, cfg.algo, cfg.optim
    if a.kl_coef != 0 or a.mu != 1 or a.mini_batches != 1 or a.agg != "token_mean":
        raise SystemExit(f"unexpected rlvr defaults for the TRL mapping: {a}")
    tok = load_tokenizer(cfg.model.name_or_path)
    rewards = [trl_task_reward(cfg.data.task, cfg.reward.correct_score, cfg.reward.wrong_score)]
    if a.soft_overlong:
        rewards.append(get_soft_overlong_punishment(r.max_new_tokens, a.overlong_cache))
    clock = Clock()
    eval_state: dict = {}

    class EvalCallback(TrainerCallback):
        def on_train_begin(self, args_, state, control, model=None, **kw):
            clock.start()

        def on_step_end(self, args_, state, control, model=None, **kw):
            step = state.global_step
            if step % args.eval_every == 0:
                train_s = clock.train_seconds()
                t0 = time.perf_counter()
                if "engine" not in eval_state:
                    source = load_prompts(
                        cfg, tok, getattr(model.config, "max_position_embeddings", None)
                    )
                    eval_state["prompts"] = source.eval
                    eval_state["scorer"] = Scorer.build(cfg, source.task)
                    eval_state["engine"] = ENGINES[r.engine](
                        model, pad_id=tok.pad_token_id, eos_ids=eos_ids(tok, model)
                    )
                gen = Generator(eval_state["engine"], tok, eval_state["scorer"])
                ev = evaluate(gen, eval_state["prompts"], params=eval_params(cfg))
                if clock.record(step, ev, time.perf_counter() - t0, train_s, args.target):
                    control.should_training_stop = True
            if clock.train_seconds() > args.max_minutes * 60:
                control.should_training_stop = True

    config = GRPOConfig(
        output_dir=str(Path(args.work_dir) / "trl"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,  # TRL's default is on; rlvr has none
        model_init_kwargs={"dtype": "float32"},
        per_device_train_batch_size=r.prompts_per_step * r.group_size,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=r.group_size,
        max_completion_length=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        beta=0.0,
        loss_type="dapo",
        epsilon=a.clip_low,
        epsilon_high=a.clip_high,
        scale_rewards="group",
        mask_truncated_completions=a.overlong_filter,
        learning_rate=o.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=o.warmup_steps,
        weight_decay=o.weight_decay,
        adam_beta1=o.beta1,
        adam_beta2=o.beta2,
        max_grad_norm=o.max_grad_norm,
        max_steps=args.max_steps,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        seed=args.seed,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=resolve_model_path(cfg.model.name_or_path),
        reward_funcs=rewards,
        args=config,
        train_dataset=trl_dataset(tok, cfg.data.task, cfg.data.train_size, cfg.train.seed),
        processing_class=tok,
        callbacks=[EvalCallback()],
    )
    torch.set_num_threads(cfg.train.threads or args.threads)
    trainer.train()
    steps = trainer.state.global_step
    return {
        "curve": clock.curve,
        "reached": clock.reached,
        "steps": steps,
        "samples": steps * r.prompts_per_step * r.group_size,
        "gen_batches": steps,
        "train_s": clock.reached["train_s"] if clock.reached else clock.train_seconds(),
    }


def child_main(args) -> None:
    set_threads(args.threads)
    t0 = time.perf_counter()
    result = child_trl(args) if args.child == "trl" else child_rlvr(args)
    result["wall_s"] = time.perf_counter() - t0
    result["peak_rss_mib"] = peak_rss_mib()
    Path(args.out).write_text(json.dumps(result))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="rlvr-tiny", help="rlvr-tiny, random-tiny, or a directory")
    p.add_argument("--target", type=float, default=0.9, help="held-out accuracy to reach")
    p.add_argument("--eval-every", type=int, default=5, help="optimiser steps between evaluations")
    p.add_argument("--max-minutes", type=float, default=30.0, help="training time budget per run")
    p.add_argument("--max-steps", type=int, default=1000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="alternating runs per trainer")
    p.add_argument("--only", choices=["rlvr", "trl"], default=None, help="run one trainer")
    p.add_argument(
        "--trl-lrs", default=None, help="comma list: TRL runs at each lr (default rlvr's lr)"
    )
    p.add_argument("--lr", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child", choices=["trl", "rlvr"], help=argparse.SUPPRESS)
    p.add_argument("--model-path", help=argparse.SUPPRESS)
    p.add_argument("--work-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child_main(args)
        return

    from rlvr.models import build_tiny_model, build_tokenizer, resolve_model_path

    tmp = tempfile.TemporaryDirectory(prefix="tta_")
    work = Path(tmp.name)
    if args.model == "random-tiny":
        # An untrained model for testing the script: it will not reach the target.
        tok = build_tokenizer()
        model_path = work / "random-tiny"
        build_tiny_model(tok, seed=args.seed).save_pretrained(model_path)
        tok.save_pretrained(model_path)
        model_path = str(model_path)
    else:
        try:
            resolve_model_path(args.model)
        except FileNotFoundError as e:
            raise SystemExit(f"{e}\n(test the script with --model random-tiny)") from None
        model_path = args.model
    print(
        f"time to {args.target:.0%} held-out accuracy, model {args.model}, evaluation every "
        f"{args.eval_every} steps, budget {args.max_minutes:g} min of training per run"
    )
    results: dict[str, list[dict]] = {}
    trl_lrs = [None] if args.trl_lrs is None else [float(x) for x in args.trl_lrs.split(",")]
    runs = [("rlvr", None)] + [("trl", lr) for lr in trl_lrs]
    runs = [(k, lr) for k, lr in runs if args.only in (None, k)]
    for rep in range(args.repeats):  # alternating rlvr, TRL, rlvr, TRL, ...
        for kind, lr in runs:
            name = kind if lr is None else f"{kind}@{lr:g}"
            tag = f"{name}-{rep}"
            out = work / f"{tag}.json"
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--child",
                kind,
                *(["--lr", str(lr)] if lr is not None else []),
                "--model-path",
                model_path,
                "--work-dir",
                str(work / tag),
                "--out",
                str(out),
                "--target",
                str(args.target),
                "--eval-every",
                str(args.eval_every),
                "--max-minutes",
                str(args.max_minutes),
                "--max-steps",
                str(args.max_steps),
                "--threads",
                str(args.threads),
                "--seed",
                str(args.seed),
            ]
            env = dict(
                os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false"
            )
            env["TRANSFORMERS_VERBOSITY"] = "error"
            print(f"\n== {name} (run {rep})")
            sys.stdout.flush()
            proc = subprocess.run(cmd, env=env, stdout=None, stderr=subprocess.PIPE, text=True)
            if proc.returncode != 0 or not out.exists():
                sys.stderr.write(proc.stderr[-8000:])
                raise SystemExit(f"{kind} run failed (exit {proc.returncode})")
            res = json.loads(out.read_text())
            results.setdefault(name, []).append(res)
            status = (
                f"reached {args.target:.0%} at step {res['reached']['step']} after "
                f"{res['train_s']:.1f} s of training"
                if res["reached"]
                else f"did not reach {args.target:.0%} in {res['train_s']:.1f} s "
                f"({res['steps']} steps)"
            )
            print(
                f"  {name}: {status}; {res['samples']} samples generated, peak RSS "
                f"{res['peak_rss_mib']:.0f} MiB, run {res['wall_s']:.0f} s"
            )
    # Medians over repeats; a run that missed the target counts with its budget (a lower bound).
    summary: dict = {"target": args.target, "model": args.model, "repeats": args.repeats}
    for kind, rs in results.items():
        summary[f"{kind}_seconds"] = round(statistics.median(r["train_s"] for r in rs), 2)
        summary[f"{kind}_seconds_all"] = [round(r["train_s"], 2) for r in rs]
        summary[f"{kind}_steps"] = [r["reached"]["step"] if r["reached"] else None for r in rs]
        summary[f"{kind}_samples"] = [r["samples"] for r in rs]
        summary[f"{kind}_reached"] = all(r["reached"] is not None for r in rs)
        summary[f"{kind}_best_accuracy"] = max(c["accuracy"] for r in rs for c in r["curve"])
    rlvr_lr = results["rlvr"][0]["config"]["lr"] if "rlvr" in results else None
    trl_names = [k for k in results if k.startswith("trl")]
    same_lr = [k for k in trl_names if k == "trl" or float(k.split("@")[1]) == rlvr_lr]
    if "rlvr" in results and summary["rlvr_reached"] and trl_names:
        summary["rlvr_lr"] = rlvr_lr
        if same_lr:  # TRL at rlvr's learning rate
            k = same_lr[0]
            summary["speedup_time_to_accuracy"] = round(
                summary[f"{k}_seconds"] / summary["rlvr_seconds"], 3
            )
            summary["speedup_is_lower_bound"] = not summary[f"{k}_reached"]
        if len(trl_names) > 1:  # TRL at its best learning rate of those tried
            best = min(trl_names, key=lambda k: summary[f"{k}_seconds"])
            summary["trl_best_lr"] = best.split("@")[1] if "@" in best else rlvr_lr
            summary["speedup_vs_trl_best_lr"] = round(
                summary[f"{best}_seconds"] / summary["rlvr_seconds"], 3
            )
            summary["speedup_vs_trl_best_lr_is_lower_bound"] = not summary[f"{best}_reached"]
    tmp.cleanup()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
