"""TRL's `GRPOConfig` names as rlvr config changes (docs/from_trl.md has the whole table).

    trl_changes(args, num_rows=..., world_size=...) -> TRLArgs (config changes and notes)
    peft_changes(lora_config) -> {"model": {...}}    # a peft.LoraConfig as model.lora_* keys

`args` is a mapping of GRPOConfig field names (only the keys given are applied, on top of
the preset) or a `trl.GRPOConfig` object (every field applied as TRL would, its defaults
included: learning_rate 1e-6, bf16 autocast, gradient checkpointing, no dynamic sampling).
A field rlvr has no meaning for is refused by name; where an object holds TRL's default for
such a field, it is listed as not applied. Units: TRL's `per_device_train_batch_size` counts
completions and its steps count optimiser steps, so

    prompts_per_step = per_device_train_batch_size x ranks x steps_per_generation / num_generations
    mini_batches     = steps_per_generation / gradient_accumulation_steps
    train.max_steps  = max_steps / (num_iterations x mini_batches)   (rollout steps)

with steps_per_generation = gradient_accumulation_steps unless given (TRL's default); each
division must be exact, else the field is refused with the numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlvr.config.names import SAME, did_you_mean
from rlvr.config.schema import ConfigError

LOSS_TYPES = {"grpo": "sample_mean", "dapo": "token_mean", "dr_grpo": "token_sum_norm"}
SCALE_REWARDS = {"group": "grpo", True: "grpo", "none": "dr_grpo", False: "dr_grpo"}
# Fields read by the mapping below (batch units, steps, precision, engine, ...).
MAPPED = {
    "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
    "generation_batch_size", "max_steps", "num_train_epochs", "save_steps", "save_strategy",
    "eval_steps", "eval_strategy", "logging_steps", "logging_strategy", "loss_type",
    "scale_rewards", "bf16", "fp16", "use_cpu", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "report_to",
    "sync_ref_model", "ref_model_sync_steps", "ref_model_mixup_alpha", "reward_weights",
    "activation_checkpointing", "lr_scheduler_type", "optim", "adam_epsilon", "warmup_ratio",
    "lr_scheduler_kwargs",
}  # fmt: skip
# Fields that change nothing here (logging cosmetics, data loading, TRL-internal switches).
NO_EFFECT = {
    "run_name", "logging_dir", "logging_first_step", "logging_nan_inf_filter", "log_level",
    "log_level_replica", "log_on_each_node", "disable_tqdm", "log_completions",
    "num_completions_to_print", "log_unique_prompts", "log_multimodal", "remove_unused_columns",
    "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor", "dataloader_drop_last", "dataloader_in_order",
    "ds3_gather_for_generation", "pad_to_multiple_of", "skip_memory_metrics", "do_train",
    "do_eval", "do_predict", "overwrite_output_dir", "use_cache", "average_tokens_across_devices",
    "disable_dropout", "shuffle_dataset", "cache_implementation", "accelerator_config",
    "include_num_input_tokens_seen", "ddp_timeout", "local_rank", "trust_remote_code",
    "save_on_each_node", "save_only_model", "length_column_name", "train_sampling_strategy",
}  # fmt: skip
# Fields rlvr has no counterpart for: (does this value ask for it?, why rlvr lacks it). An
# explicit value that asks for it is refused; TRL's own default that does is listed as not
# applied (the KL's importance weighting).
WHY_NOT: dict[str, tuple[Any, str]] = {
    "top_entropy_quantile": (lambda v, a: v != 1.0, "rlvr's algo.top_entropy_quantile also "
                             "takes the dropped tokens out of the normaliser and the KL term "
                             "(the paper's code; TRL's only out of the policy term): set that"),
    "entropy_coef": (lambda v, a: v != 0, "rlvr's loss has no entropy bonus"),
    "use_adaptive_entropy": (lambda v, a: bool(v), "rlvr's loss has no entropy bonus"),
    "multi_objective_aggregation": (lambda v, a: v != "sum_then_normalize",
                                    "rlvr's algo.advantage=gdpo normalises each reward within its "
                                    "group, then whitens over the batch's tokens with verl's eps "
                                    "(TRL: over its samples, eps 1e-4): set that"),
    "use_bias_correction_kl": (lambda v, a: bool(v) and bool(a.get("beta")),
                               "rlvr's KL term is not weighted by the importance ratio"),
    "cast_lm_head_to_fp32": (lambda v, a: bool(v), "rlvr computes the head in the model's dtype"),
    "vllm_importance_sampling_correction": (
        lambda v, a: bool(v) and bool(a.get("use_vllm")),
        "not translated: set algo.rollout_correction (docs/algorithms.md#rollout-correction)"),
    "fp16": (lambda v, a: bool(v), "rlvr trains in fp32 or under bf16 autocast (bf16=True)"),
    "use_liger_kernel": (lambda v, a: bool(v), "rlvr has its own kernels (rlvr.cpu) only"),
    "torch_compile": (lambda v, a: bool(v), "rlvr does not compile the model"),
    "push_to_hub": (lambda v, a: bool(v), "rlvr writes the run directory only (rlvr export)"),
    "num_generations_eval": (lambda v, a: v is not None, "use train.eval_samples"),
    "repetition_penalty": (lambda v, a: v != 1.0, "rlvr's samplers have no repetition penalty"),
    "min_p": (lambda v, a: v is not None, "rlvr's samplers have top_p and top_k"),
    "generation_kwargs": (lambda v, a: bool(v), "rlvr's sampling settings are rollout.*"),
    "max_tool_calling_iterations": (lambda v, a: v is not None, "use rollout.max_tool_calls"),
}  # fmt: skip


@dataclass(frozen=True)
class TRLArgs:
    """`changes`: rlvr config changes; `notes`: one line per TRL field that differs in
    meaning or was not applied; `logging_steps`: the interval of TrainerCallback.on_log;
    `reward_weights`: TRL's, when given; `source`: the object or mapping as given."""

    changes: dict[str, dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    logging_steps: int = 1
    reward_weights: list[float] | None = None
    source: Any = None


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)  # transformers' str enums


def _fields(args: Any) -> tuple[dict[str, Any], set[str], set[str]]:
    """(values, names given explicitly, every field name). An object's fields are all
    applied; those holding a value other than the class default count as given."""
    if isinstance(args, Mapping):
        return dict(args), set(args), set(args)
    if not dataclasses.is_dataclass(args):
        raise ConfigError(
            f"args: expected a trl.GRPOConfig or a mapping of its field names, got "
            f"{type(args).__name__}"
        )
    reference = _reference(args)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    given = {n for n, v in values.items() if _plain(v) != _plain(getattr(reference, n, None))}
    return values, given, set(values)


def _reference(args: Any) -> Any:
    """The object's class built with only the fields that decide its post-init defaults:
    its other fields equal to this one's are TRL's defaults, not choices."""
    keep = ("output_dir", "use_cpu", "bf16", "fp16")
    try:
        return type(args)(**{k: getattr(args, k) for k in keep if hasattr(args, k)})
    except Exception as e:  # a GRPOConfig that refuses these alone: name why
        raise ConfigError(
            f"args: cannot read TRL's defaults from {type(args).__name__}: {e}"
        ) from None


def _exact(numerator: int, denominator: int, what: str) -> int:
    if denominator <= 0 or numerator % denominator:
        raise ConfigError(f"args: {what} is not a whole number ({numerator} / {denominator})")
    return numerator // denominator


class _Changes:
    def __init__(self) -> None:
        self.changes: dict[str, dict[str, Any]] = {}

    def set(self, key: str, value: Any) -> None:
        section, name = key.split(".", 1)  # name may be an engine section's: vllm.memory
        self.changes.setdefault(section, {})[name] = value


def trl_changes(args: Any, *, num_rows: int | None = None, world_size: int = 1) -> TRLArgs:
    """The rlvr config changes `args` (a GRPOConfig or a mapping of its names) stands for."""
    values, given, names = _fields(args)
    is_object = not isinstance(args, Mapping)
    out, notes = _Changes(), []
    known = set(SAME) | MAPPED | NO_EFFECT
    if not is_object:
        for name in sorted(given - known - set(WHY_NOT)):
            raise ConfigError(
                f"args: {name!r} is not a GRPOConfig field that rlvr carries (docs/from_trl.md "
                f"lists them){did_you_mean(name, known | set(WHY_NOT))}"
            )
    for name in sorted(names & set(WHY_NOT)):
        asks, why = WHY_NOT[name]
        if not asks(values[name], values):
            continue
        if name in given:
            raise ConfigError(f"args: {name}={_plain(values[name])!r}: {why}")
        notes.append(f"{name}={_plain(values[name])!r} (TRL's default) not applied: {why}")
    for name in sorted(given - known - set(WHY_NOT)):
        raise ConfigError(f"args: {name}={_plain(values[name])!r} has no meaning in rlvr")
    for name, key in SAME.items():
        if name in values and (name in given or is_object) and values[name] is not None:
            out.set(key, values[name])
    if is_object and values.get("save_total_limit") is None:
        notes.append("save_total_limit=None (TRL's default: keep every checkpoint) not applied: "
                     "rlvr keeps the newest train.keep_checkpoints")  # fmt: skip
    if "epsilon" in values and values.get("epsilon_high") is None:
        out.set("algo.clip_high", values["epsilon"])  # TRL: epsilon_high defaults to epsilon
    _batch(values, given, is_object, world_size, out)
    _steps(values, given, is_object, num_rows, out)
    _algorithm(values, given, is_object, out, notes)
    _run(values, given, is_object, out)
    _schedule(values, given, is_object, out)
    logging = (
        values.get("logging_steps", 1)
        if _plain(values.get("logging_strategy", "steps")) != "no"
        else 0
    )
    weights = values.get("reward_weights")
    return TRLArgs(out.changes, notes, int(logging or 0), list(weights) if weights else None, args)


def _batch(values, given, is_object, world_size: int, out: _Changes) -> None:
    units = {"per_device_train_batch_size", "gradient_accumulation_steps",
             "steps_per_generation", "generation_batch_size"}  # fmt: skip
    if not is_object and not units & given:
        return
    if not is_object and "num_generations" not in given:
        raise ConfigError(
            "args: per_device_train_batch_size and gradient_accumulation_steps count "
            "completions; give num_generations with them so that prompts per step is exact"
        )
    per_device = int(values.get("per_device_train_batch_size", 8))
    accumulation = int(values.get("gradient_accumulation_steps", 1))
    group = int(values["num_generations"])
    spg, gbs = values.get("steps_per_generation"), values.get("generation_batch_size")
    if spg is not None and gbs is not None and not is_object:
        raise ConfigError("args: give steps_per_generation or generation_batch_size, not both")
    if spg is None:
        spg = accumulation if gbs is None else _exact(gbs, per_device * world_size,
                                                      "generation_batch_size / global batch")  # fmt: skip
    completions = per_device * world_size * int(spg)
    out.set("rollout.prompts_per_step", _exact(completions, group,
            f"per_device_train_batch_size x {world_size} ranks x steps_per_generation "
            "/ num_generations (prompts per step)"))  # fmt: skip
    out.set("algo.mini_batches", _exact(int(spg), accumulation,
            "steps_per_generation / gradient_accumulation_steps (optimiser steps per rollout)"))  # fmt: skip
    out.set("optim.micro_batch_sequences", per_device)


def _per_rollout(values, out: _Changes) -> int:
    """TRL optimiser steps per rlvr rollout step: num_iterations x mini_batches."""
    mu = int(values.get("num_iterations") or 1)
    return mu * int(out.changes.get("algo", {}).get("mini_batches", 1))


def _steps(values, given, is_object, num_rows, out: _Changes) -> None:
    per = _per_rollout(values, out)
    max_steps = values.get("max_steps", -1)
    if max_steps is not None and max_steps > 0:
        out.set("train.max_steps", _exact(int(max_steps), per,
                "max_steps / (num_iterations x mini_batches) (rollout steps)"))  # fmt: skip
    elif is_object or "num_train_epochs" in given:
        prompts = out.changes.get("rollout", {}).get("prompts_per_step")
        if num_rows is None or prompts is None:
            raise ConfigError(
                "args: max_steps is not set and num_train_epochs needs the number of rows of an "
                "in-memory train_dataset and the batch size; set max_steps"
            )
        epochs = float(values.get("num_train_epochs", 3.0))
        out.set("train.max_steps", max(1, math.ceil(epochs * (num_rows // prompts))))
    strategy = _plain(values.get("save_strategy", "steps"))
    if strategy == "no":
        out.set("train.save_every", 0)
    elif strategy == "steps" and (is_object or "save_steps" in given):
        out.set("train.save_every", _exact(int(values.get("save_steps", 500)), per,
                "save_steps / (num_iterations x mini_batches)"))  # fmt: skip
    elif strategy not in ("steps", "no"):
        raise ConfigError(f"args: save_strategy={strategy!r}: rlvr saves every N steps or 'no'")
    eval_strategy = _plain(values.get("eval_strategy", "no"))
    if eval_strategy == "steps":
        every = values.get("eval_steps") or values.get("logging_steps", 10)
        out.set(
            "train.eval_every",
            _exact(int(every), per, "eval_steps / (num_iterations x mini_batches)"),
        )
    elif eval_strategy == "no" and is_object:
        out.set("train.eval_every", 0)
    elif eval_strategy not in ("steps", "no"):
        raise ConfigError(f"args: eval_strategy={eval_strategy!r}: rlvr evaluates every N steps")


def _algorithm(values, given, is_object, out: _Changes, notes: list[str]) -> None:
    if "loss_type" in values and (is_object or "loss_type" in given):
        loss = values["loss_type"]
        if loss not in LOSS_TYPES:
            why = (" (bnpo normalises per micro-batch; rlvr by the whole step's tokens: dapo)"
                   if loss == "bnpo" else "")  # fmt: skip
            raise ConfigError(f"args: loss_type={loss!r}: rlvr has {', '.join(LOSS_TYPES)}{why}")
        out.set("algo.agg", LOSS_TYPES[loss])
    delta = values.get("delta")
    high = values.get("epsilon_high") or values.get("epsilon") or 0.28  # dapo's clip_high
    if delta is not None and delta <= 1 + high:
        raise ConfigError(
            f"args: delta={delta}: rlvr's dual_clip is TRL's delta only above 1 + epsilon_high "
            f"({1 + high:g}); below it TRL's clamp also cuts positive-advantage tokens"
        )
    if "scale_rewards" in values and (is_object or "scale_rewards" in given):
        scale = values["scale_rewards"]
        if scale not in SCALE_REWARDS:
            raise ConfigError(f"args: scale_rewards={scale!r}: rlvr has 'group' and 'none'")
        out.set("algo.advantage", SCALE_REWARDS[scale])
    if is_object:  # TRL's loop: no dynamic sampling, no soft overlong punishment
        out.set("algo.dynamic_sampling", False)
        out.set("algo.soft_overlong", False)
    if values.get("sync_ref_model"):
        steps = _exact(int(values.get("ref_model_sync_steps", 512)), _per_rollout(values, out),
                       "ref_model_sync_steps / (num_iterations x mini_batches)")  # fmt: skip
        out.set("algo.ref_sync_every", steps)
        out.set("algo.ref_mixup_alpha", values.get("ref_model_mixup_alpha", 0.6))


def _run(values, given, is_object, out: _Changes) -> None:
    if values.get("bf16"):
        out.set("model.autocast", "bfloat16")
    elif is_object or "bf16" in given:
        out.set("model.autocast", "none")
    if values.get("use_cpu"):
        out.set("model.device", "cpu")
    if values.get("use_vllm"):
        if values.get("vllm_mode", "colocate") != "colocate":
            raise ConfigError("args: vllm_mode='server': rlvr runs vLLM colocated only")
        out.set("rollout.engine", "vllm")
        out.set("rollout.vllm.memory", values.get("vllm_gpu_memory_utilization", 0.3))
    if values.get("activation_checkpointing") and is_object:
        out.set("optim.gradient_checkpointing", True)
    optim = _plain(values.get("optim", "adamw_torch_fused"))
    if optim not in ("adamw_torch_fused", "adamw_torch"):
        raise ConfigError(f"args: optim={optim!r}: rlvr trains with torch's (fused) AdamW")
    if values.get("adam_epsilon", 1e-8) != 1e-8:
        raise ConfigError("args: adam_epsilon: rlvr's AdamW uses torch's eps=1e-8")
    report = values.get("report_to")
    if report is not None and (is_object or "report_to" in given):
        report = [report] if isinstance(report, str) else list(report)
        trackers = [r for r in report if r not in ("tensorboard", "none")]
        if "all" in trackers or any(r not in ("wandb", "trackio") for r in trackers):
            raise ConfigError(f"args: report_to={report!r}: rlvr reports to tensorboard "
                              "(always), wandb and trackio")  # fmt: skip
        out.set("train.report_to", trackers)


SCHEDULES = ("linear", "cosine", "cosine_with_min_lr", "constant", "constant_with_warmup",
             "polynomial")  # fmt: skip


def _schedule(values, given, is_object, out: _Changes) -> None:
    """TRL's learning-rate schedule: its type, its warm-up (warmup_steps wins over
    warmup_ratio, as in transformers; a float warmup_steps below 1 is a ratio) and
    cosine_with_min_lr's min_lr_rate, counted as TRL counts (optim.warmup_from_zero)."""
    keys = {"lr_scheduler_type", "warmup_steps", "warmup_ratio", "lr_scheduler_kwargs"}
    if not is_object and not keys & given:
        return
    kind = _plain(values.get("lr_scheduler_type", "linear"))
    if kind not in SCHEDULES:
        raise ConfigError(f"args: lr_scheduler_type={kind!r}: rlvr has {', '.join(SCHEDULES)}")
    if is_object or "lr_scheduler_type" in given:
        out.set("optim.lr_schedule", kind)
    steps, ratio = values.get("warmup_steps") or 0, values.get("warmup_ratio") or 0.0
    if 0 < steps < 1:
        steps, ratio = 0, steps
    out.set("optim.warmup_steps", int(steps))
    out.set("optim.warmup_ratio", 0.0 if steps else float(ratio))
    extra = dict(values.get("lr_scheduler_kwargs") or {})
    if "min_lr_rate" in extra:
        out.set("optim.min_lr_rate", float(extra.pop("min_lr_rate")))
    if extra:
        raise ConfigError(f"args: lr_scheduler_kwargs {sorted(extra)}: rlvr carries min_lr_rate")
    out.set("optim.warmup_from_zero", True)


def peft_changes(config: Any) -> dict[str, dict[str, Any]]:
    """A `peft.LoraConfig` as model.lora_* keys; a setting rlvr does not carry is refused."""
    if type(config).__name__ != "LoraConfig":
        raise ConfigError(f"peft_config: expected a peft.LoraConfig, got {type(config).__name__}")
    import peft

    default = peft.LoraConfig()
    ignored = {"r", "lora_alpha", "lora_dropout", "target_modules", "task_type", "peft_type",
               "base_model_name_or_path", "revision", "inference_mode", "auto_mapping"}  # fmt: skip
    for f in dataclasses.fields(config):
        if f.name in ignored or not hasattr(default, f.name):
            continue
        if getattr(config, f.name) != getattr(default, f.name):
            raise ConfigError(
                f"peft_config: {f.name}={getattr(config, f.name)!r} is not carried by rlvr "
                "(it sets r, lora_alpha, lora_dropout and target_modules)"
            )
    targets = config.target_modules
    if targets is None:
        raise ConfigError("peft_config: target_modules is not set; give names or 'all-linear'")
    targets = [targets] if isinstance(targets, str) else sorted(targets)
    return {"model": {"lora_rank": config.r, "lora_alpha": float(config.lora_alpha),
                      "lora_dropout": config.lora_dropout, "lora_target_modules": targets}}  # fmt: skip


def differences(base: dict[str, dict[str, Any]], applied: dict[str, dict[str, Any]]) -> list[str]:
    """`section.key: preset value -> value` for each key the TRL args changed (`to_dict`s,
    their sections as `rlvr.config.flat_keys` spells them: `rollout.vllm.memory`)."""
    lines = []
    for section, keys in applied.items():
        if not isinstance(keys, dict):
            continue
        for key, value in keys.items():
            if base[section][key] != value:
                lines.append(f"  {section}.{key}: {base[section][key]!r} -> {value!r}")
    return lines
