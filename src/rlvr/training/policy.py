"""The trained policy and its reference: a full model, or a LoRA adapter (PEFT) on a frozen base;
and PPO's critic (`rlvr.training.critic`) built from the config.

With LoRA the reference is the base with the adapter switched off, so no second copy of the
weights is held; checkpoints hold the adapter only, and `rlvr export --merge` folds it in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlvr.config.extras import install_hint
from rlvr.config.schema import Config, ConfigError
from rlvr.models import load_model
from rlvr.rollout.base import derive_seed
from rlvr.run.distributed import Dist, load_optimizer_state, wrap
from rlvr.training.critic import Critic, ValueModel


@dataclass
class Policy:
    model: torch.nn.Module  # the module trained (a PeftModel under LoRA)
    reference_copy: torch.nn.Module | None  # a frozen full copy, only without LoRA and kl > 0

    @property
    def reference_kind(self) -> str:
        if self.reference_copy is not None:
            return "copy"
        return "adapter-disabled" if is_lora(self.model) else "none"

    @contextlib.contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """The module that computes reference log-probs, for the duration of the block."""
        if self.reference_copy is not None:
            yield self.reference_copy
        elif is_lora(self.model):
            with self.model.disable_adapter():
                yield self.model
        else:
            raise RuntimeError("no reference model: kl_coef is 0")


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def lora_targets(names: tuple[str, ...]) -> str | list[str]:
    """peft's target_modules: "all-linear" (every linear layer but the output head, as peft
    finds them) as the string peft takes, else the module names as a list."""
    return "all-linear" if tuple(names) == ("all-linear",) else list(names)


def _lora_config(cfg: Config):
    from peft import LoraConfig

    m = cfg.model
    return LoraConfig(
        r=m.lora_rank,
        lora_alpha=m.lora_alpha,
        lora_dropout=m.lora_dropout,
        target_modules=lora_targets(m.lora_target_modules),
        task_type="CAUSAL_LM",
    )


def _checkpointing(model, cfg: Config):
    """Gradient checkpointing when asked (non-reentrant: no input needs requires_grad, so it
    also works with frozen LoRA bases)."""
    if cfg.optim.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def load_policy(
    cfg: Config, checkpoint: Path | None, device: torch.device, model: torch.nn.Module | None = None
) -> Policy:
    """The policy from the model (or a checkpoint to resume), and the reference if kl > 0.
    `model`, a model object (the Python API), is trained in place of loading
    `model.name_or_path`; the reference is then a frozen copy of it."""
    m, given = cfg.model, model

    used = []

    def load(name: str, *, dtype: str, device: torch.device) -> torch.nn.Module:
        if given is None or name != m.name_or_path:
            return load_model(name, dtype=dtype, device=device)
        out = deepcopy(given) if used else given.to(device)  # the reference: a copy of the start
        used.append(out)
        return out if dtype == "auto" else out.to(getattr(torch, dtype))

    if m.lora_rank > 0:
        try:
            import peft
        except ImportError:
            hint = install_hint("peft")
            raise ConfigError(f"model.lora_rank > 0 needs peft: {hint}") from None
        base = load(m.name_or_path, dtype=m.dtype, device=device)
        if checkpoint is not None:
            model = peft.PeftModel.from_pretrained(base, str(checkpoint), is_trainable=True)
        else:
            try:  # the adapters' initial A from the run's seed: a rerun starts the same
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(derive_seed(cfg.train.seed, "lora-init"))
                    model = peft.get_peft_model(base, _lora_config(cfg))
            except ValueError as e:  # e.g. target modules not found in the model
                raise ConfigError(f"model.lora_target_modules: {e}") from None
        return Policy(_checkpointing(model, cfg).eval(), None)
    model = load(str(checkpoint) if checkpoint else m.name_or_path, dtype=m.dtype, device=device)
    model = _checkpointing(model, cfg)
    ref = None
    if cfg.algo.kl_coef > 0:  # the reference is the starting policy, frozen
        ref = load(m.name_or_path, dtype=m.dtype, device=device).eval()
        ref.requires_grad_(False)
    return Policy(model.eval(), ref)


def export_merged(checkpoint: Path, base: str, out_dir: Path) -> Path:
    """Fold a LoRA checkpoint into its base and write a plain Hugging Face model."""
    import peft

    from rlvr.models import load_tokenizer

    model = peft.PeftModel.from_pretrained(load_model(base), str(checkpoint))
    merged = model.merge_and_unload()
    merged.save_pretrained(out_dir)
    load_tokenizer(str(checkpoint)).save_pretrained(out_dir)
    return out_dir


def _backbone(name: str, cfg: Config, device: torch.device) -> tuple[nn.Module, int]:
    lm = load_model(name, dtype=cfg.model.dtype, device=device)
    backbone = getattr(lm, lm.base_model_prefix, None)
    if backbone is None or not hasattr(lm.config, "hidden_size"):
        raise ConfigError(f"critic.model: {name!r} has no transformer backbone to put a head on")
    if cfg.optim.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(backbone, "activation_checkpointing_enable"):
            backbone.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if cfg.model.lora_rank > 0:
        import peft

        m = cfg.model
        lora = peft.LoraConfig(
            r=m.lora_rank,
            lora_alpha=m.lora_alpha,
            lora_dropout=m.lora_dropout,
            target_modules=lora_targets(m.lora_target_modules),
        )
        try:
            backbone = peft.get_peft_model(backbone, lora)
        except ValueError as e:
            raise ConfigError(f"model.lora_target_modules (critic): {e}") from None
    return backbone, lm.config.hidden_size


def build_critic(
    cfg: Config, device: torch.device, d: Dist, state: dict[str, Any] | None = None
) -> Critic:
    """The critic, from `critic.model` (or the policy's starting weights), or resumed from a
    checkpoint's `state` (`Critic.state`)."""
    name = cfg.critic.model or cfg.model.name_or_path
    backbone, hidden = _backbone(name, cfg, device)
    surprise = cfg.critic.arch == "surprise"
    model = ValueModel(backbone, hidden, seed=cfg.train.seed, surprise=surprise).to(device)
    if state is not None:
        _load_weights(model, state["weights"])
    model.eval()  # dropout off, as the policy (train mode only inside the update)
    module = wrap(model, d, device, cfg.train.parallel)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable,
        lr=cfg.critic.lr,
        betas=(cfg.optim.beta1, cfg.optim.beta2),
        weight_decay=cfg.critic.weight_decay,
        fused=all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in trainable),
    )
    if state is not None:
        load_optimizer_state(model, optimizer, state["optimizer"])
    return Critic(model, module, optimizer)


def _load_weights(model: ValueModel, weights: dict[str, torch.Tensor]) -> None:
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    _, unexpected = model.load_state_dict(weights, strict=False)
    lost = sorted(trainable - set(weights))
    if unexpected or lost:
        raise ConfigError(
            "critic checkpoint does not match the critic built from the config "
            f"(missing {lost[:5]}, unexpected {list(unexpected)[:5]}): resume with the "
            "run's own config"
        )
