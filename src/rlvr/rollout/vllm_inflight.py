"""In-flight weight updates on the vLLM servers (`train.inflight_updates`, docs/async.md).

After each optimiser step every live server is paused in vLLM's `keep` mode (`PAUSE`: the
engine core finishes the step it is computing, then schedules nothing; running requests keep
their place and the tokens they have), receives the weights, has its weight version set to the
number of pushes, and resumes (`/resume`): the requests in flight carry on with the new
weights.

Per-token versions. Generation goes through vLLM's token-in token-out route
`/inference/v1/generate` (servers started with `--enable-scale-out`, as `vllm_launch` does),
whose answer carries, beside the sampled ids and their log-probs, `weight_versions`: spans
`[start, end)` of output tokens with the weight version that sampled them. The engine core
stamps every step's outputs with its version when the step ends, and the version changes only
while the scheduler is paused (set by `/finish_weight_update` between `/pause` and `/resume`),
so no step straddles two versions: a token's version is the version of the weights that
computed its logits, exactly, read from the server rather than timed by the trainer. The
log-prob beside it is that step's.

The KV cache. vLLM 0.32's `/pause` clears the caches unless told `clear_cache=false`, also in
keep mode (`EngineCoreProc._finish_pause`; the route's docstring says it is ignored there): the
running requests are preempted and, on resume, their prompt and tokens so far are prefilled
again, by the new weights, and the prefix cache is emptied. rlvr pauses with `clear_cache=true`
said explicitly: a token's logits are then computed by one version's weights over its whole
context, so its log-prob is that version's pi(o_t | o_<t), the trainer's forward of that
version reproduces it, and no later request reuses a prompt's KV from older weights. The price
is one prefill of every response in flight per push. With `clear_cache=false` the KV of the
tokens before the pause stays as the older weights computed it: a token after the push reads a
prefix that older weights encoded, and its log-prob is no single version's
(tests/test_vllm_inflight.py measures both).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time

GENERATE = "/inference/v1/generate"
PAUSE = "/pause?mode=keep&clear_cache=true"  # the module doc: prefixes recomputed by new weights


def generate_body(body: dict) -> dict:
    """The `/inference/v1/generate` request of a `/v1/completions` body
    (`VLLMServerEngine._body`): the same prompt ids, seed and sampling parameters."""
    params = {k: body[k] for k in ("max_tokens", "temperature", "top_p", "seed", "logprobs",
                                   "stop_token_ids", "min_tokens", "skip_special_tokens")}  # fmt: skip
    for key in ("top_k", "ignore_eos"):
        if key in body:
            params[key] = body[key]
    params["detokenize"] = False
    return {"model": body["model"], "token_ids": list(body["prompt"]),
            "sampling_params": params, "output_mode": "tokens"}  # fmt: skip


def token_versions(spans: list[dict] | None, n: int, url: str = "") -> list[int]:
    """Each of `n` output tokens' weight version from the answer's `weight_versions` spans;
    ValueError naming the server when the spans do not cover the tokens exactly once."""
    versions: list[int] = []
    for span in spans or []:
        if span["start"] != len(versions):
            break
        versions += [int(span["version"])] * (span["end"] - span["start"])
    if len(versions) != n:
        raise ValueError(
            f"rollout.vllm: {url or 'a server'} reported weight-version spans {spans} for "
            f"{n} tokens (a vLLM without per-token weight versions, or not started with "
            "--enable-scale-out?)"
        )
    return versions


def generated(answer: dict, url: str = "") -> tuple[list[int], list[float], list[int]]:
    """The sampled ids, their log-probs and their weight versions of a one-choice answer of
    `/inference/v1/generate`."""
    choice = answer["choices"][0]
    ids = list(choice.get("token_ids") or [])
    content = (choice.get("logprobs") or {}).get("content") or []
    log_probs = [float(c["logprob"]) for c in content] if content else [0.0] * len(ids)
    return ids, log_probs, token_versions(choice.get("weight_versions"), len(ids), url)


@contextlib.contextmanager
def paused(fleet, doing: str):
    """Every live server paused in keep mode for the body of the `with`, resumed after it,
    also when it fails (a server left paused would hold its requests forever)."""
    fleet.each_live(f"pausing (keep) before {doing}", "POST", PAUSE)
    try:
        yield
    finally:
        fleet.each_live(f"resuming after {doing}", "POST", "/resume")


def submit(fleet, bodies: list[dict]) -> tuple[concurrent.futures.Future, object]:
    """One group's requests sent together to the live server with the fewest rows in
    flight, without waiting: the future of their answers, and the server."""
    if not fleet.live:
        raise fleet._last_down
    server = min(fleet.live, key=lambda s: s.rows)
    server.rows += len(bodies)
    future = asyncio.run_coroutine_threadsafe(fleet._group(server, bodies, GENERATE), fleet.loop)

    n = len(bodies)

    def done(_) -> None:
        server.rows -= n

    future.add_done_callback(done)
    return future, server


def first_done(fleet, flights: dict, doing: str) -> set:
    """The futures of `flights` (future -> server) done, waiting until at least one is,
    bounded by the servers' heartbeats: a server silent for `rollout.vllm.timeout` seconds
    ends the run with `ServerDown` naming it (its groups are not sent elsewhere)."""
    while True:
        done, _ = concurrent.futures.wait(
            flights, timeout=0.5, return_when=concurrent.futures.FIRST_COMPLETED
        )
        if done:
            return done
        now = time.monotonic()
        for server in {s for s in flights.values() if now - s.last_seen > fleet.timeout}:
            fleet._wait({f: s for f, s in flights.items() if s is server}, doing)


def answers(fleet, future, server, doing: str) -> list[dict]:
    """A done future's answers; a server's refusal or loss as the fleet names it."""
    return fleet._wait({future: server}, doing)[future]
