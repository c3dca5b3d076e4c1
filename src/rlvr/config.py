"""Run configuration: nested frozen dataclasses, presets, YAML changes and dotted overrides.

A config is built in one order, each layer holding only changes to the one before:
dataclass defaults -> preset (`grpo`, `dapo`, `dr_grpo`) -> YAML file -> `--section.key=value`.
Every field is documented once, in its class docstring (`name: text` lines), and the CLI help
reads it from there. Unknown keys and bad values fail here, before any work, naming the key and
what was expected. Batch sizes say their unit: prompts or sequences, per optimiser step.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml


class ConfigError(ValueError):
    """A config key or value is wrong; the message names the key and what is expected."""


@dataclass(frozen=True)
class ModelConfig:
    """The policy (and, when kl_coef > 0, the frozen reference copy).

    name_or_path: "rlvr-tiny" (the built-in offline model), a local directory, or a hub id.
    dtype: parameter dtype: float32, bfloat16, float16, or auto (as saved).
    device: "auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:1", ...
    lora_rank: LoRA rank r (PEFT); 0 trains every weight.
    lora_alpha: LoRA scaling alpha (the update is scaled by alpha / r).
    lora_dropout: dropout on the LoRA input (0 keeps log-probs deterministic).
    lora_target_modules: module names that get adapters.
    """

    name_or_path: str = "rlvr-tiny"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
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

    task: built-in task name (see `rlvr.tasks.TASKS`); ignored when `path` is set.
    path: a jsonl / parquet file or a local Hugging Face dataset directory.
    preset: dataset format preset for `path`: none, gsm8k, dapo_math.
    prompt_field: column holding the question, a string or chat messages (none = the preset's).
    answer_field: column holding the reference answer, dotted when nested (none = the preset's).
    eval_path: held-out dataset for evaluation (same format as `path`); defaults to none.
    system_prompt: optional system message put before every prompt.
    prompt_template: template with {question} applied to string prompts.
    dedup: drop repeated prompts (the public DAPO-Math-17k copy repeats each ~100 times).
    train_size: number of built-in task training prompts to generate.
    """

    task: str = "arithmetic"
    path: str | None = None
    preset: Literal["none", "gsm8k", "dapo_math"] = "none"
    prompt_field: str | None = None
    answer_field: str | None = None
    eval_path: str | None = None
    system_prompt: str | None = None
    prompt_template: str = "{question}"
    dedup: bool = False
    train_size: int = 4000


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling: how many responses, how long, at what temperature.

    engine: "fast" (own decode loop: prompt prefilled once per group, static KV cache) or "hf" (generate).
    prompts_per_step: prompts whose groups enter one rollout batch (after dynamic sampling).
    group_size: G, responses sampled per prompt.
    max_new_tokens: generation cap L_max in tokens; a response without EOS by then is truncated.
    temperature: sampling temperature; the trainer applies the same one to its log-probs.
    top_p: nucleus sampling threshold (1.0 = off).
    top_k: top-k sampling (0 = off).
    min_new_tokens: suppress EOS before this many tokens (benchmarks force lengths with it; 0 = off).
    seed_per_prompt: draw each prompt's samples from its own seed, whatever else shares the batch
        (always on under torchrun, so N ranks sample what one process would).
    """

    engine: str = "fast"
    prompts_per_step: int = 16
    group_size: int = 8
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_new_tokens: int = 0
    seed_per_prompt: bool = False


@dataclass(frozen=True)
class AlgoConfig:
    """The policy-gradient algorithm (ALGORITHMS.md).

    advantage: grpo (r - mean)/(std + eps), dr_grpo (r - mean), rloo (leave-one-out).
    std: std estimator for grpo advantages: unbiased (torch.std, /(G-1)) or population (/G).
    clip_low: eps_low; the ratio's lower bound is 1 - clip_low.
    clip_high: eps_high; the ratio's upper bound is 1 + clip_high (DAPO clip-higher: 0.28).
    dual_clip: dual-clip constant c > 1 capping the loss of negative advantages (none = off).
    ratio: token (PPO/GRPO/DAPO importance ratio per token) or sequence (GSPO).
    agg: loss aggregation: sample_mean (GRPO), token_mean (DAPO), token_sum_norm (Dr. GRPO).
    kl_coef: beta, weight of the KL penalty to the reference model in the loss (0 = no reference).
    kl_kind: KL estimator: k1, k2, k3.
    dynamic_sampling: keep only groups with 0 < #correct < G, refilling from more generation batches.
    max_gen_batches: bound on generation batches per step under dynamic sampling.
    overlong_filter: give truncated responses a zero loss mask.
    soft_overlong: add DAPO's soft overlong punishment to the reward.
    overlong_cache: L_cache of the soft overlong punishment, in tokens.
    mu: optimisation passes over each rollout batch.
    mini_batches: optimiser steps per pass (the rollout batch is split into this many).
    log_ratio_clamp: clamp |log rho| to this value (none = no clamp); clamped values are counted.
    """

    advantage: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    std: Literal["unbiased", "population"] = "unbiased"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    ratio: Literal["token", "sequence"] = "token"
    agg: Literal["sample_mean", "token_mean", "token_sum_norm"] = "sample_mean"
    kl_coef: float = 0.0
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    dynamic_sampling: bool = False
    max_gen_batches: int = 4
    overlong_filter: bool = False
    soft_overlong: bool = False
    overlong_cache: int = 8
    mu: int = 1
    mini_batches: int = 1
    log_ratio_clamp: float | None = None


@dataclass(frozen=True)
class RewardConfig:
    """How a response is scored. Accuracy stays separate: dynamic sampling filters on it.

    accuracy: accuracy reward: "task" (the built-in task's verifier) or a reward name / module:function.
    correct_score: reward of a correct answer under accuracy "task".
    wrong_score: reward of a wrong answer under accuracy "task" (DAPO: -1).
    format_weight: weight of the R1 format reward (<think>...</think> then the answer); 0 = off.
    extra: more reward terms, each "name=weight" (name from rlvr.rewards.REWARDS or module:function).
    on_error: a reward function that raises: "raise" stops the run, "zero" scores 0 and counts it.
    params: settings per reward name, e.g. {math: {signed: false}} (YAML, or JSON on the command line).
    """

    accuracy: str = "task"
    correct_score: float = 1.0
    wrong_score: float = 0.0
    format_weight: float = 0.0
    extra: tuple[str, ...] = ()
    on_error: Literal["raise", "zero"] = "raise"
    params: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warm-up then a constant learning rate.

    lr: learning rate after warm-up.
    weight_decay: AdamW weight decay.
    beta1: AdamW beta1.
    beta2: AdamW beta2.
    warmup_steps: linear warm-up length in optimiser steps.
    max_grad_norm: gradient clipping by global norm (0 = off).
    micro_batch_sequences: sequences per forward/backward; gradients accumulate to the optimiser step.
    """

    lr: float = 1e-6
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    micro_batch_sequences: int = 64


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
    save_every: checkpoint every N steps (0 = only at the end).
    keep_checkpoints: keep the newest K checkpoints.
    threads: torch CPU threads (0 = torch's default).
    parallel: under torchrun: ddp (every rank holds the model) or fsdp2 (parameters sharded).
    max_bad_steps: stop after this many steps in a row whose updates had a NaN/inf loss or gradient.
    entropy_floor: warn when the policy's mean token entropy falls below this (collapse).
    """

    max_steps: int = 100
    seed: int = 0
    output_dir: str | None = None
    eval_size: int = 256
    eval_samples: int = 1
    eval_every: int = 0
    log_samples: int = 4
    save_every: int = 0
    keep_checkpoints: int = 2
    threads: int = 0
    parallel: Literal["ddp", "fsdp2"] = "ddp"
    max_bad_steps: int = 3
    entropy_floor: float = 0.01


@dataclass(frozen=True)
class Config:
    """A whole run. Sections: model, data, rollout, algo, reward, optim, train."""

    preset: str = "dapo"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


SECTIONS = {f.name: f.type for f in fields(Config) if f.name != "preset"}

# Presets hold only changes to the defaults. The defaults are the tiny offline run's sizes;
# the algorithm fields are what each paper specifies (ALGORITHMS.md §3, §5, §6).
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "grpo": {
        "algo": {
            "advantage": "grpo",
            "clip_low": 0.2,
            "clip_high": 0.2,
            "kl_coef": 0.04,
            "kl_kind": "k3",
            "agg": "sample_mean",
        },
    },
    "dapo": {
        "algo": {
            "advantage": "grpo",
            "clip_low": 0.2,
            "clip_high": 0.28,
            "kl_coef": 0.0,
            "agg": "token_mean",
            "dynamic_sampling": True,
            "overlong_filter": True,
            "soft_overlong": True,
        },
        "reward": {"wrong_score": -1.0},
    },
    "dr_grpo": {
        "algo": {
            "advantage": "dr_grpo",
            "clip_low": 0.2,
            "clip_high": 0.2,
            "kl_coef": 0.0,
            "agg": "token_sum_norm",
        },
    },
}

# The offline default (`rlvr train` with no arguments): sizes tuned so the built-in tiny model
# learns its task on a laptop CPU in minutes. Applied under every preset when the model is the
# built-in one and the user did not set them.
TINY_DEFAULTS: dict[str, dict[str, Any]] = {
    "optim": {"lr": 2e-4, "warmup_steps": 5},
    "train": {"max_steps": 60, "threads": 2},
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


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "none")


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Convert `value` (from YAML or a command-line string) to field type `tp`, or raise."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (
            isinstance(value, str) and value.lower() in ("none", "null", "")
        )
        if is_none and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, inner[0], value)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: got {value!r}, expected one of {', '.join(map(repr, args))}")
        return value
    if origin is dict:
        if isinstance(value, str):
            try:
                value = yaml.safe_load(value) if value.strip() else {}
            except yaml.YAMLError:
                raise ConfigError(f"{key}: got {value!r}, expected a mapping") from None
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, dict) for k, v in value.items()
        ):
            raise ConfigError(f"{key}: got {value!r}, expected a mapping of name -> settings")
        return {k: dict(v) for k, v in value.items()}
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: got {value!r}, expected a list")
        return tuple(_coerce(key, args[0], v) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{key}: got {value!r}, expected true or false")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{key}: got {value!r}, expected an integer")
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{key}: got {value!r}, expected an integer") from None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{key}: got {value!r}, expected a number")
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{key}: got {value!r}, expected a number") from None
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key}: got {value!r}, expected a string")
        return str(value)
    raise ConfigError(f"{key}: unsupported field type {tp}")  # pragma: no cover


def _resolved_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def apply_changes(cfg: Config, changes: dict[str, Any], source: str) -> Config:
    """Apply a nested dict {section: {key: value}} (or {"preset": name}) to `cfg`."""
    if not isinstance(changes, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(changes).__name__}")
    for section, values in changes.items():
        if section == "preset":
            continue
        if section not in SECTIONS:
            raise ConfigError(
                f"{source}: unknown section {section!r}; valid: {', '.join(SECTIONS)}"
            )
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping of keys to values")
        sub = getattr(cfg, section)
        hints = _resolved_types(type(sub))
        updates = {}
        for key, value in values.items():
            if key not in hints:
                raise ConfigError(
                    f"{source}: unknown key {section}.{key}; valid keys of {section}: "
                    f"{', '.join(hints)}"
                )
            updates[key] = _coerce(f"{section}.{key}", hints[key], value)
        cfg = replace(cfg, **{section: replace(sub, **updates)})
    return cfg


def parse_overrides(args: list[str]) -> dict[str, dict[str, str]]:
    """`--algo.clip_high=0.28` (or `algo.clip_high=0.28`) -> {"algo": {"clip_high": "0.28"}}."""
    out: dict[str, dict[str, str]] = {}
    for arg in args:
        body = arg[2:] if arg.startswith("--") else arg
        if "=" not in body or "." not in body.split("=", 1)[0]:
            raise ConfigError(f"override {arg!r}: expected --section.key=value")
        key, value = body.split("=", 1)
        section, name = key.split(".", 1)
        out.setdefault(section, {})[name] = value
    return out


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | dict[str, dict[str, Any]] | None = None,
    *,
    preset: str | None = None,
) -> Config:
    """Defaults -> preset -> YAML file -> overrides, then `validate`. Raises ConfigError."""
    file_changes: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            file_changes = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(file_changes, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    overrides = overrides or {}
    name = preset or overrides.get("preset") or file_changes.get("preset") or "dapo"
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    cfg = apply_changes(Config(preset=name), PRESETS[name], f"preset {name}")
    user = _merge(file_changes, overrides)
    if user.get("model", {}).get("name_or_path", "rlvr-tiny") == "rlvr-tiny":
        cfg = apply_changes(cfg, TINY_DEFAULTS, "built-in tiny model defaults")
    if file_changes:
        cfg = apply_changes(cfg, file_changes, str(path))
    cfg = apply_changes(cfg, overrides, "command line")
    validate(cfg)
    return cfg


def _merge(a: dict, b: dict) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in a.items()}
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def _check(ok: bool, key: str, expected: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{key}: got {value!r}, expected {expected}")


def validate(cfg: Config) -> None:
    """Range checks that need no model or data (those are checked at load, also before work)."""
    r, a, o, t = cfg.rollout, cfg.algo, cfg.optim, cfg.train
    _check(r.group_size >= 2, "rollout.group_size", ">= 2 (a group needs a baseline)", r.group_size)
    _check(r.prompts_per_step >= 1, "rollout.prompts_per_step", ">= 1", r.prompts_per_step)
    _check(r.max_new_tokens >= 1, "rollout.max_new_tokens", ">= 1", r.max_new_tokens)
    _check(r.temperature > 0, "rollout.temperature", "> 0", r.temperature)
    _check(0 < r.top_p <= 1, "rollout.top_p", "in (0, 1]", r.top_p)
    _check(r.top_k >= 0, "rollout.top_k", ">= 0", r.top_k)
    _check(
        0 <= r.min_new_tokens <= r.max_new_tokens,
        "rollout.min_new_tokens",
        f"0 <= min_new_tokens <= rollout.max_new_tokens ({r.max_new_tokens})",
        r.min_new_tokens,
    )
    _check(0 <= a.clip_low < 1, "algo.clip_low", "0 <= clip_low < 1", a.clip_low)
    _check(a.clip_high >= 0, "algo.clip_high", ">= 0", a.clip_high)
    _check(a.dual_clip is None or a.dual_clip > 1, "algo.dual_clip", "none or > 1", a.dual_clip)
    _check(a.kl_coef >= 0, "algo.kl_coef", ">= 0", a.kl_coef)
    _check(a.mu >= 1, "algo.mu", ">= 1", a.mu)
    _check(a.mini_batches >= 1, "algo.mini_batches", ">= 1", a.mini_batches)
    _check(
        r.prompts_per_step % a.mini_batches == 0,
        "algo.mini_batches",
        f"a divisor of rollout.prompts_per_step ({r.prompts_per_step}) so groups stay whole",
        a.mini_batches,
    )
    _check(a.max_gen_batches >= 1, "algo.max_gen_batches", ">= 1", a.max_gen_batches)
    _check(
        0 < a.overlong_cache < r.max_new_tokens or not a.soft_overlong,
        "algo.overlong_cache",
        f"0 < overlong_cache < rollout.max_new_tokens ({r.max_new_tokens})",
        a.overlong_cache,
    )
    _check(
        a.log_ratio_clamp is None or a.log_ratio_clamp > 0,
        "algo.log_ratio_clamp",
        "none or > 0",
        a.log_ratio_clamp,
    )
    _check(
        a.advantage != "grpo" or a.std != "unbiased" or r.group_size >= 2,
        "algo.std",
        "population when group_size is 1",
        a.std,
    )
    m = cfg.model
    _check(
        m.lora_rank == 0 or t.parallel == "ddp",
        "train.parallel",
        "ddp with LoRA (an adapter is small: shard the base with fsdp2 and no LoRA)",
        t.parallel,
    )
    _check(m.lora_rank >= 0, "model.lora_rank", ">= 0", m.lora_rank)
    _check(m.lora_alpha > 0, "model.lora_alpha", "> 0", m.lora_alpha)
    _check(0 <= m.lora_dropout < 1, "model.lora_dropout", "in [0, 1)", m.lora_dropout)
    _check(
        m.lora_rank == 0 or len(m.lora_target_modules) > 0,
        "model.lora_target_modules",
        "at least one module name",
        m.lora_target_modules,
    )
    _check(o.lr > 0, "optim.lr", "> 0", o.lr)
    _check(o.weight_decay >= 0, "optim.weight_decay", ">= 0", o.weight_decay)
    _check(0 <= o.beta1 < 1, "optim.beta1", "in [0, 1)", o.beta1)
    _check(0 <= o.beta2 < 1, "optim.beta2", "in [0, 1)", o.beta2)
    _check(o.warmup_steps >= 0, "optim.warmup_steps", ">= 0", o.warmup_steps)
    _check(o.max_grad_norm >= 0, "optim.max_grad_norm", ">= 0", o.max_grad_norm)
    _check(
        o.micro_batch_sequences >= 1, "optim.micro_batch_sequences", ">= 1", o.micro_batch_sequences
    )
    _check(t.max_steps >= 0, "train.max_steps", ">= 0", t.max_steps)
    _check(t.eval_size >= 0, "train.eval_size", ">= 0", t.eval_size)
    _check(t.eval_samples >= 1, "train.eval_samples", ">= 1", t.eval_samples)
    for key in ("eval_every", "log_samples", "save_every", "threads"):
        _check(getattr(t, key) >= 0, f"train.{key}", ">= 0", getattr(t, key))
    _check(t.max_bad_steps >= 1, "train.max_bad_steps", ">= 1", t.max_bad_steps)
    _check(t.entropy_floor >= 0, "train.entropy_floor", ">= 0", t.entropy_floor)
    _check(t.keep_checkpoints >= 1, "train.keep_checkpoints", ">= 1", t.keep_checkpoints)
    _check(cfg.reward.format_weight >= 0, "reward.format_weight", ">= 0", cfg.reward.format_weight)
    for item in cfg.reward.extra:
        _check(
            bool(re.fullmatch(r"[^=]+=[-+0-9.eE]+", item)),
            "reward.extra",
            "entries of the form name=weight",
            item,
        )
    from rlvr.rollout import ENGINES

    _check(
        r.engine in ENGINES, "rollout.engine", f"one of {', '.join(map(repr, ENGINES))}", r.engine
    )
    if cfg.data.path is None:
        from rlvr.tasks import TASKS

        _check(
            cfg.data.task in TASKS,
            "data.task",
            f"one of {', '.join(map(repr, TASKS))}",
            cfg.data.task,
        )
    else:
        for key in ("path", "eval_path"):
            value = getattr(cfg.data, key)
            try:
                ok = value is None or Path(value).exists()
            except (ValueError, OSError):  # e.g. an embedded NUL byte
                ok = False
            if not ok:
                raise ConfigError(f"data.{key}: {value} does not exist")


def to_dict(cfg: Config) -> dict[str, Any]:
    out = dataclasses.asdict(cfg)
    for sec in out.values():
        if isinstance(sec, dict):
            for k, v in sec.items():
                if isinstance(v, tuple):
                    sec[k] = list(v)
    return out


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def help_text() -> str:
    """Every key with its type, default and documentation, for `rlvr train --help`."""
    lines = []
    for name, cls in SECTIONS.items():
        cls = typing.get_type_hints(Config)[name]
        assert is_dataclass(cls)
        docs, hints, default = field_docs(cls), typing.get_type_hints(cls), cls()
        lines.append(f"{name}:")
        for f in fields(cls):
            lines.append(
                f"  --{name}.{f.name}={getattr(default, f.name)!r}  "
                f"({_type_name(hints[f.name])}) {docs.get(f.name, '')}"
            )
    return "\n".join(lines)
