"""`rlvr rm`'s own keys (`--rm.key=value`); the policy, task and sampling come from the
training config's keys (`--model.name_or_path`, `--data.task`, `--rollout.temperature`, ...)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from rlvr.config.load import _coerce
from rlvr.config.names import did_you_mean
from rlvr.config.schema import ConfigError, field_docs


@dataclass(frozen=True)
class RMConfig:
    """The reward model and its training.

    loss: bce (pointwise, each response's last-token logit against its rule label),
        token_bce (the same at every response token, Cobbe et al. 2021), prefix_bce (every
        token against its prefix's share of correct responses, Math-Shepherd's soft label) or
        bt (Bradley-Terry over the (correct, wrong) pairs of each prompt's responses).
    lr: AdamW learning rate (constant).
    epochs: passes over the training responses.
    batch_groups: prompts per batch (each with all its responses).
    train_prompts: training prompts, each answered samples_per_prompt times by the policy.
    eval_prompts: held-out prompts (the task's held-out split), answered the same way.
    samples_per_prompt: responses sampled per prompt at rollout.temperature.
    max_length: tokens the reward model reads, cut from the left (the response's end is kept).
    backbone: the causal LM whose backbone carries the head (none = model.name_or_path).
    arch: surprise (the last-token head plus the backbone's lowest and mean log-probability of
        the response's tokens, rlvr.rm.verifier: held-out AUC 0.97 on the built-in task) or
        classifier (the plain AutoModelForSequenceClassification head at the last token: 0.62
        there; it learns which prompts are hard, not which answers are wrong).
    extra_layers: new decoder layers stacked on the backbone's, each starting as the identity
        (Llama-family models): room to compare each token with the backbone's own prediction
        of it, which the last layer's output holds and no existing layer can read.
    save_every: checkpoint every N optimiser steps (0 = only at the end).
    seed: the seed of the sampling, the head's initialisation and the batch order.
    """

    loss: Literal["bce", "token_bce", "prefix_bce", "bt"] = "bce"
    lr: float = 3e-4
    epochs: int = 3
    batch_groups: int = 8
    train_prompts: int = 1024
    eval_prompts: int = 256
    samples_per_prompt: int = 8
    max_length: int = 512
    backbone: str | None = None
    arch: Literal["surprise", "classifier"] = "surprise"
    extra_layers: int = 0
    save_every: int = 50
    seed: int = 0


def rm_config(changes: dict[str, Any], source: str = "command line") -> RMConfig:
    """RMConfig from {key: value} (strings from the command line or YAML values), checked."""
    hints = typing.get_type_hints(RMConfig)
    updates = {}
    for key, value in changes.items():
        if key not in hints:
            raise ConfigError(
                f"{source}: unknown key rm.{key}{did_you_mean(f'rm.{key}', [f'rm.{h}' for h in hints])}; "
                f"valid keys of rm: {', '.join(hints)}"
            )
        updates[key] = _coerce(f"rm.{key}", hints[key], value)
    cfg = dataclasses.replace(RMConfig(), **updates)
    for key in ("epochs", "batch_groups", "train_prompts", "eval_prompts", "max_length"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"rm.{key}: got {getattr(cfg, key)!r}, expected >= 1")
    if cfg.samples_per_prompt < 2 and cfg.loss == "bt":
        raise ConfigError("rm.samples_per_prompt: Bradley-Terry pairs need >= 2 per prompt")
    if cfg.samples_per_prompt < 1:
        raise ConfigError(f"rm.samples_per_prompt: got {cfg.samples_per_prompt}, expected >= 1")
    if not cfg.lr > 0:
        raise ConfigError(f"rm.lr: got {cfg.lr!r}, expected > 0")
    if cfg.extra_layers < 0:
        raise ConfigError(f"rm.extra_layers: got {cfg.extra_layers!r}, expected >= 0")
    if cfg.extra_layers and cfg.arch != "classifier":
        raise ConfigError("rm.extra_layers: only rm.arch=classifier stacks new layers "
                          f"(got rm.arch={cfg.arch})")  # fmt: skip
    if cfg.save_every < 0:
        raise ConfigError(f"rm.save_every: got {cfg.save_every!r}, expected >= 0")
    return cfg


def dump(cfg: RMConfig) -> str:
    return yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)


def help_text() -> str:
    docs, default = field_docs(RMConfig), RMConfig()
    return "\n".join(
        f"  --rm.{f.name}={getattr(default, f.name)!r}  {docs.get(f.name, '')}"
        for f in dataclasses.fields(RMConfig)
    )
