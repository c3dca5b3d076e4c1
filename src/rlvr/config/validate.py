"""Range and consistency checks of a loaded config that need no model or data (those are
checked at load, also before any work): each failure is one `ConfigError` naming the key and
what was expected."""

from __future__ import annotations

import importlib.util
import math
import os
import re
from pathlib import Path

from rlvr.config.placement import validate_vllm_server
from rlvr.config.schema import Config, ConfigError, check
from rlvr.config.schema_env import KINDS

MAX_LR = 1.0  # learning rates above this are refused


def validate(cfg: Config) -> None:
    """Range checks that need no model or data (those are checked at load, also before work)."""
    r, a, o, t = cfg.rollout, cfg.algo, cfg.optim, cfg.train
    _validate_staleness(cfg)  # before the algorithm: its engine checks would name another key
    validate_vllm_server(cfg)
    # The algorithm's settings and what its estimator asks of the rollout, checked once there
    # (imported here: the objectives are torch code, and reading a config needs no torch).
    from rlvr.config.algorithm import Algorithm

    Algorithm.from_config(cfg)
    check(r.prompts_per_step >= 1, "rollout.prompts_per_step", ">= 1", r.prompts_per_step)
    check(r.max_new_tokens >= 1, "rollout.max_new_tokens", ">= 1", r.max_new_tokens)
    check(r.temperature > 0, "rollout.temperature", "> 0", r.temperature)
    check(0 < r.top_p <= 1, "rollout.top_p", "in (0, 1]", r.top_p)
    check(r.top_k >= 0, "rollout.top_k", ">= 0", r.top_k)
    check(
        0 <= r.min_new_tokens <= r.max_new_tokens,
        "rollout.min_new_tokens",
        f"0 <= min_new_tokens <= rollout.max_new_tokens ({r.max_new_tokens})",
        r.min_new_tokens,
    )
    check(a.mu >= 1, "algo.mu", ">= 1", a.mu)
    _validate_ppo(cfg)
    _validate_reference(cfg)
    check(a.mini_batches >= 1, "algo.mini_batches", ">= 1", a.mini_batches)
    check(
        r.prompts_per_step % a.mini_batches == 0,
        "algo.mini_batches",
        f"a divisor of rollout.prompts_per_step ({r.prompts_per_step}) so groups stay whole",
        a.mini_batches,
    )
    check(a.max_gen_batches >= 1, "algo.max_gen_batches", ">= 1", a.max_gen_batches)
    check(
        0 < a.overlong_cache < r.max_new_tokens or not a.soft_overlong,
        "algo.overlong_cache",
        f"0 < overlong_cache < rollout.max_new_tokens ({r.max_new_tokens})",
        a.overlong_cache,
    )
    m = cfg.model
    check(
        m.lora_rank == 0 or t.parallel == "ddp",
        "train.parallel",
        "ddp with LoRA (an adapter is small: shard the base with fsdp2 and no LoRA)",
        t.parallel,
    )
    check(
        m.autocast == "none" or m.dtype == "float32",
        "model.autocast",
        "none unless model.dtype is float32 (autocast keeps fp32 weights, computes in bf16)",
        m.autocast,
    )
    check(m.lora_rank >= 0, "model.lora_rank", ">= 0", m.lora_rank)
    check(m.lora_alpha > 0, "model.lora_alpha", "> 0", m.lora_alpha)
    check(0 <= m.lora_dropout < 1, "model.lora_dropout", "in [0, 1)", m.lora_dropout)
    check(
        m.lora_rank == 0 or len(m.lora_target_modules) > 0,
        "model.lora_target_modules",
        "at least one module name",
        m.lora_target_modules,
    )
    check(
        "all-linear" not in m.lora_target_modules or len(m.lora_target_modules) == 1,
        "model.lora_target_modules",
        "module names, or all-linear alone",
        m.lora_target_modules,
    )
    # an Adam step moves each weight by about lr: past 1 every step rewrites the model
    check(o.lr > 0, "optim.lr", "> 0", o.lr)
    check(o.lr <= MAX_LR, "optim.lr", f"<= {MAX_LR}", o.lr)
    check(o.weight_decay >= 0, "optim.weight_decay", ">= 0", o.weight_decay)
    check(0 <= o.beta1 < 1, "optim.beta1", "in [0, 1)", o.beta1)
    check(0 <= o.beta2 < 1, "optim.beta2", "in [0, 1)", o.beta2)
    check(o.warmup_steps >= 0, "optim.warmup_steps", ">= 0", o.warmup_steps)
    check(0 <= o.warmup_ratio < 1, "optim.warmup_ratio", "in [0, 1)", o.warmup_ratio)
    if o.warmup_steps and o.warmup_ratio:
        raise ConfigError(
            f"optim.warmup_ratio: {o.warmup_ratio} with optim.warmup_steps {o.warmup_steps} "
            "(yours or the preset's); give one: optim.warmup_steps=0 to use the ratio"
        )
    check(0 <= o.min_lr_rate < 1, "optim.min_lr_rate", "in [0, 1)", o.min_lr_rate)
    if o.lr_schedule == "polynomial":  # transformers' polynomial decays to lr_end=1e-7
        check(o.lr > 1e-7, "optim.lr", "> 1e-7 (polynomial's lr_end) under polynomial", o.lr)
    check(o.max_grad_norm >= 0, "optim.max_grad_norm", ">= 0", o.max_grad_norm)
    check(
        o.micro_batch_sequences >= 1, "optim.micro_batch_sequences", ">= 1", o.micro_batch_sequences
    )
    check(o.logits_chunk_tokens >= 0, "optim.logits_chunk_tokens", ">= 0", o.logits_chunk_tokens)
    check(o.micro_batch_tokens >= 0, "optim.micro_batch_tokens", ">= 0", o.micro_batch_tokens)
    check(t.max_steps >= 0, "train.max_steps", ">= 0", t.max_steps)
    check(t.eval_size >= 0, "train.eval_size", ">= 0", t.eval_size)
    check(t.eval_samples >= 1, "train.eval_samples", ">= 1", t.eval_samples)
    for key in ("eval_every", "log_samples", "log_every", "save_every", "threads"):
        check(getattr(t, key) >= 0, f"train.{key}", ">= 0", getattr(t, key))
    check(t.max_bad_steps >= 1, "train.max_bad_steps", ">= 1", t.max_bad_steps)
    check(t.entropy_floor >= 0, "train.entropy_floor", ">= 0", t.entropy_floor)
    for tracker in t.report_to:
        if importlib.util.find_spec(tracker) is None:
            raise ConfigError(
                f"train.report_to: {tracker!r} is not installed (pip install {tracker})"
            )
    check(t.keep_checkpoints >= 1, "train.keep_checkpoints", ">= 1", t.keep_checkpoints)
    check(cfg.reward.format_weight >= 0, "reward.format_weight", ">= 0", cfg.reward.format_weight)
    for item in cfg.reward.extra:
        check(
            bool(re.fullmatch(r"[^=]+=[-+0-9.eE]+", item))
            and math.isfinite(float(item.rsplit("=", 1)[1])),
            "reward.extra",
            "entries of the form name=weight, the weight a finite number",
            item,
        )
    _check_machine(cfg)
    check(
        r.vllm.dtype == "auto" or r.engine == "vllm",
        "rollout.vllm.dtype",
        f"auto unless rollout.engine is vllm (it is {r.engine!r})",
        r.vllm.dtype,
    )
    check(0 < r.vllm.memory < 1, "rollout.vllm.memory", "in (0, 1)", r.vllm.memory)
    _validate_tools(cfg)
    _validate_env(cfg)
    template = cfg.data.prompt_template
    check(
        template is None or "{question}" in template,
        "data.prompt_template",
        "a string containing {question} (where the prompt goes)",
        template,
    )
    if cfg.data.path is None:
        from rlvr.tasks import TASKS

        check(
            cfg.data.task in TASKS or cfg.data.task == "reasoning_gym",
            "data.task",
            f"one of {', '.join(map(repr, TASKS))} or 'reasoning_gym'",
            cfg.data.task,
        )
        g = cfg.data.reasoning_gym
        check(g.size >= 1, "data.reasoning_gym.size", ">= 1", g.size)
        check(bool(g.tasks), "data.reasoning_gym.tasks", "at least one task name", g.tasks)
    else:
        for key in ("path", "eval_path"):
            value = getattr(cfg.data, key)
            try:
                ok = value is None or Path(value).exists()
            except (ValueError, OSError):  # e.g. an embedded NUL byte
                ok = False
            if not ok:
                raise ConfigError(f"data.{key}: {value} does not exist")


def _validate_staleness(cfg: Config) -> None:
    """Bounded staleness (docs/algorithms.md#bounded-staleness): a stale sample's behaviour
    policy mu is not pi_old, so the loss must see mu's log-probs, through rollout correction's
    weights or bypass's ratio; never the ratio 1 of the live log-probs."""
    k, a = cfg.train.max_staleness, cfg.algo
    check(k >= 0, "train.max_staleness", ">= 0", k)
    r = cfg.rollout
    check(
        not cfg.train.inflight_updates or (r.engine == "vllm" and r.vllm.mode == "server"),
        "train.inflight_updates",
        "false unless rollout.engine=vllm and rollout.vllm.mode=server (weights are updated in "
        f"flight on vLLM servers; got rollout.engine={r.engine}, rollout.vllm.mode={r.vllm.mode})",
        True,
    )
    check(
        not cfg.train.inflight_updates or k >= 1,
        "train.max_staleness",
        ">= 1 with train.inflight_updates (the oldest token a trained sample may hold, in "
        "policy versions: responses in flight span pushes)",
        k,
    )
    if k == 0:
        return
    check(
        a.rollout_correction != "none" or a.rollout_bypass,
        "train.max_staleness",
        f"0 unless algo.rollout_correction is token or sequence (or algo.rollout_bypass=true): "
        f"a sample {k} versions old needs its behaviour log-probs in the loss",
        k,
    )


def _validate_ppo(cfg: Config) -> None:
    """The per-token reward, KL controller and critic keys (docs/algorithms.md#ppo)."""
    a, c = cfg.algo, cfg.critic
    check(0 <= a.gamma <= 1, "algo.gamma", "in [0, 1]", a.gamma)
    check(0 <= a.lam <= 1, "algo.lam", "in [0, 1]", a.lam)
    check(a.kl_target is None or a.kl_target > 0, "algo.kl_target", "none or > 0", a.kl_target)
    check(
        a.kl_target is None or a.kl_in_reward,
        "algo.kl_target",
        "none unless algo.kl_in_reward (the adaptive controller steers the reward's beta)",
        a.kl_target,
    )
    check(a.kl_horizon > 0, "algo.kl_horizon", "> 0", a.kl_horizon)
    check(
        not a.dynamic_sampling or cfg.rollout.group_size >= 2,
        "algo.dynamic_sampling",
        "false when rollout.group_size is 1 (a group of one is never mixed: all would be dropped)",
        a.dynamic_sampling,
    )
    check(c.lr > 0, "critic.lr", "> 0", c.lr)
    check(c.lr <= MAX_LR, "critic.lr", f"<= {MAX_LR}", c.lr)
    check(c.weight_decay >= 0, "critic.weight_decay", ">= 0", c.weight_decay)
    check(c.warmup_steps >= 0, "critic.warmup_steps", ">= 0", c.warmup_steps)
    check(c.max_grad_norm >= 0, "critic.max_grad_norm", ">= 0", c.max_grad_norm)
    check(
        c.value_clip is None or c.value_clip > 0, "critic.value_clip", "none or > 0", c.value_clip
    )
    check(
        c.arch == "head" or a.advantage != "gae" or a.kl_coef > 0,
        "critic.arch",
        "'head' when algo.kl_coef is 0 ('surprise' reads the reference model's log-probs)",
        c.arch,
    )


def _validate_reference(cfg: Config) -> None:
    """Reference resets and the iterative reward model (docs/iterative_rl.md)."""
    a, w = cfg.algo, cfg.reward
    check(a.ref_sync_every >= 0, "algo.ref_sync_every", ">= 0", a.ref_sync_every)
    check(
        a.ref_sync_every == 0 or a.kl_coef > 0,
        "algo.ref_sync_every",
        "0 when algo.kl_coef is 0 (the run has no reference to reset)",
        a.ref_sync_every,
    )
    check(0 < a.ref_mixup_alpha <= 1, "algo.ref_mixup_alpha", "in (0, 1]", a.ref_mixup_alpha)
    resets = a.ref_sync_every > 0 or (w.model_refresh_every > 0 and a.kl_coef > 0)
    check(
        a.ref_mixup_alpha == 1 or resets,
        "algo.ref_mixup_alpha",
        "1 unless the reference is reset (algo.ref_sync_every, or reward.model_refresh_every "
        "with kl_coef > 0)",
        a.ref_mixup_alpha,
    )
    check(w.model_refresh_every >= 0, "reward.model_refresh_every", ">= 0", w.model_refresh_every)
    check(
        w.model_refresh_every == 0 or w.model is not None,
        "reward.model_refresh_every",
        "0 unless reward.model names the reward model to refresh",
        w.model_refresh_every,
    )
    check(
        w.model is None or not a.dynamic_sampling,
        "reward.model",
        "none under algo.dynamic_sampling (it keeps groups by the rule's verdict, which a "
        "reward-model run must not see)",
        w.model,
    )
    check(0 <= w.rm_replay_frac <= 1, "reward.rm_replay_frac", "in [0, 1]", w.rm_replay_frac)
    check(w.rm_lr > 0, "reward.rm_lr", "> 0", w.rm_lr)
    check(w.rm_lr <= MAX_LR, "reward.rm_lr", f"<= {MAX_LR}", w.rm_lr)
    check(w.rm_epochs >= 1, "reward.rm_epochs", ">= 1", w.rm_epochs)
    if w.model is not None and not Path(w.model).exists():
        raise ConfigError(f"reward.model: {w.model} does not exist")


def _validate_env(cfg: Config) -> None:
    """The agent keys (docs/environments.md); the function itself is imported when the run
    is built."""
    e = cfg.env
    check(math.isfinite(e.timeout) and e.timeout > 0, "env.timeout", "seconds > 0", e.timeout)
    check(
        e.agent is None or (":" in e.agent and all(e.agent.rpartition(":")[::2])),
        "env.agent",
        "'module:function' or 'path/to/file.py:function'",
        e.agent,
    )
    check(
        not cfg.train.inflight_updates or (e.agent is None and e.environment is None),
        "train.inflight_updates",
        "false beside env.agent or env.environment (their rollouts go through the run's "
        "endpoint, one request at a time; in flight, rlvr's own rollouts only)",
        True,
    )
    if e.environment is not None:
        split_spec(e.environment)  # KIND:TARGET, KIND a known one
        check(e.agent is None, "env.agent", "none beside env.environment (the environment "
              "drives the rollouts)", e.agent)  # fmt: skip
        check(cfg.data.path is None, "data.path", "none beside env.environment (the "
              "environment gives the prompts)", cfg.data.path)  # fmt: skip


def _validate_tools(cfg: Config) -> None:
    """The tool keys (docs/tools.md); the tools themselves are resolved when the run is built.
    The tools are `rollout.tools`, else the built-in task's own (calc's)."""
    r = cfg.rollout
    tools = r.tools
    if not tools and cfg.data.path is None:
        from rlvr.tasks import TASKS

        tools = tuple(getattr(TASKS.get(cfg.data.task), "tools", ()) or ())
    check(r.max_tool_calls >= 0, "rollout.max_tool_calls", ">= 0", r.max_tool_calls)
    check(
        r.max_total_tokens is None or r.max_total_tokens >= r.max_new_tokens,
        "rollout.max_total_tokens",
        f"none or >= rollout.max_new_tokens ({r.max_new_tokens})",
        r.max_total_tokens,
    )
    check(r.tool_timeout_s > 0, "rollout.tool_timeout_s", "> 0", r.tool_timeout_s)
    check(
        len(r.tool_call_tags) == 2 and all(r.tool_call_tags),
        "rollout.tool_call_tags",
        "two non-empty tags, the call's opening and closing one",
        r.tool_call_tags,
    )
    check(
        not tools or r.min_new_tokens == 0,
        "rollout.min_new_tokens",
        "0 with tools (EOS suppression is for benchmarks without tools)",
        r.min_new_tokens,
    )


# torch's intra-op pool gains nothing past one thread per CPU; far past it, thread creation
# fails (`train.threads=100000`: "can't start new thread") or the machine thrashes.
THREADS_PER_CPU = 4


def _check_machine(cfg: Config) -> None:
    """Values that name this machine's resources: the device string, the thread count."""
    cpus = os.cpu_count() or 1
    check(
        cfg.train.threads <= THREADS_PER_CPU * cpus,
        "train.threads",
        f"0 (torch's default) to {THREADS_PER_CPU * cpus} ({THREADS_PER_CPU} x this machine's "
        f"{cpus} CPUs)",
        cfg.train.threads,
    )
    device = cfg.model.device
    if device != "auto":
        import torch  # here: only a config that names a device needs it

        try:
            torch.device(device)
        except (RuntimeError, ValueError):
            raise ConfigError(
                f"model.device: got {device!r}, expected auto, cpu, cuda, cuda:N "
                "(or another torch device such as mps, xpu)"
            ) from None


def split_spec(spec: str) -> tuple[str, str]:
    """ "KIND:TARGET" -> (KIND, TARGET), or a ConfigError naming what was expected."""
    kind, sep, target = spec.partition(":")
    if not sep or kind not in KINDS or not target:
        raise ConfigError(
            f"env.environment: got {spec!r}, expected KIND:TARGET with KIND one of "
            f"{sorted(KINDS)} (e.g. verifiers:my_env:load_environment)"
        )
    return kind, target
