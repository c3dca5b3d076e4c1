"""The GRPO / DAPO training loop (docs/algorithms.md#one-training-step), top to bottom.

    for step:                  produce (rlvr.training.pipeline), then consume
        collect:   sample prompts, G responses each (pi_old = the current policy), score them;
                   under dynamic sampling keep only groups with 0 < #correct < G, refilling
                   from more generation batches (at most algo.max_gen_batches)
        advantages from each whole group's rewards, once per rollout
        no_grad:   old log-probs (only when mu > 1 or several mini-batches make them differ
                   from the live ones), reference log-probs (only when kl_coef > 0)
        update:    mu passes x mini-batches (one optimiser step each) x micro-batches, every
                   micro-batch loss normalised by the whole optimiser step's token and
                   sequence counts, so accumulation equals one big batch exactly

Under train.max_staleness = k a step consumes the batch produced k steps earlier, by weights
up to k versions old (docs/algorithms.md#bounded-staleness).

Choices, each a config key: dropout stays off for the whole run (the model is in eval mode),
so log-probs of the same weights are identical in the rollout, old and new passes; the sampling
temperature divides the logits before every log-softmax; top-p/top-k shape sampling only.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from rlvr.config.load import to_dict
from rlvr.config.schema import Config
from rlvr.models import autocast
from rlvr.run.callbacks import Callbacks
from rlvr.run.distributed import gathered, shutdown
from rlvr.run.health import HealthGuard
from rlvr.run.memory import MemoryGuard
from rlvr.run.metrics import NullLogger, RunLogger
from rlvr.run.private import write_private
from rlvr.run.rundir import discard_unstarted, started, unlock_run_dir
from rlvr.run.signals import StopSignal
from rlvr.training.batch import Batch
from rlvr.training.critic import CriticTargets, critic_features, critic_update, predict_values
from rlvr.training.pipeline import Produced, check_staleness, produce, staleness_metrics
from rlvr.training.ppo import token_advantages
from rlvr.training.setup import Given, Run, resolve_device, setup
from rlvr.training.update import advantages, batch_log_probs, gdpo_metrics, policy_update

__all__ = ["Given", "Run", "consume", "produce", "resolve_device", "run_step", "setup", "train"]


def run_step(
    step: int, run: Run, produced: Produced | None = None
) -> tuple[dict[str, float], list[dict]]:
    """One rollout step: consume(produce(step)), or the update on `produced`, the batch the
    pipeline sampled for this step (train.max_staleness > 0). Returns metrics and examples."""
    if produced is None:
        produced = produce(step, run, version=step - 1)
    return consume(produced, run)


def consume(produced: Produced, run: Run) -> tuple[dict[str, float], list[dict]]:
    """The update on a produced batch: old/ref log-probs, advantages, critic, policy update
    (docs/algorithms.md#bounded-staleness). Returns metrics and examples."""
    cfg, device, u = run.cfg, run.device, run.step_context()
    model, algo, step = run.policy.model, run.algorithm, produced.step
    t_start, update_start = time.perf_counter(), time.time()
    batch = produced.batch  # this rank's share of the kept groups
    bound = cfg.train.max_staleness
    lags = check_staleness(batch, step - 1, bound)  # the trainer is version step - 1
    with gathered(model), autocast(cfg.model.autocast, device):
        t0 = time.perf_counter()
        # pi_old's log-probs: for the ratio when it can differ from the live policy's, and
        # for the KL of the per-token reward (PPO, REINFORCE++)
        if len(batch) and algo.needs_old_log_probs:
            old = batch_log_probs(model, batch, u)
            batch = replace(batch, old_log_probs=old)
        if len(batch) and algo.needs_reference:
            with run.policy.reference() as reference:
                ref = batch_log_probs(reference, batch, u)
            batch = replace(batch, ref_log_probs=ref)
        batch, token_metrics, targets = _advantages(run, batch)
        if run.teacher is not None:  # on-policy distillation: the teacher's share (every rank)
            batch, distill_metrics = run.teacher.distill(batch, u, run.d)
            token_metrics = {**token_metrics, **distill_metrics}
        t1 = time.perf_counter()
    metrics = {**produced.metrics, **token_metrics}
    metrics.update(run.engine.step_metrics())  # vLLM servers lost, if any
    if bound:
        metrics.update(staleness_metrics(lags, run.d))
    if batch.num_groups and run.critic is not None:
        c = run.critic_context
        critic = critic_update(run.critic, batch.samples, batch.num_groups, targets, c)
        metrics.update({f"critic/{k}": v for k, v in critic.items()})
    if batch.num_groups and step <= cfg.critic.warmup_steps and run.critic is not None:
        metrics["critic/warmup"] = 1.0  # only the critic trains in its warm-up steps
    elif batch.num_groups:
        metrics.update(policy_update(batch, u, run.optimizer, run.scheduler))
        run.engine.sync_weights()
    else:
        metrics["empty_batches"] = 1  # dynamic sampling found no informative group
    t2 = time.perf_counter()
    metrics["time/log_probs"] = t1 - t0
    metrics["time/update"] = t2 - t1
    metrics["time/step"] = produced.seconds + t2 - t_start  # its rollout and its update
    # wall-clock timestamps (time.time()): when the batch was generated, when it was trained on
    metrics["time/gen_start"], metrics["time/gen_end"] = produced.started, produced.ended
    metrics["time/update_start"], metrics["time/update_end"] = update_start, time.time()
    metrics["tokens_per_s"] = metrics["generated_tokens"] / max(metrics["time/step"], 1e-9)
    return metrics, produced.examples


def _advantages(run: Run, batch: Batch) -> tuple[Batch, dict[str, float], CriticTargets | None]:
    """The batch with its advantages: group advantages from the rewards, or (gae,
    reinforce_pp) token-level ones from the per-token rewards, with the critic's values and
    targets for gae."""
    algo, settings = run.algorithm, run.update_settings
    if not algo.token_level:
        adv = advantages(batch, algo, settings.group_size, run.d.sum)
        return replace(batch, advantages=adv), gdpo_metrics(batch, algo, settings.group_size), None
    values = features = None
    if run.critic is not None:
        c = run.critic_context
        features = critic_features(batch, c)
        values = predict_values(run.critic, batch.samples, batch.width, c, features)
    got = token_advantages(batch, algo, settings, run.kl_ctl, run.d, values)
    targets = got.critic_targets
    if targets is not None and features is not None:
        targets = replace(targets, features=features)
    return replace(batch, advantages=got.advantages), got.metrics, targets


def _accuracy_line(when: str, ev: dict, cfg: Config) -> str:
    if "accuracy" not in ev:
        return f"no held-out evaluation {when} training ({no_eval_reason(cfg)})"
    return f"held-out accuracy {when} training: {ev['accuracy']:.3f}"


def no_eval_reason(cfg: Config) -> str:
    """Why a run has no held-out prompts: no eval set given, or train.eval_size=0."""
    if cfg.train.eval_size == 0:
        return "train.eval_size=0"
    if cfg.env.environment is not None:
        return ("the environment scores training rollouts only; its held-out rows are "
                "evaluated when reward.accuracy names a reward")  # fmt: skip
    if cfg.data.path and not cfg.data.eval_path:
        return "no eval set: data.eval_path (the API's eval_dataset) is not set"
    return "the eval set holds no prompts"


def train(
    cfg: Config,
    *,
    resume_dir: Path | None = None,
    show_progress: bool = True,
    console: Console | None = None,
    destroy_process_group: bool = True,
    given: Given | None = None,
) -> Path:
    """Run `cfg` (or continue the run in `resume_dir`); returns the run directory.
    `given` carries the Python API's objects (model, tokenizer, reward functions, callbacks).
    `destroy_process_group=False` leaves torch.distributed's group alive at the end, for a
    caller that ends the process with `os._exit` (see `distributed.shutdown`)."""
    console = console or Console(stderr=True, soft_wrap=True)
    t_start = time.time()
    run = None
    try:
        run, resumed = setup(cfg, resume_dir, console, given)
        # No barrier after a failure: the other ranks may never reach it; torchrun stops them
        # once this rank exits with the error.
        given = given or Given()
        events = Callbacks(
            given.callbacks,
            args=given.callback_args,
            max_steps=cfg.train.max_steps,
            logging_steps=given.logging_steps,
            objects={"model": run.policy.model, "processing_class": run.tokenizer,
                     "optimizer": run.optimizer, "lr_scheduler": run.scheduler},
        )  # fmt: skip
        events.set_training_args(run.cfg)
        run_dir = _train(run, resumed, console, show_progress, t_start, events)
    except BaseException:  # a run that never logged a step leaves nothing behind
        if run is not None and resume_dir is None:
            discard_unstarted(run.run_dir)
        raise
    finally:  # the run directory's lock (rlvr.run.rundir), taken in setup by rank 0
        if run is not None:
            if run.agents is not None:
                run.agents.close()  # the endpoint's server and generation threads
            run.engine.close()  # what the engine started (vLLM servers) ends with the run
        locked = run.run_dir if run else cfg.train.output_dir or resume_dir
        if locked:
            unlock_run_dir(Path(locked))
    shutdown(run.d, destroy=destroy_process_group)
    return run_dir


def _train(
    run: Run,
    resumed: dict | None,
    console: Console,
    show_progress: bool,
    t_start: float,
    events: Callbacks,
) -> Path:
    cfg = run.cfg
    d, run_dir = run.d, run.run_dir
    step, final = (resumed["step"], resumed["path"]) if resumed else (0, None)
    eval_before = resumed["eval_before"] if resumed else None
    guard = HealthGuard(
        max_bad_steps=cfg.train.max_bad_steps, entropy_floor=cfg.train.entropy_floor
    )
    longest_prompt = max((len(p.ids) for p in run.source.train), default=0)
    reference_copy = run.policy.reference_copy is not None
    memory = MemoryGuard.for_run(
        cfg,
        run.policy.model,
        longest_prompt,
        reference_copy,
        engine_bytes=run.engine.resident_bytes,  # vLLM on the CPU: it stays
        sandbox_bytes=run.scorer.sandbox_bytes(),
        teacher_bytes=run.teacher.resident_bytes if run.teacher is not None else 0.0,
    )
    logger = (
        RunLogger(
            run_dir,
            total_steps=cfg.train.max_steps,
            console=console,
            show_progress=show_progress,
            log_every=cfg.train.log_every,
            report_to=cfg.train.report_to,
            project=cfg.train.project,
            config=to_dict(cfg),
        )
        if d.is_main
        else NullLogger()
    )
    with logger as log, StopSignal() as stop:
        if eval_before is None:
            eval_before = run.evaluate()
            log.message(_accuracy_line("before", eval_before, cfg))
        events.train_begin(step)
        while step < cfg.train.max_steps and not d.max(float(stop.requested)):
            step += 1
            memory.check(step)  # a clear error instead of the OOM killer
            metrics, examples = run_step(step, run, run.pipeline.next(step, run))
            metrics.update(run.pipeline.settle())  # the batch produced beside the update
            if run.outer is not None:  # reference resets, the reward model's refresh
                metrics.update(run.outer.after_step(step))
            asked_stop = False
            if cfg.train.eval_every and step % cfg.train.eval_every == 0:
                held_out = run.evaluate()
                metrics.update({f"eval/{k}": v for k, v in held_out.items()})
                asked_stop = events.evaluate(step, held_out)
            for text in guard.check(step, metrics, final):
                log.message(f"[yellow]{text}")
            log.log(step, metrics)
            started(run_dir)  # from here on the run directory stays
            log.samples(step, examples)
            if cfg.train.save_every and step % cfg.train.save_every == 0:
                final = run.save(step, eval_before)
                events.save(step)
            asked_stop = events.step_end(step, metrics) or asked_stop
            if d.max(float(asked_stop)):
                log.message(f"a callback ended the run after step {step}")
                break
        if final is None or not Path(final).name.endswith(f"{step:06d}"):
            final = run.save(step, eval_before)
            events.save(step)
        if d.max(float(stop.requested)):
            log.message(
                f"stopped by signal after step {step}; checkpoint {final}. "
                f"Continue with: rlvr train --resume {run_dir}"
            )
            return run_dir
        eval_after = run.evaluate()
        log.message(_accuracy_line("after", eval_after, cfg))
        events.train_end(step)
    if d.is_main:
        summary = {
            "eval_before": eval_before,
            "eval_after": eval_after,
            "steps": step,
            "task": run.source.name,
            "model": cfg.model.name_or_path,
            "preset": cfg.preset,
            "final_checkpoint": str(final),
            "reference": run.policy.reference_kind,
            "world_size": d.world_size,
            "parallel": cfg.train.parallel if d.enabled else "none",
            "engine": cfg.rollout.engine,
            "trainer_cpus": sorted(os.sched_getaffinity(0)),  # where taskset or Slurm put it
            # the CPU backend (rlvr.cpu): whether its C kernels ran, or why not
            "native_kernels": run.backend.kernels(),
            "malloc_tuning": run.backend.tune_malloc(),
            "wall_time_s": time.time() - t_start,
        }
        write_private(run_dir / "summary.json", json.dumps(summary, indent=2))
    return run_dir
