"""The endpoint's requests generated in batches on the run's engine.

Agent calls run concurrently and each waits on its own request; one thread takes the waiting
requests and calls `engine.generate` once for all of them (one call per completion budget),
each request with its own seed, so a request's tokens do not depend on which others share its
batch. It starts a batch as soon as every running agent call has a request waiting (the
endpoint knows how many run: `active`), or once no request has come for `GAP_S` (the calls
still running are busy elsewhere, in their environments), and at the latest `MAX_WAIT_S` after
the batch's first request, so a slow agent does not hold the others back for long. Requests
still arriving one by one (hundreds of agent calls starting together) join the batch instead
of leaving in fragments.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, replace

from rlvr.rollout import RolloutEngine, SamplingParams

GAP_S = 0.05  # a batch starts once no request came for this long
MAX_WAIT_S = 1.0  # the longest the batch's first request waits for others


@dataclass
class Request:
    """One prompt to sample: its ids, its completion budget and seed; `done` gets
    (completion ids, log-probs or None, truncated)."""

    prompt_ids: list[int]
    max_tokens: int
    seed: int
    done: Future


class Batcher:
    """The one thread that calls the engine for the endpoint's requests."""

    def __init__(self, engine: RolloutEngine, params: SamplingParams):
        self.engine, self.params = engine, params
        self.active = 0  # agent calls running (the runner sets it)
        self._pending: list[Request] = []
        self._cond = threading.Condition()
        self._stop = False
        self._last = 0.0  # when the last request came (time.monotonic)
        self.calls = self.requests = 0  # engine calls and the requests they answered
        self._thread = threading.Thread(target=self._loop, name="rlvr-endpoint-gen", daemon=True)
        self._thread.start()

    def set_params(self, params: SamplingParams) -> None:
        """The run's sampling for the next requests (temperature, top-p, top-k)."""
        with self._cond:
            self.params = params

    def set_active(self, n: int) -> None:
        with self._cond:
            self.active = n
            self._cond.notify()

    def finished_one(self) -> None:
        """An agent call ended: one fewer request to wait for."""
        with self._cond:
            self.active = max(self.active - 1, 0)
            self._cond.notify()

    def submit(self, prompt_ids: list[int], max_tokens: int, seed: int) -> Future:
        request = Request(prompt_ids, max_tokens, seed, Future())
        with self._cond:
            if self._stop:
                raise RuntimeError("the endpoint is stopped")
            self._pending.append(request)
            self._last = time.monotonic()
            self._cond.notify()
        return request.done

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=60)

    def _take(self) -> list[Request] | None:
        with self._cond:
            while not self._pending and not self._stop:
                self._cond.wait()
            if self._stop:
                for r in self._pending:
                    r.done.set_exception(RuntimeError("the endpoint is stopped"))
                return None
            latest = time.monotonic() + MAX_WAIT_S
            while len(self._pending) < self.active and not self._stop:
                left = min(self._last + GAP_S, latest) - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, self._pending = self._pending, []
            return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            by_budget: dict[int, list[Request]] = defaultdict(list)
            for r in batch:
                by_budget[r.max_tokens].append(r)
            for budget, requests in by_budget.items():
                self._generate(budget, requests)

    def _generate(self, budget: int, requests: list[Request]) -> None:
        params = replace(
            self.params, n=1, max_new_tokens=budget, row_seeds=tuple(r.seed for r in requests)
        )
        try:
            rollout = self.engine.generate([r.prompt_ids for r in requests], params)
        except Exception as e:  # the run's own failure: every waiting request gets it
            for r in requests:
                r.done.set_exception(e)
            return
        self.calls, self.requests = self.calls + 1, self.requests + len(requests)
        lps = rollout.sampling_log_probs
        for i, r in enumerate(requests):
            n = int(rollout.lengths[i])
            ids = rollout.completion_ids[i, :n].tolist()
            lp = None if lps is None else lps[i, :n].tolist()
            r.done.set_result((ids, lp, bool(rollout.truncated[i])))
