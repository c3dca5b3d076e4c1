"""One rank of tests/test_weight_sync.py's FSDP2 check (run by torchrun, gloo, 2 ranks).

Shards a tiny model with FSDP2 and pushes its weights to a receiver that keeps what it gets,
outside any gather (each DTensor gathered with full_tensor()) and inside `gathered` (the
unsharded parameters); writes, per rank, whether every received tensor was a whole plain
tensor equal to the unsharded original."""

import json
import os
import sys

import torch
import torch.distributed as dist

from rlvr.models import build_tiny_model, build_tokenizer
from rlvr.rollout.weight_sync import push_weights
from rlvr.run.distributed import Dist, gathered, shutdown, wrap


class KeepingReceiver:
    def __init__(self):
        self.got = {}

    def load_weights(self, weights):
        for name, tensor in weights:
            self.got[name] = tensor


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    model = build_tiny_model(
        build_tokenizer(),
        seed=0,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    wrap(model, Dist(rank=rank, world_size=2), torch.device("cpu"), "fsdp2")
    result = {"sharded": sum(type(p).__name__ == "DTensor" for p in model.parameters())}
    for where in ("outside", "inside"):
        receiver = KeepingReceiver()
        with gathered(model) if where == "inside" else torch.no_grad():
            push_weights(receiver, model)
            result[where] = set(receiver.got) == set(full) and all(
                type(t) is torch.Tensor and torch.equal(t, full[n]) for n, t in receiver.got.items()
            )
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)
    shutdown(Dist(rank=rank, world_size=2), destroy=False)


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as `rlvr train` ends a rank: gloo's destructor at exit can hang it for good
