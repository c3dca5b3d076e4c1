"""Data parallelism over torch.distributed, started by `torchrun` (gloo on CPU, nccl on GPU).

Each rank generates and scores a contiguous share of the step's prompts (whole groups, so a
group's G rewards are never split), the kept set of dynamic sampling is decided from every
rank's results identically everywhere, and the loss normalisers are global counts. Gradients
are synchronised by DDP; since each micro-batch loss is already normalised by the global
counts, DDP's averaging is undone by scaling the loss by the world size. A single process is
the same code with world_size 1 and every collective a no-op.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def shard(self, n: int) -> tuple[int, int]:
        """This rank's contiguous [lo, hi) share of n items; equal shares when n is divisible
        by world_size, else the shares differ by at most one (a small refill batch)."""
        return self.rank * n // self.world_size, (self.rank + 1) * n // self.world_size

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (float64 on the CPU side of the reduction)."""
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
        dist.all_reduce(t)
        return t.tolist()

    def max(self, value: float) -> float:
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def gather(self, obj):
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def lost_rank(e: BaseException) -> str | None:
    """The one line for a collective that failed because another rank is gone (its process
    killed, its node lost: gloo's connection to it closed or reset, or torch's `DistError`);
    None for any other error. Each rank ends with it; the last checkpoint is whole (rank 0
    writes it between collectives), so `--resume` continues."""
    text = str(e)
    if not (isinstance(e, dist.DistError) or (isinstance(e, RuntimeError) and "gloo/" in text)):
        return None
    reason = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0]  # gloo's [file:line] off
    return (
        f"torch.distributed: rank {os.environ.get('RANK', '?')} lost contact with another rank "
        f"({reason}); --resume continues from the last checkpoint"
    )


def _comm_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_distributed(device: torch.device) -> tuple[Dist, torch.device]:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK), if any.
    On GPU each rank takes cuda:LOCAL_RANK."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(), device
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Dist(rank=rank, world_size=world, local_rank=local), device


def shutdown(d: Dist, destroy: bool = True) -> None:
    """Wait for every rank, then leave the process group (gloo's threads abort the process
    at interpreter exit otherwise). `destroy=False` for a process about to `os._exit`
    (`rlvr train` under torchrun): gloo's destructor joins its worker thread while holding
    the GIL, and that thread can be waiting for the GIL: seen to hang a rank for good."""
    if d.enabled and dist.is_initialized():
        dist.barrier()
        if destroy:
            dist.destroy_process_group()


def wrap(model: torch.nn.Module, d: Dist, device: torch.device, kind: str) -> torch.nn.Module:
    """The module the training forward/backward runs through. DDP: a wrapper around the
    model. FSDP2: every decoder layer and the root are sharded in place (`fully_shard`)."""
    if not d.enabled:
        return model
    if kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (d.world_size,))
        for module in model.modules():
            if type(module).__name__.endswith("DecoderLayer"):
                fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=ids, broadcast_buffers=False)


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def gathered(model: torch.nn.Module):
    """FSDP2: whole parameters on every rank for the block (generation, no-grad log-probs,
    evaluation), so ranks may run different numbers of forwards without collectives."""
    if not is_sharded(model):
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in mods:
        m.unshard()
    model.set_reshard_after_forward(False)
    try:
        yield
    finally:
        model.set_reshard_after_forward(True)
        for m in mods:
            m.reshard()


def full_state(model: torch.nn.Module, optimizer) -> tuple[dict | None, dict]:
    """Whole model weights (None when not sharded: save the live model) and the optimiser
    state keyed by parameter name, which any world size and wrapping can load back."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=opts) if is_sharded(model) else None
    return weights, get_optimizer_state_dict(model, optimizer, options=opts)


def load_optimizer_state(model: torch.nn.Module, optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(
        model, optimizer, optim_state_dict=state, options=StateDictOptions(full_state_dict=True)
    )
