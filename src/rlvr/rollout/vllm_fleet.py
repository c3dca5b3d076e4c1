"""The trainer's side of a fleet of `vllm serve` processes: HTTP calls with bounded waits.

One event loop in a daemon thread holds every connection (`httpx.AsyncClient`) and a
heartbeat: every `POLL_S` seconds each live server's `/health` is asked (an answer counts when
it comes, however late: a busy server is alive). A caller waits on its calls from its own thread and, while it waits, looks at the
heartbeats of the servers it waits on: a server unanswered for `timeout` seconds
(`rollout.vllm.timeout`; a stopped, hung or unreachable one) is dead, its calls are
cancelled (their connections closed), and the caller learns it as `ServerDown`, naming the
URL and what the call was doing. A long generation on a server that answers its heartbeat is
never cut short. A request whose connection fails is sent again while the server keeps its
heartbeat.

`generate` sends groups: each group's requests go to one server together (its prefix cache
holds the group's prompt), to the live server with the fewest rows in flight; when a server
dies its unfinished groups go to the others (a warning and `failovers`), and with none left
the run ends with the server's `VLLMServerError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rlvr.rollout.base import EngineError

POLL_S = 2.0  # seconds between a server's heartbeats
RETRY_S = 0.5  # seconds before a failed connection is tried again
KEEPALIVE_S = 3.0  # seconds an idle connection is kept (vLLM's uvicorn closes them at 5)


class VLLMServerError(EngineError):
    """A vLLM server in `rollout.vllm.urls` (or launched) failed, stopped answering or
    answered what the run refuses; one line naming its URL and what it was doing. Raised
    while the engine is built, `build_engine` reports it as the config error it is (exit
    2); during the run, it ends the run (exit 1, `rlvr.cli.main.ERRORS`)."""


class ServerDown(VLLMServerError):
    """A server that stopped answering (no heartbeat for `timeout` seconds, or nothing
    listening): the caller may send its work to another."""


@dataclass(eq=False)  # compared and hashed as the one server it is
class Server:
    url: str
    alive: bool = True
    last_seen: float = field(default_factory=time.monotonic)
    rows: int = 0  # requests in flight


class Fleet:
    """`urls`' servers behind one loop thread (the module doc). `timeout`: seconds without a
    heartbeat before a server is dead."""

    def __init__(self, urls: list[str], timeout: float, model: str | None = None):
        import httpx  # vLLM's own dependency: server mode runs where vLLM is installed

        self.servers = [Server(u.rstrip("/")) for u in urls]
        self.timeout, self.model = timeout, model
        self.failovers = 0
        self.retries = 0  # requests sent again after their connection failed
        self._last_down = VLLMServerError("rollout.vllm: no vLLM server left")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="rlvr-vllm-fleet", daemon=True
        )
        self.thread.start()
        # idle connections dropped before uvicorn's keep-alive timeout (5 s) closes them under
        # a request (a step's update is longer; reused, they failed mid-request)
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=256, keepalive_expiry=KEEPALIVE_S
        )
        self.http = httpx.AsyncClient(timeout=None, limits=limits, trust_env=False)
        self._beats = [
            asyncio.run_coroutine_threadsafe(self._heartbeat(s), self.loop) for s in self.servers
        ]

    @property
    def live(self) -> list[Server]:
        return [s for s in self.servers if s.alive]

    # -- the loop's side --------------------------------------------------------------

    async def _heartbeat(self, server: Server) -> None:
        """Ask `server`'s /health every `POLL_S` seconds; an answer, however late, counts
        when it comes (a busy server is alive), so a server is dead only when it stays
        silent for `timeout` seconds."""
        while server.alive:
            with contextlib.suppress(Exception):
                r = await self.http.get(f"{server.url}/health", timeout=self.timeout)
                if r.status_code == 200:
                    server.last_seen = time.monotonic()
            await asyncio.sleep(POLL_S)

    async def _call(self, server: Server, method: str, path: str, body=None) -> Any:
        """One request; a connection that fails (refused, reset, closed mid-answer) is tried
        again every `RETRY_S` while the server keeps its heartbeat, and is `_Unreachable`
        once it has not for `timeout` (a seeded completion, a weight chunk: repeating one
        gives the same result)."""
        import httpx

        while True:
            try:
                r = await self.http.request(method, f"{server.url}{path}", json=body)
                break
            except httpx.TransportError as e:
                if time.monotonic() - server.last_seen > self.timeout:
                    raise _Unreachable(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None  # fmt: skip
                self.retries += 1
                await asyncio.sleep(RETRY_S)
        if r.status_code != 200:
            raise _Refused(r.status_code, r.text[:400])
        return r.json() if r.content else None

    # -- the caller's side ------------------------------------------------------------

    def call(self, server: Server, doing: str, method: str, path: str, body=None) -> Any:
        """One HTTP call to `server`, waited on while it keeps its heartbeat."""
        future = asyncio.run_coroutine_threadsafe(self._call(server, method, path, body), self.loop)
        return self._wait({future: server}, doing)[future]

    def _wait(self, futures: dict, doing: str, *, down: list | None = None) -> dict:
        """The results of `futures` (future -> its server). A server found dead raises
        `ServerDown` or, with `down` given, is appended there (its futures cancelled) while
        the others are still waited on."""
        results: dict = {}
        pending = dict(futures)
        while pending:
            done, _ = concurrent.futures.wait(
                pending, timeout=0.5, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for f in done:
                server = pending.pop(f)
                try:
                    results[f] = f.result()
                except _Unreachable as e:
                    self._dead(server, pending, doing, down, f"unreachable: {e}")
                except _Refused as e:
                    self._cancel(pending)
                    raise VLLMServerError(
                        f"rollout.vllm: the vLLM server at {server.url} answered HTTP "
                        f"{e.status} while {doing}: {e.text}"
                    ) from None
            now = time.monotonic()
            for server in {s for s in pending.values() if now - s.last_seen > self.timeout}:
                self._dead(server, pending, doing, down, "no heartbeat")
        return results

    def _dead(self, server: Server, pending: dict, doing: str, down, how: str) -> None:
        server.alive = False
        mine = [f for f, s in pending.items() if s is server]
        for f in mine:
            f.cancel()
            pending.pop(f)
        error = ServerDown(
            f"rollout.vllm: the vLLM server at {server.url} stopped answering while {doing} "
            f"({how} for {self.timeout:g} s; rollout.vllm.timeout)"
            if how == "no heartbeat"
            else f"rollout.vllm: the vLLM server at {server.url} is {how}, while {doing}"
        )
        if down is None:
            self._cancel(pending)
            raise error
        down.append(error)

    @staticmethod
    def _cancel(pending: dict) -> None:
        for f in pending:
            f.cancel()

    def each_live(self, doing: str, method: str, path: str, body=None) -> list[Any]:
        """The same call on every live server, together; any one failing ends it."""
        futures = {
            asyncio.run_coroutine_threadsafe(self._call(s, method, path, body), self.loop): s
            for s in self.live
        }
        results = self._wait(futures, doing)
        return [results[f] for f in futures]

    def generate(
        self, groups: list[list[dict]], doing: str, path: str = "/v1/completions"
    ) -> list[list[dict]]:
        """Each group's request bodies to `path` answered, a group's on one server (module
        doc); the answers in the groups' order."""
        out: list[list[dict] | None] = [None] * len(groups)
        todo = list(range(len(groups)))
        while todo:
            if not self.live:
                raise self._last_down
            futures = {}
            for g in todo:
                server = min(self.live, key=lambda s: s.rows)
                server.rows += len(groups[g])
                f = asyncio.run_coroutine_threadsafe(
                    self._group(server, groups[g], path), self.loop
                )
                futures[f] = (g, server)
            down: list[ServerDown] = []
            try:
                results = self._wait({f: s for f, (_, s) in futures.items()}, doing, down=down)
            finally:  # (rows sent without waiting, `vllm_inflight.submit`, stay counted)
                for g, server in futures.values():
                    server.rows -= len(groups[g])
            for f, answers in results.items():
                out[futures[f][0]] = answers
            todo = [g for f, (g, _) in futures.items() if f not in results]
            for error in down:
                self.lost(error)
        return out  # type: ignore[return-value]

    def lost(self, error: ServerDown) -> None:
        """A dead server's work goes to the others: a warning and `failovers`; with none
        left, its error ends the run."""
        self._last_down = error
        if not self.live:
            raise error
        self.failovers += 1
        print(f"warning: {error}; its work goes to the other servers ({len(self.live)} left)",
              file=sys.stderr)  # fmt: skip

    async def _group(self, server: Server, bodies: list[dict], path: str) -> list[dict]:
        return list(await asyncio.gather(*(self._call(server, "POST", path, b) for b in bodies)))

    def close(self) -> None:
        """Stop the heartbeat, close the connections, end the loop thread (idempotent)."""
        if not self.loop.is_running():
            return
        for beat in self._beats:
            beat.cancel()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.http.aclose(), self.loop).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class _Unreachable(Exception):
    pass


class _Refused(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(status, text)
        self.status, self.text = status, text


class WeightClient:
    """vLLM's `VLLMWeightSyncClient` over one server's routes, every call waited on as
    `Fleet.call` waits (bounded by the heartbeat, not a deadline)."""

    def __init__(self, fleet: Fleet, server: Server, version: str = ""):
        self.fleet, self.server, self.version = fleet, server, version

    def _post(self, path: str, body: dict | None = None, doing: str = "") -> None:
        doing = doing or f"receiving weights (version {self.version}, {path})"
        self.fleet.call(self.server, doing, "POST", path, body)

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        body = {"init_info": init_info}
        self._post("/init_weight_transfer_engine", body, "setting up its weight transfer")

    def start_weight_update(self) -> None:
        self._post("/start_weight_update")

    def update_weights(self, update_info) -> None:
        self._post("/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._post("/finish_weight_update", {"weight_version": weight_version or self.version})
