"""The GRPO / DAPO training loop (ALGORITHMS.md §3.6 and §5), top to bottom.

    for step:
        collect:   sample prompts, G responses each (pi_old = the current policy), score them;
                   under dynamic sampling keep only groups with 0 < #correct < G, refilling
                   from more generation batches (at most algo.max_gen_batches)
        advantages from each whole group's rewards, once per rollout
        no_grad:   old log-probs (only when mu > 1 or several mini-batches make them differ
                   from the live ones), reference log-probs (only when kl_coef > 0)
        update:    mu passes x mini-batches (one optimiser step each) x micro-batches, every
                   micro-batch loss normalised by the whole optimiser step's token and
                   sequence counts, so accumulation equals one big batch exactly

Choices, each a config key: dropout stays off for the whole run (the model is in eval mode),
so log-probs of the same weights are identical in the rollout, old and new passes; the sampling
temperature divides the logits before every log-softmax; top-p/top-k shape sampling only.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from rich.console import Console

from rlvr.checkpoint import (
    CheckpointError,
    latest_good_checkpoint,
    load_trainer_state,
    save_checkpoint,
    set_rng_state,
)
from rlvr.collect import PromptSampler, collect, derive_seed
from rlvr.config import Config, ConfigError, dump_yaml
from rlvr.evaluation import evaluate
from rlvr.health import HealthGuard
from rlvr.metrics import RunLogger
from rlvr.models import load_tokenizer
from rlvr.policy import Policy, load_policy
from rlvr.prompts import PromptSource, load_prompts
from rlvr.rollout import ENGINES, SamplingParams
from rlvr.scoring import Scorer
from rlvr.signals import StopSignal
from rlvr.update import assign_advantages, fill_log_probs, policy_update


def eval_params(cfg: Config, *, greedy: bool = False, n: int | None = None) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        n=n or cfg.train.eval_samples,
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        seed=derive_seed("eval"),
        greedy=greedy,
    )


def run_step(
    step: int,
    cfg: Config,
    policy: Policy,
    engine,
    tokenizer,
    scorer: Scorer,
    source: PromptSource,
    sampler: PromptSampler,
    optimizer,
    scheduler,
    device,
) -> tuple[dict[str, float], list[dict]]:
    """One rollout step: collect, advantages, old/ref log-probs, update. Returns metrics."""
    t_start = time.perf_counter()
    pad_id, model = tokenizer.pad_token_id, policy.model
    got = collect(step, cfg, engine, tokenizer, scorer, source.train, sampler)
    samples = got.samples
    assign_advantages(samples, cfg)
    t0 = time.perf_counter()
    if samples and (cfg.algo.mu > 1 or cfg.algo.mini_batches > 1):
        fill_log_probs(model, samples, cfg, pad_id, device, "old_log_probs")
    if samples and cfg.algo.kl_coef > 0:
        with policy.reference() as reference:
            fill_log_probs(reference, samples, cfg, pad_id, device, "ref_log_probs")
    t1 = time.perf_counter()
    metrics = dict(got.metrics)
    if samples:
        metrics.update(policy_update(model, samples, cfg, optimizer, scheduler, pad_id, device))
        engine.sync_weights()
    else:
        metrics["empty_batches"] = 1  # dynamic sampling found no informative group
    t2 = time.perf_counter()
    metrics["time/log_probs"] = t1 - t0
    metrics["time/update"] = t2 - t1
    metrics["time/step"] = t2 - t_start
    metrics["tokens_per_s"] = metrics["generated_tokens"] / max(metrics["time/step"], 1e-9)
    return metrics, got.examples


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model.device: {name!r} asked for, but no CUDA device is available")
    return torch.device(name)


def prepare_run_dir(cfg: Config, resume: bool) -> Path:
    if cfg.train.output_dir:
        run_dir = Path(cfg.train.output_dir)
    else:
        run_dir = Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    if not resume and (run_dir / "metrics.jsonl").exists():
        raise ConfigError(
            f"train.output_dir: {run_dir} already holds a run; resume it with "
            f"`rlvr train --resume {run_dir}` or choose another --output-dir"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        (run_dir / "config.yaml").write_text(dump_yaml(cfg))
    return run_dir


def _truncate_jsonl(path: Path, last_step: int) -> None:
    """Drop lines written after the checkpoint being resumed (they will be written again)."""
    if not path.exists():
        return
    keep = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line).get("step", 0) <= last_step
    ]
    path.write_text("".join(line + "\n" for line in keep))


def eos_ids(tokenizer, model) -> list[int]:
    """EOS ids from the tokenizer and the model's generation config (chat models often have
    two, e.g. Qwen2.5's <|im_end|> and <|endoftext|>)."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def train(
    cfg: Config,
    *,
    resume_dir: Path | None = None,
    show_progress: bool = True,
    console: Console | None = None,
) -> Path:
    """Run `cfg` (or continue the run in `resume_dir`); returns the run directory."""
    console = console or Console(stderr=True, soft_wrap=True)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    run_dir = prepare_run_dir(cfg, resume=resume_dir is not None)
    device = resolve_device(cfg.model.device)
    checkpoint = latest_good_checkpoint(run_dir, warn=console.print) if resume_dir else None
    if resume_dir and checkpoint is None:
        raise CheckpointError(f"{run_dir}: no intact checkpoint to resume from")
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    policy = load_policy(cfg, checkpoint, device)
    model = policy.model
    max_context = getattr(model.config, "max_position_embeddings", None)
    source = load_prompts(cfg, tokenizer, max_context)
    scorer = Scorer.build(cfg, source.task)
    engine = ENGINES[cfg.rollout.engine](
        model, pad_id=tokenizer.pad_token_id, eos_ids=eos_ids(tokenizer, model)
    )
    o = cfg.optim
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        weight_decay=o.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / o.warmup_steps) if o.warmup_steps else 1.0
    )
    sampler = PromptSampler(len(source.train), cfg.train.seed)
    start_step, eval_before, t_start = 0, None, time.time()
    if checkpoint:
        state = load_trainer_state(checkpoint)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        sampler.position = state["sampler_position"]
        start_step, eval_before = state["step"], state["eval_before"]
        set_rng_state(state["rng"])
        for name in ("metrics.jsonl", "samples.jsonl"):
            _truncate_jsonl(run_dir / name, start_step)
        console.print(f"resuming {run_dir} from {checkpoint.name} (step {start_step})")

    def save(step: int) -> Path:
        state = {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "sampler_position": sampler.position,
            "eval_before": eval_before,
        }
        return save_checkpoint(
            run_dir, step, model, tokenizer, state, keep=cfg.train.keep_checkpoints
        )

    stop = StopSignal()
    guard = HealthGuard(
        max_bad_steps=cfg.train.max_bad_steps, entropy_floor=cfg.train.entropy_floor
    )
    with (
        RunLogger(
            run_dir, total_steps=cfg.train.max_steps, console=console, show_progress=show_progress
        ) as log,
        stop,
    ):
        if eval_before is None:
            eval_before = evaluate(engine, tokenizer, scorer, source.eval, params=eval_params(cfg))
            log.message(f"held-out accuracy before training: {eval_before.get('accuracy', 0):.3f}")
        step, final = start_step, checkpoint
        while step < cfg.train.max_steps and not stop.requested:
            step += 1
            metrics, examples = run_step(
                step,
                cfg,
                policy,
                engine,
                tokenizer,
                scorer,
                source,
                sampler,
                optimizer,
                scheduler,
                device,
            )
            if cfg.train.eval_every and step % cfg.train.eval_every == 0:
                ev = evaluate(engine, tokenizer, scorer, source.eval, params=eval_params(cfg))
                metrics.update({f"eval/{k}": v for k, v in ev.items()})
            for text in guard.check(step, metrics, final):
                log.message(f"[yellow]{text}")
            log.log(step, metrics)
            log.samples(step, examples)
            if cfg.train.save_every and step % cfg.train.save_every == 0:
                final = save(step)
        if final is None or not final.name.endswith(f"{step:06d}"):
            final = save(step)
        if stop.requested:
            log.message(
                f"stopped by signal after step {step}; checkpoint {final}. "
                f"Continue with: rlvr train --resume {run_dir}"
            )
            return run_dir
        eval_after = evaluate(engine, tokenizer, scorer, source.eval, params=eval_params(cfg))
        log.message(f"held-out accuracy after training: {eval_after.get('accuracy', 0):.3f}")
    summary = {
        "eval_before": eval_before,
        "eval_after": eval_after,
        "steps": step,
        "task": source.name,
        "model": cfg.model.name_or_path,
        "preset": cfg.preset,
        "final_checkpoint": str(final),
        "reference": policy.reference_kind,
        "wall_time_s": time.time() - t_start,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return run_dir
