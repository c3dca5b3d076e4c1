"""Server mode under torchrun: N trainer ranks against the same M vLLM servers.

Every rank holds a `Fleet` of the servers and generates its own share of the step's prompts
on them (`rlvr.training.collect` shards the prompts; each prompt's seeds are its own, so the
rows do not depend on which rank or server samples them). Rank 0 alone launches the servers
(`rollout.vllm.launch`; the others get their URLs) and pushes the weights; every other rank
waits at the push for its outcome, so no rank samples before the servers hold the new
weights.

The push runs inside `gathered(model)`: under FSDP2 every rank unshards the whole policy
first (the collectives, all ranks together), then rank 0 reads whole tensors from its own
memory and sends them, with no collective between two sends (a `full_tensor()` gather
interleaved with one rank's send can deadlock, the ranks waiting on different peers).
Rank 0's outcome (the live servers, or the error that ends the run) is then broadcast, and
every rank leaves out the servers rank 0 lost, so all ranks sample on the same servers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rlvr.rollout.vllm_fleet import VLLMServerError
from rlvr.run.distributed import Dist

T = TypeVar("T")


def on_main(d: Dist, fn: Callable[[], T], doing: str) -> T:
    """`fn()` on rank 0 and its result on every rank; a failure there (one line) raised on
    every rank, so no rank waits on a collective that rank 0 never reaches."""
    if not d.enabled:
        return fn()
    value, error = None, None
    if d.is_main:
        try:
            value = fn()
        except Exception as e:
            error = str(e)
            d.broadcast((None, error))
            raise
    value, error = d.broadcast((value, error))
    if error is not None:
        raise VLLMServerError(f"{error} (rank 0, {doing})")
    return value


def follow(fleet, live: list[str]) -> None:
    """Leave out of `fleet` the servers not in rank 0's `live` list."""
    for server in fleet.servers:
        if server.alive and server.url not in live:
            server.alive = False
