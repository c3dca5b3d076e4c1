"""Building a run once: the device and ranks, the tokenizer, the policy and its reference, the
CPU backend's gate, the prompts, the optimiser and schedule, the rollout engine, the scorer,
then the run directory (a resumed run's first: its newest good checkpoint is loaded) and
(PPO) the critic. A new run's directory is written only once all of these are built."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from rich.console import Console

import rlvr.cpu as cpu
from rlvr.algos import KLController
from rlvr.config.algorithm import Algorithm
from rlvr.config.load import to_dict
from rlvr.config.placement import check_ranks
from rlvr.config.schema import Config, ConfigError
from rlvr.data.prompts import PromptSource, dropped_note
from rlvr.environments.adapter import closed_on_error, environment_prompts, run_environment
from rlvr.environments.runner import AgentRunner, build_agents
from rlvr.models import autocast, check_vocabulary, load_tokenizer
from rlvr.rewards.sandbox import SandboxUnavailable, resolve_isolation
from rlvr.rewards.scoring import Scorer
from rlvr.rollout import EngineSite, RolloutEngine, build_engine, longest_sequence
from rlvr.run.checkpoint import (
    load_trainer_state,
    resume_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from rlvr.run.distributed import (
    Dist,
    full_state,
    gathered,
    init_distributed,
    load_optimizer_state,
    wrap,
)
from rlvr.run.rundir import check_run_dir, discard_unstarted, prepare_run_dir, truncate_jsonl
from rlvr.run.stored_config import check_trained_with
from rlvr.tools import Toolbox, ToolFormat, make_python_tool
from rlvr.training.collect import PromptSampler
from rlvr.training.critic import Critic
from rlvr.training.evaluation import evaluate
from rlvr.training.inflight import pipeline_of
from rlvr.training.lr_schedule import lr_scheduler
from rlvr.training.outer import OuterLoop, build_outer
from rlvr.training.pipeline import Pipeline
from rlvr.training.policy import Policy, build_critic, load_policy
from rlvr.training.settings import (
    CollectSettings,
    CriticContext,
    UpdateContext,
    UpdateSettings,
    eval_params,
    kl_controller,
)
from rlvr.training.teacher import Teacher


@dataclass(frozen=True)
class Given:
    """Objects the Python API (`rlvr.api`) hands in instead of names in the config: a model
    and tokenizer, reward functions by the names `cfg.reward` uses, tool functions by the
    names `rollout.tools` uses, and `callbacks`: functions called as `fn(step, metrics)`
    after every step (returning "stop" ends the run) and TrainerCallback objects
    (`rlvr.run.callbacks`), given `callback_args` (TRL's GRPOConfig, when passed) and
    on_log every `logging_steps` steps; `agent`: the function that drives the rollouts
    (docs/environments.md)."""

    model: torch.nn.Module | None = None
    tokenizer: object | None = None
    reward_functions: dict[str, Callable] = field(default_factory=dict)
    tools: dict[str, Callable] = field(default_factory=dict)
    callbacks: tuple[Callable, ...] = ()
    callback_args: object | None = None
    logging_steps: int = 1
    agent: Callable | None = None  # env.agent's function
    environment: object | None = None  # env.environment's object or "KIND:TARGET"


@dataclass
class Run:
    """Everything a step needs, built once by `setup`."""

    cfg: Config
    d: Dist
    device: torch.device
    run_dir: Path
    tokenizer: object
    policy: Policy
    module: torch.nn.Module  # the training forward's module (DDP-wrapped when distributed)
    engine: RolloutEngine
    scorer: Scorer
    source: PromptSource
    sampler: PromptSampler
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    backend: cpu.Backend  # the CPU backend's gate, decided once for the run
    algorithm: Algorithm  # which algorithm, built once from cfg.algo
    collect_settings: CollectSettings  # what collection reads of the config
    update_settings: UpdateSettings  # what the update and its micro-batches read
    critic_context: CriticContext  # what PPO's critic reads
    critic: Critic | None = None  # PPO's value model (algo.advantage=gae)
    kl_ctl: KLController | None = None  # the per-token reward's beta (algo.kl_in_reward)
    outer: OuterLoop | None = None  # reference resets, the reward model's refresh (outer.py)
    teacher: Teacher | None = None  # on-policy distillation's (algo.teacher, teacher.py)
    pipeline: Pipeline = field(default_factory=lambda: Pipeline(0))  # batches produced ahead
    agents: AgentRunner | None = None  # env.agent's calls on the run's endpoint

    def step_context(self) -> UpdateContext:
        """What every micro-batch of a step reads (the policy, its training module, the pad
        id, device, CPU backend, algorithm and update settings), built once per step."""
        return UpdateContext(
            model=self.policy.model,
            module=self.module,
            pad_id=self.tokenizer.pad_token_id,
            device=self.device,
            backend=self.backend,
            algorithm=self.algorithm,
            settings=self.update_settings,
            d=self.d,
        )

    def evaluate(self) -> dict[str, float]:
        with gathered(self.policy.model), autocast(self.cfg.model.autocast, self.device):
            result = evaluate(self, self.source.eval, params=eval_params(self.cfg), d=self.d)
        self.engine.release()  # an engine with its own memory (vllm) gives it back
        return result

    def save(self, step: int, eval_before: dict) -> Path | None:
        """Checkpoint written by rank 0 (FSDP2 first gathers the shards); the others wait."""
        path = None
        weights, optimizer_state = full_state(self.policy.model, self.optimizer)  # collective
        critic = self.critic.state() if self.critic is not None else None  # collective
        if self.d.is_main:
            state = {
                "optimizer": optimizer_state,
                "scheduler": self.scheduler.state_dict(),
                "sampler_position": self.sampler.position,
                "eval_before": eval_before,
                "critic": critic,
                "kl_controller": self.kl_ctl.state_dict() if self.kl_ctl is not None else None,
                "outer": self.outer.state() if self.outer is not None else None,
                **({"pipeline": self.pipeline.state()} if self.pipeline.k else {}),
                "config": to_dict(self.cfg),  # what resume checks config.yaml against
            }
            path = save_checkpoint(
                self.run_dir,
                step,
                self.policy.model,
                self.tokenizer,
                state,
                keep=self.cfg.train.keep_checkpoints,
                model_state=weights,
            )
        self.d.barrier()
        return self.d.broadcast(path)


def _build_critic(run: Run, state: dict | None) -> Critic | None:
    """PPO's critic (gae only), resumed from `state`; built without touching the run's RNG."""
    if not run.algorithm.uses_critic:
        return None
    with torch.random.fork_rng(devices=[]):
        return build_critic(run.cfg, run.device, run.d, state)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model.device: {name!r} asked for, but no CUDA device is available")
    return torch.device(name)


def setup(
    cfg: Config, resume_dir: Path | None, console: Console, given: Given | None = None
) -> tuple[Run, dict | None]:
    """Build the run (resuming from the newest good checkpoint when asked)."""
    given = given or Given()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    d, device = init_distributed(resolve_device(cfg.model.device))
    check_ranks(cfg, d.world_size)  # `rlvr train --nproc N` checked these before launch
    checkpoint, run_dir = None, None
    if resume_dir is None and d.is_main and cfg.train.output_dir:
        check_run_dir(Path(cfg.train.output_dir))  # refused now; written once all is built
    if resume_dir:  # raises CheckpointError when checkpoints exist but none verifies
        run_dir = _prepared(cfg, d, resume=True)
        warn = console.print if d.is_main else _quiet
        checkpoint = resume_checkpoint(run_dir, cfg.train.save_every, warn=warn)
        if checkpoint is None and d.is_main:  # killed before its first save: start over
            console.print(f"{run_dir}: no intact checkpoint yet; starting the run over from step 0")
            for name in ("metrics.jsonl", "samples.jsonl"):
                truncate_jsonl(run_dir / name, 0)
    state = None
    if checkpoint is not None:  # read and checked before anything is built from the config
        state = load_trainer_state(checkpoint, required=_STATE_KEYS)
        check_trained_with(state, cfg, checkpoint)
    tokenizer = given.tokenizer or load_tokenizer(cfg.model.name_or_path)
    policy = load_policy(cfg, checkpoint, device, model=given.model)
    model = policy.model
    try:
        check_vocabulary(tokenizer, model, "model.name_or_path")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    backend = _cpu_backend(policy, cfg)
    # before the prompts: its rows are the prompts
    adapted = run_environment(cfg, given.environment, given.agent)
    with closed_on_error(adapted):
        return _build(cfg, given, (d, device), (tokenizer, policy, backend, adapted),
                      (run_dir, checkpoint, state, resume_dir), console)  # fmt: skip


def _build(cfg, given, placed, parts, resumed, console):
    """setup's rest, from the prompts on: `placed` is the ranks and the device, `parts` the
    tokenizer, the policy, the CPU backend and the environment built so far, `resumed` the run
    directory, checkpoint, trainer state and resume directory."""
    d, device = placed
    tokenizer, policy, backend, adapted = parts
    run_dir, checkpoint, state, resume_dir = resumed
    model = policy.model
    source = environment_prompts(cfg, tokenizer, model, adapted)
    if d.is_main and dropped_note(source):
        console.print(dropped_note(source))
    module = wrap(model, d, device, cfg.train.parallel)  # before the optimiser: FSDP2 shards
    optimizer, scheduler = _optimizer(cfg, model)
    # the agent runs the tools
    agent = given.agent is not None or cfg.env.agent is not None or adapted is not None
    toolbox = None if agent else build_toolbox(cfg, source, tokenizer, given)
    site = replace(engine_site(cfg, model, device, d, backend, source), tools=toolbox)
    if agent:  # an agent's later turns hold its context: the engine takes the model's length
        site = replace(site, max_model_len=None)
    engine = build_engine(cfg, model, tokenizer, site)
    agents = build_agents(cfg, engine, tokenizer, model, source, given.agent, adapted)
    scorer = Scorer.build(
        cfg,
        source.task,
        given.reward_functions,
        has_answer=source.has_answer,
        scored_by_agents=adapted is not None,
    )
    algorithm = Algorithm.from_config(cfg)  # built once, passed to every stage
    teacher = None
    if algorithm.distills:  # refused (another tokenizer) before the run directory is written
        m = cfg.model
        teacher = Teacher.load(cfg.algo.teacher, tokenizer, student=m.name_or_path,
                               dtype=m.dtype, device=device, coef=algorithm.distill_coef)  # fmt: skip
    if run_dir is None:  # everything built and checked: only now the run directory
        run_dir = _prepared(cfg, d, resume=False)
    run = Run(
        cfg=cfg,
        d=d,
        device=device,
        run_dir=run_dir,
        tokenizer=tokenizer,
        policy=policy,
        module=module,
        engine=engine,
        scorer=scorer,
        source=source,
        sampler=PromptSampler(len(source.train), cfg.train.seed),
        optimizer=optimizer,
        scheduler=scheduler,
        backend=backend,
        algorithm=algorithm,
        collect_settings=CollectSettings.from_config(cfg),
        update_settings=UpdateSettings.from_config(cfg),
        critic_context=CriticContext.from_config(cfg, tokenizer.pad_token_id, device, d),
        pipeline=pipeline_of(cfg.train, None),
        agents=agents,
        teacher=teacher,
    )
    try:
        run.kl_ctl = kl_controller(cfg)
        run.outer = build_outer(run)  # may put the reward model in front of the scorer
        if checkpoint is None:
            run.critic = _build_critic(run, None)
            return run, None
        return run, _resume(run, checkpoint, state, console)
    except BaseException:
        if agents is not None:
            agents.close()
        if resume_dir is None and d.is_main:
            discard_unstarted(run_dir)
        raise


def _prepared(cfg: Config, d: Dist, resume: bool) -> Path:
    """The run directory, prepared by rank 0 (rlvr.run.rundir), its path on every rank."""
    run_dir = prepare_run_dir(cfg, resume=resume) if d.is_main else None
    return Path(d.broadcast(str(run_dir)))


def _optimizer(cfg: Config, model: torch.nn.Module):
    """AdamW over the trainable parameters and the learning-rate schedule
    (`rlvr.training.lr_schedule`)."""
    o = cfg.optim
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable,
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        weight_decay=o.weight_decay,
        # One kernel for all parameters instead of ~10 ops per tensor (CPU and CUDA):
        # measured 8 ms -> 2 ms per step on bench/vs_trl.py's 4.25M-parameter model.
        fused=all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in trainable),
    )
    return optimizer, lr_scheduler(cfg, optimizer)


def build_toolbox(cfg: Config, source: PromptSource, tokenizer, given: Given) -> Toolbox | None:
    """The tools of `rollout.tools`, else the task's own (docs/tools.md); None without any."""
    from rlvr.config.callables import extend_sys_path

    r = cfg.rollout
    specs = r.tools or tuple(getattr(source.task, "tools", ()) or ())
    if not specs:
        return None
    extend_sys_path(cfg.reward.python_path)  # "module:function" tools of a script's module
    tools = [given.tools.get(s, s) for s in specs]
    if "python" in tools:  # the sandbox the code reward uses: refused now, not at a call
        try:
            resolve_isolation(cfg.reward.sandbox_isolation)
        except SandboxUnavailable as e:
            raise ConfigError(f"rollout.tools: python: {e}") from None
        tools[tools.index("python")] = make_python_tool(cfg.reward.sandbox_isolation)
    try:
        return Toolbox(
            tools,
            tokenizer,
            max_calls=r.max_tool_calls,
            max_total_tokens=r.max_total_tokens,
            timeout_s=r.tool_timeout_s,
            fmt=ToolFormat(call_open=r.tool_call_tags[0], call_close=r.tool_call_tags[1]),
        )
    except ValueError as e:
        raise ConfigError(f"rollout.tools: {e}") from None


def engine_site(
    cfg: Config, model, device, d: Dist, backend: cpu.Backend, source=None
) -> EngineSite:
    """Where training's engine runs: this rank's device and place among the ranks, the
    trainer's autocast and CPU backend gate, its longest sequence (the longest prompt of
    `source` plus the response budget) and a rank's rows a step. The run's tools are set by
    the caller (`dataclasses.replace(site, tools=toolbox)`)."""
    r = cfg.rollout
    return EngineSite(
        device=device,
        autocast=cfg.model.autocast,
        backend=backend,
        max_model_len=longest_sequence(cfg, model, source),
        max_rows=max(1, r.prompts_per_step * r.group_size // d.world_size),
        rank=d.rank,
        local_rank=d.local_rank,
        world_size=d.world_size,
    )


_STATE_KEYS = ("step", "optimizer", "scheduler", "sampler_position", "rng", "eval_before")


def _resume(run: Run, checkpoint: Path, state: dict, console: Console) -> dict:
    """Restore the trainer state saved with `checkpoint` into `run` (critic, KL
    controller, optimiser, schedule, sampler position, RNG) and cut the logs back to it."""
    cfg, d, run_dir = run.cfg, run.d, run.run_dir
    run.critic = _build_critic(run, state.get("critic"))
    if run.kl_ctl is not None and state.get("kl_controller") is not None:
        run.kl_ctl.load_state_dict(state["kl_controller"])
    if run.outer is not None and state.get("outer") is not None:
        run.outer.load_state(state["outer"])
    load_optimizer_state(run.policy.model, run.optimizer, state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.sampler.position = state["sampler_position"]
    run.pipeline = pipeline_of(cfg.train, state.get("pipeline"))
    set_rng_state(state["rng"])
    if d.is_main:
        for name in ("metrics.jsonl", "samples.jsonl"):
            truncate_jsonl(run_dir / name, state["step"], one_per_step=name == "metrics.jsonl")
        console.print(f"resuming {run_dir} from {checkpoint.name} (step {state['step']})")
    return {"step": state["step"], "eval_before": state["eval_before"], "path": checkpoint}


def _cpu_backend(policy: Policy, cfg: Config) -> cpu.Backend:
    """The CPU backend's gate for the run (`rlvr.cpu.enabled`: fp32 weights on the CPU), and
    what it sets up once: malloc tuning (memory first under gradient checkpointing), the
    frozen reference's packed weights."""
    backend = cpu.backend(policy.model)
    backend.tune_malloc(memory_first=cfg.optim.gradient_checkpointing)
    if policy.reference_copy is not None:
        backend.pack_frozen(policy.reference_copy)
    return backend


def _quiet(*_args) -> None:
    pass
