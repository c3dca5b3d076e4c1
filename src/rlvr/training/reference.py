"""Reference resets: ref <- alpha * policy + (1 - alpha) * ref, parameter by parameter
(TRL's `sync_ref_model` convention; alpha = 1 is DeepSeekMath's `reference <- policy`).

Which weights:
- a full policy: the frozen reference copy is mixed in place with the policy's weights (under
  FSDP2 the policy's whole weights are gathered first, a collective every rank joins; every
  rank holds the same whole reference copy and mixes it identically);
- LoRA: before the first reset the reference is the base with the adapters switched off (no
  second copy). A reset has to make the reference the policy, base + (alpha/r) B A, which the
  base alone cannot hold while the adapters keep training on top of it, so the first reset
  materialises a frozen full copy of the base (PEFT's `unload`, the adapters removed, not
  merged) and mixes the merged policy into it; from then on the reference is that copy, as
  without LoRA. The adapters and the optimiser are untouched, so the policy does not move;
  checkpoints still hold the adapter and `rlvr export --merge` still folds it into the
  unchanged base. The cost is the second copy of the weights LoRA otherwise avoids.

Exact under resume: once a reset has happened the reference is no longer reconstructible from
the model's name, so its weights go into the checkpoint's trainer state (`state`) and are
loaded back (`load_state`). The CPU backend's packed copy of the frozen reference's linears
(`rlvr.cpu.fused.pack_frozen_linears`) is made again after every change.
"""

from __future__ import annotations

from copy import deepcopy

import torch

import rlvr.cpu as cpu
from rlvr.run.distributed import is_sharded
from rlvr.training.policy import Policy, is_lora


@torch.no_grad()
def mix_(ref: dict[str, torch.Tensor], policy: dict[str, torch.Tensor], alpha: float) -> None:
    """ref <- alpha * policy + (1 - alpha) * ref for every floating-point tensor of `ref`
    (alpha = 1: an exact copy); other tensors (integer buffers) are copied. Tensors sharing
    storage (tied weights) are updated once."""
    missing = sorted(set(ref) - set(policy))
    if missing:
        raise KeyError(f"reference reset: the policy has no weights for {missing[:3]}")
    seen: set[int] = set()
    for name, r in ref.items():
        if r.data_ptr() in seen:  # tied weights (embeddings and head): one tensor, mixed once
            continue
        seen.add(r.data_ptr())
        p = policy[name].to(device=r.device, dtype=r.dtype)
        if alpha == 1.0 or not r.is_floating_point():
            r.copy_(p)
        else:
            r.mul_(1.0 - alpha).add_(p, alpha=alpha)


def _policy_weights(
    model: torch.nn.Module,
) -> tuple[dict[str, torch.Tensor], torch.nn.Module | None]:
    """The policy's whole weights by the reference copy's names, and (LoRA) the merged model
    they come from."""
    if is_lora(model):
        merged = deepcopy(model).merge_and_unload()
        return merged.state_dict(), merged
    if is_sharded(model):  # FSDP2: every rank gets the whole tensors (a collective)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=False)
        return get_model_state_dict(model, options=opts), None
    return model.state_dict(), None


def _frozen(model: torch.nn.Module) -> torch.nn.Module:
    model.requires_grad_(False)
    return model.eval()


def _base_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A full copy of a PEFT model's base weights, the adapters removed (not merged)."""
    return _frozen(deepcopy(model).unload())


def _repack(backend: cpu.Backend, ref: torch.nn.Module) -> None:
    """Make the CPU backend's packed copy of the reference's linears again (stale now)."""
    for m in ref.modules():
        if isinstance(m, torch.nn.Linear):
            m.__dict__.pop("forward", None)
    backend.pack_frozen(ref)


class ReferenceSync:
    """The reference resets of one run, and what a checkpoint needs to restore them."""

    def __init__(self, policy: Policy, backend: cpu.Backend, alpha: float):
        self.policy, self.backend, self.alpha = policy, backend, alpha
        self.resets = 0

    def reset(self) -> None:
        """ref <- alpha * policy + (1 - alpha) * ref (every rank, the same)."""
        model, policy = self.policy.model, self.policy
        weights, merged = _policy_weights(model)
        if policy.reference_copy is None:
            if not is_lora(model):
                raise RuntimeError("reference reset: the run has no reference (kl_coef is 0)")
            if self.alpha == 1.0 and merged is not None:
                policy.reference_copy = _frozen(merged)  # already the policy's weights
            else:
                policy.reference_copy = _base_copy(model)
        if policy.reference_copy is not merged:
            mix_(policy.reference_copy.state_dict(), weights, self.alpha)
        _repack(self.backend, policy.reference_copy)
        self.resets += 1

    def state(self) -> dict:
        """What the checkpoint holds: the reset count and, once reset, the reference's weights."""
        ref = self.policy.reference_copy
        weights = None
        if self.resets and ref is not None:
            weights = {k: v.detach().cpu().clone() for k, v in ref.state_dict().items()}
        return {"resets": self.resets, "weights": weights}

    def load_state(self, state: dict | None) -> None:
        if not state or not state.get("resets"):
            return
        self.resets = state["resets"]
        policy = self.policy
        if policy.reference_copy is None:  # LoRA after a reset: the copy is rebuilt, then loaded
            policy.reference_copy = _base_copy(policy.model)
        policy.reference_copy.load_state_dict(state["weights"])
        _repack(self.backend, policy.reference_copy)
