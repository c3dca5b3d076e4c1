"""One rank of tests/test_token_scores.py's 2-rank check (torchrun, gloo).

Wraps the 50,000-token Qwen2 (tied embeddings) with DDP or FSDP2, scores this rank's half of
the rows in 7-token chunks after a gathered no-grad pass (which leaves FSDP2's root to reshard
after each forward), backpropagates the weighted log-probs and saves the whole gradients."""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from rlvr.run.distributed import Dist, gathered, shutdown, wrap
from rlvr.training.batch import collate, token_log_probs
from test_token_scores import TEMPERATURE, _qwen2, _samples, _weights


def main(kind: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    model = _qwen2(tied=True)
    module = wrap(model, Dist(rank=rank, world_size=2), torch.device("cpu"), kind)
    samples = _samples()
    mine = samples[rank::2]
    mb = collate(mine, 0, "cpu")
    with torch.no_grad(), gathered(model):
        token_log_probs(module, mb, temperature=TEMPERATURE, chunk=7)
    lp, _ = token_log_probs(module, mb, temperature=TEMPERATURE, chunk=7)
    w = _weights(collate(samples, 0, "cpu").response_mask.bool())[rank::2, : lp.shape[1]]
    (lp * w).sum().mul(2).backward()  # DDP and FSDP2 average over the 2 ranks
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        grads[name.replace("_fsdp_wrapped_module.", "")] = g.detach().clone()
    if rank == 0:
        torch.save(grads, f"{out}/grads.pt")
    shutdown(Dist(rank=rank, world_size=2), destroy=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as `rlvr train` ends a rank: gloo's destructor at exit can hang it for good
