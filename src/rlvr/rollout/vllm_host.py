"""What the vllm engine needs from the trainer's process around vLLM (rlvr.rollout.vllm):
the launch environment, fences for what vLLM's worker changes process-wide (RNGs, the CUDA
device, threads, affinity), the CPU KV cache's size, the wake/sleep cycle, and the in-place
reload that receives the policy's weights."""

from __future__ import annotations

import contextlib
import os
import random
import socket

import numpy as np
import torch


@contextlib.contextmanager
def preserved_rng(device: torch.device | None = None):
    """The python, numpy and torch (CPU, and CUDA when on it) global RNG states and the
    current CUDA device as they were before the block: vLLM's worker reseeds all of them."""
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    on_cuda = device is not None and device.type == "cuda"
    cuda = torch.cuda.get_rng_state_all() if on_cuda else None
    current = torch.cuda.current_device() if on_cuda else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if on_cuda:
            torch.cuda.set_rng_state_all(cuda)
            torch.cuda.set_device(current)


def launch_env(device: torch.device, rank: int, local_rank: int, world_size: int) -> dict:
    """The environment vLLM's external launcher reads (torchrun's names). Under torchrun they
    are set already; a single process gets rank 0 of 1 on its own device and a free port."""
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank if world_size > 1 else (device.index or 0)),
        "WORLD_SIZE": str(world_size),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in this process
    }
    if "MASTER_ADDR" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    return env


def no_autocast(device: torch.device):
    return torch.autocast(device.type, enabled=False)


@contextlib.contextmanager
def preserved_threads():
    """The intra-op thread count, `torch.set_num_threads` itself and this process's CPU
    affinity as they were before the block: vLLM's CPU worker replaces
    `torch.set_num_threads` with a no-op for the whole process."""
    count, setter = torch.get_num_threads(), torch.set_num_threads
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        yield
    finally:
        torch.set_num_threads = setter
        setter(count)
        if affinity is not None and os.sched_getaffinity(0) != affinity:
            os.sched_setaffinity(0, affinity)


def kv_cache_bytes(config, rows: int, max_model_len: int, dtype: str, block: int = 128) -> int:
    """The KV cache of `rows` sequences of up to `max_model_len` positions, in whole blocks
    of `block` positions (vLLM's CPU block size): 2 (K and V) x layers x KV heads x head
    width x the dtype's bytes a position."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    width = {"float32": 4}.get(dtype, 2)
    per_position = 2 * config.num_hidden_layers * kv_heads * head_dim * width
    return max(rows, 1) * -(-max_model_len // block) * block * per_position


class Residency:
    """What of vLLM is resident, kept to one wake/sleep cycle a step.

    `llm`: vLLM's `LLM` (sleep(level), wake_up(tags)); `push(only)`: send the policy's weights
    (only those names; None: all). Sleep level 1 keeps the weights in host memory, so after
    the optimiser step only `changing` is pushed (None: all); level 2 drops them, so waking
    the weights pushes them all. Level 0: a platform without sleep mode (vLLM's CPU
    backend): the engine stays resident and every sync pushes `changing`."""

    def __init__(self, llm, push, level: int, changing: set[str] | None):
        self.llm, self.push, self.level, self.changing = llm, push, level, changing
        self.asleep: set[str] = set()  # "weights", "kv_cache"

    def wake(self, tags: list[str]) -> None:
        tags = [t for t in tags if t in self.asleep]
        if not tags:
            return
        torch.cuda.empty_cache()  # hand vLLM the blocks torch's allocator holds
        self.llm.wake_up(tags=tags)
        self.asleep.difference_update(tags)
        if "weights" in tags and self.level == 2:
            self.push(None)  # level 2 dropped them

    def sleep(self) -> None:
        if self.level and not self.asleep:
            self.llm.sleep(level=self.level)
            self.asleep = {"weights", "kv_cache"}

    def weights_changed(self) -> None:
        if "weights" in self.asleep:
            self.wake(["weights"])
            if self.level == 2:
                return  # all pushed on waking
        self.push(self.changing)


class Reload:
    """vLLM's in-place reload as a `WeightReceiver`: `worker.reload_weights` takes the
    weights in the checkpoint's (Hugging Face) names and format and redoes the backend's
    processing of each layer (the CPU backend repacks linear weights after loading, so
    writing into the module's parameters would not reach the kernels). A layer whose fused
    weight (q/k/v, gate/up) gets only some of its parts is processed with the rest unset,
    so every sync sends every weight."""

    def __init__(self, worker):
        self.worker = worker

    def load_weights(self, weights) -> None:
        self.worker.reload_weights(weights_iterator=weights)
        _reprocess_tied(self.worker.get_model())


def _reprocess_tied(model: torch.nn.Module) -> None:
    """Redo the weight processing of every layer whose weight is tied to another's (an LM
    head tied to the embedding). The in-place reload loads a tied weight once, through its
    first owner, and processes only that layer; vLLM's CPU backend keeps a packed copy of the
    LM head's weight for its GEMM, which would otherwise keep the old values."""
    owners: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is not None and weight.numel():
            owners.setdefault(id(weight), []).append(module)
    for modules in owners.values():
        if len(modules) < 2:
            continue
        for module in modules:
            method = getattr(module, "quant_method", None)
            if method is not None:
                method.process_weights_after_loading(module)
