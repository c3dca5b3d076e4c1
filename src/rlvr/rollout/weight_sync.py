"""The policy's weights, as an inference engine's loader expects them.

An inference engine (vLLM) holds its own copy of the weights and loads new ones through
`load_weights(iterable of (name, tensor))`, under the base model's parameter names. What it
must receive is what the policy computes:

- under LoRA (PEFT), the adapter merged into each targeted weight, W + (alpha / r) B A, as a
  new tensor: the policy's own weights are left exactly as they were;
- under FSDP2, whole tensors: a sharded parameter (a DTensor) is gathered with
  `full_tensor()`, a collective that every rank runs for the same parameters in the same order;
- on the engine's device, outside autocast (a merge computed in bf16 would round the weights).

Tensors are streamed one at a time: a loader that copies each into its own parameter (vLLM's
do) keeps at most one extra tensor alive. `trainable_names` names the weights that training
can change, so an engine that kept the rest (vLLM's sleep level 1) is sent only those.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import torch

# Wrappers whose names the base model does not have: PEFT's LoRA layer, PEFT's trainable copy
# of a module (modules_to_save), activation checkpointing's wrapper.
_INFIXES = (".base_layer", ".modules_to_save.default", "._checkpoint_wrapped_module")
_PREFIXES = ("base_model.model.", "_checkpoint_wrapped_module.")


class WeightReceiver(Protocol):
    """What receives weights: vLLM's model (`model.load_weights`) or anything shaped like it."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Any: ...


def base_name(name: str) -> str | None:
    """The base model's name of a policy parameter; None for a tensor the base model does not
    have (LoRA's A/B matrices, PEFT's frozen original of a module it trains a copy of).

    >>> base_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")
    'model.layers.0.self_attn.q_proj.weight'
    """
    if ".lora_" in name or ".original_module." in name:
        return None
    for prefix in _PREFIXES:
        name = name.removeprefix(prefix)
    for infix in _INFIXES:
        name = name.replace(infix, "")
    return name


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter")


def trainable_names(model: torch.nn.Module) -> set[str]:
    """Base names of the weights that an optimiser step can change: every trainable parameter
    of a plain model; under LoRA, each weight an adapter with trainable parameters merges into
    (and any trainable base-model parameter, e.g. modules_to_save)."""
    names = set()
    for module_name, module in model.named_modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False)]
        for n, p in own:
            full = f"{module_name}.{n}" if module_name else n
            if p.requires_grad and base_name(full) is not None:
                names.add(base_name(full))
        lora = [p for n, p in module.named_parameters() if ".lora_" in f".{n}"]
        base = getattr(module, "base_layer", None)
        trained = lora and any(p.requires_grad for p in lora)
        if trained and getattr(base, "weight", None) is not None:
            names.add(base_name(f"{module_name}.base_layer.weight"))
    return names


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2 shard (a collective), else the tensor itself."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


def _vanilla_lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module] | None:
    """Name of each LoRA-adapted weight -> its LoRA layer, where every layer is plain LoRA
    (W + sum of get_delta_weight over the active adapters); None where some layer is not
    (DoRA and other variants, a LoRA bias, an adapter already merged)."""
    layers = {}
    for name, module in model.named_modules():
        if not hasattr(module, "lora_A") or not hasattr(module, "base_layer"):
            continue
        if getattr(module, "merged", False) or not hasattr(module, "get_delta_weight"):
            return None
        active = [a for a in module.active_adapters if a in module.lora_A]
        if any(
            a in getattr(module, "lora_variant", {}) or getattr(module, "lora_bias", {}).get(a)
            for a in active
        ):
            return None
        layers[f"{name}.base_layer.weight"] = module
    return layers


def _merged_weight(module: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """W + the active adapters' deltas, as PEFT's merge computes it, into a new tensor."""
    if getattr(module, "disable_adapters", False):
        return weight.clone()
    out = weight.clone()
    for adapter in module.active_adapters:
        if adapter in module.lora_A:
            out += module.get_delta_weight(adapter).to(out.dtype)
    return out


@contextlib.contextmanager
def _merged_in_place(model: torch.nn.Module):
    """PEFT's own merge for the block (LoRA variants); unmerged after, whatever happens."""
    model.merge_adapter()
    try:
        yield
    finally:
        model.unmerge_adapter()


def policy_weights(
    model: torch.nn.Module,
    *,
    only: set[str] | None = None,
    device: torch.device | str | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(base name, tensor) for each weight the policy computes with: merged under LoRA, whole
    under FSDP2, on `device` (default: where it is). `only`: just these base names. Tied
    weights come once (`named_parameters` dedupes them).

    Plain LoRA is merged out of place, W + delta into a new tensor, so the model's own
    weights are never written (an in-place merge then unmerge, W + d - d, is not W in
    floating point, and the error would add up over a run). LoRA variants use PEFT's in-place
    merge, each tensor cloned before the unmerge. Run the generator to the end or close it."""
    kind = "cuda" if device is not None and torch.device(device).type == "cuda" else "cpu"
    lora = _vanilla_lora_layers(model) if is_peft(model) else {}
    if is_peft(model) and any(type(p).__name__ == "DTensor" for p in model.parameters()):
        raise RuntimeError(
            "a LoRA model with sharded (FSDP2) parameters cannot be merged shard by shard; "
            "train LoRA with train.parallel=ddp"
        )
    in_place = _merged_in_place(model) if lora is None else contextlib.nullcontext()
    with torch.no_grad(), torch.autocast(kind, enabled=False), in_place:
        for name, param in model.named_parameters():
            target = base_name(name)
            if target is None or (only is not None and target not in only):
                continue
            tensor = _full(param.detach())
            if lora and name in lora:
                tensor = _merged_weight(lora[name], tensor)
            elif lora is None and ".base_layer." in name:
                tensor = tensor.clone()  # the in-place unmerge would change it under the loader
            yield target, tensor if device is None else tensor.to(device)


def push_weights(
    receiver: WeightReceiver,
    model: torch.nn.Module,
    *,
    only: set[str] | None = None,
    device: torch.device | str | None = None,
) -> list[str]:
    """Stream the policy's weights (`policy_weights`) into `receiver.load_weights`; returns the
    names sent. The adapter is unmerged before this returns, also when the receiver raises."""
    sent: list[str] = []
    stream = policy_weights(model, only=only, device=device)

    def counted():
        for name, tensor in stream:
            sent.append(name)
            yield name, tensor

    try:
        receiver.load_weights(counted())
    finally:
        stream.close()
    return sent
