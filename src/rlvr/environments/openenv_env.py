"""OpenEnv environments (the `openenv` package) as rlvr trains them: `--env openenv:TARGET`,
`rlvr.train(environment=...)` (docs/environments.md, "OpenEnv environments").

TARGET is the URL of a running OpenEnv server (http://127.0.0.1:8001, ws://..., a Space's
https URL), or "module:attr" / "path/to/file.py:attr" naming the server's app (what
openenv's `create_app` returns, the `app` of an environment's server/app.py: rlvr serves it
on a free 127.0.0.1 port for the run's length), an `OpenEnv` (the options below), an OpenEnv
client (its URL is used), or a function of no arguments returning one of these.

An episode is a rollout: the agent opens a WebSocket session of its own (each session is an
environment instance of its own on the server, so the rollouts of a batch share no state),
resets it with the row's columns as keyword arguments (TRL's convention: the server passes on
those its `reset` takes; a row is `{"seed": k}` by default), and then, until the episode is
done or `max_turns` model turns: the observation becomes a user message, the model's reply
(through the run's endpoint, so the trained ids are the sampled ids) becomes the action, and
the environment steps. The reward is the episode's return: the sum of the rewards the reset
and the steps returned (None counts 0).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from openenv.core import EnvClient, GenericEnvClient
from openenv.core.client_types import StepResult
from websockets.exceptions import ConnectionClosed

from rlvr.config.schema import ConfigError
from rlvr.environments.adapter import Adapted

EPISODES = 1024  # default train rows (seeds 0..n-1), at least max_steps x prompts_per_step
ROW_KEYS = ("prompt", "messages", "answer", "example")  # rlvr's own row fields, not reset's
CAPACITY = "CAPACITY_REACHED"  # the server's error code when its sessions are all taken


@dataclass
class OpenEnv:
    """An OpenEnv environment with the options of its episodes.

    server: the server's URL, or its app (openenv's `create_app`), served on loopback.
    episodes: the train rows: a count n (rows {"seed": 0} .. {"seed": n-1}; None: EPISODES
        or max_steps x prompts_per_step, the larger), or a list of dicts of reset arguments.
    max_turns: model turns per episode at most; an episode not done by then ends there with
        the rewards it has.
    system_prompt: a system message put before the first observation.
    action: fn(text, action_schema) -> the action dict sent to step; None: the one string
        field of the action (e.g. {"message": text}), or the text as a JSON object.
    observation: fn(observation dict) -> the text of the user message; None: its one string
        field, else the observation as JSON.
    """

    server: Any
    episodes: int | list[dict[str, Any]] | None = None
    max_turns: int = 16
    system_prompt: str | None = None
    action: Callable[[str, dict], dict] | None = None
    observation: Callable[[dict], str] | None = None


def _is_app(obj) -> bool:
    """An ASGI app with OpenEnv's routes (/ws and /schema)."""
    paths = {getattr(r, "path", None) for r in getattr(obj, "routes", ())}
    return callable(obj) and {"/ws", "/schema"} <= paths


def _client_url(obj) -> str | None:
    """The base URL an OpenEnv client (async, or its .sync() wrapper) talks to."""
    client = getattr(obj, "_async", obj)
    if isinstance(client, EnvClient):
        ws = getattr(client, "_ws_url", None) or ""  # None once openenv 0.10's is closed
        return ws[: -len("/ws")] if ws.endswith("/ws") else ws or None
    return None


def accepts(obj) -> bool:
    """Is `obj` an OpenEnv environment rlvr can train on: an `OpenEnv`, a client, an app."""
    return isinstance(obj, OpenEnv) or _client_url(obj) is not None or _is_app(obj)


def http_url(url: str) -> str:
    """The server's base URL over HTTP (its /health and /schema)."""
    for ws, http in (("ws://", "http://"), ("wss://", "https://")):
        if url.startswith(ws):
            url = http + url[len(ws) :]
    return url.rstrip("/")


class LoopbackServer:
    """An OpenEnv app served by uvicorn in a thread of this process, on a free 127.0.0.1 port."""

    def __init__(self, app, deadline_s: float):
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        end = time.monotonic() + deadline_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > end:
                self.close()
                raise ConfigError(f"env.environment: the OpenEnv app did not start at {self.url}")
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def _get_json(url: str, path: str, deadline_s: float) -> dict:
    """GET url+path as JSON, retried until it answers or `deadline_s` passes."""
    end, last = time.monotonic() + deadline_s, None
    while True:
        try:
            with urllib.request.urlopen(url + path, timeout=max(0.1, end - time.monotonic())) as r:
                return json.loads(r.read())
        except (OSError, ValueError) as e:  # URLError, refused, timeout, bad JSON
            last = e
        if time.monotonic() >= end:
            raise ConfigError(
                f"env.environment: OpenEnv server {url}: GET {path} failed within "
                f"{deadline_s:g} s: {getattr(last, 'reason', last)}"
            )
        time.sleep(0.2)


def load(target: str):
    """The object "module:attr" or "path/to/file.py:attr" names, callable or not."""
    from rlvr.config.callables import load_object

    try:
        return load_object(target, "env.environment: openenv")
    except ValueError as e:
        raise ConfigError(str(e)) from None


def resolve(target, cfg) -> tuple[OpenEnv, Callable[[], None]]:
    """`target` (a URL, "module:attr", or an object `accepts` takes) as an `OpenEnv` whose
    server is a URL, and the function that stops what was started for it."""
    spec = target
    if isinstance(target, str) and "://" not in target:
        from rlvr.config.callables import extend_sys_path

        extend_sys_path(cfg.reward.python_path)  # where user code is imported from
        spec = load(target)
        if callable(spec) and not accepts(spec):  # a function returning the environment
            try:
                spec = spec()
            except Exception as e:
                raise ConfigError(
                    f"env.environment: openenv {target!r}: calling it failed: "
                    f"{type(e).__name__}: {e}"
                ) from None
    if not isinstance(spec, OpenEnv):
        spec = OpenEnv(server=spec)
    server, close = spec.server, lambda: None
    if _client_url(server) is not None:
        server = _client_url(server)
    elif _is_app(server):
        loopback = LoopbackServer(server, deadline_s=min(cfg.env.timeout, 60.0))
        server, close = loopback.url, loopback.close
    if not isinstance(server, str) or "://" not in server:
        close()
        raise ConfigError(
            f"env.environment: openenv: got {type(server).__name__} {server!r:.80}, expected a "
            "server URL, an OpenEnv app (create_app), an OpenEnv client, or an OpenEnv(...)"
        )
    return replace(spec, server=http_url(server)), close


def text_field(schema: dict) -> str | None:
    """The action's one string field (besides `metadata`), e.g. "message"; None otherwise."""
    props = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
    strings = [k for k, v in props.items() if v.get("type") == "string"]
    return strings[0] if len(props) == 1 and len(strings) == 1 else None


def default_action(schema: dict) -> Callable[[str, dict], dict]:
    """Text -> action: into the one string field, else the text parsed as a JSON object."""
    field = text_field(schema)
    if field is not None:
        return lambda text, _schema: {field: text}

    def parse(text: str, _schema: dict) -> dict:
        try:
            action = json.loads(text)
        except ValueError:
            action = None
        if not isinstance(action, dict):
            raise ValueError(
                "expected the action as a JSON object with the fields "
                f"{sorted(k for k in schema.get('properties', {}) if k != 'metadata')}"
            )
        return action

    return parse


def default_observation(obs: dict) -> str:
    """An observation's text: its one string field, else the fields as JSON."""
    fields = {k: v for k, v in obs.items() if k != "metadata"}
    strings = [v for v in fields.values() if isinstance(v, str)]
    if len(fields) == 1 and len(strings) == 1:
        return strings[0]
    return json.dumps(fields, sort_keys=True, default=str)


def train_rows(spec: OpenEnv, cfg) -> list[dict[str, Any]]:
    """One row per episode: its reset arguments, and a "prompt" naming them (the episode's
    real prompt is its first observation)."""
    episodes = spec.episodes
    if episodes is None:
        episodes = max(EPISODES, cfg.train.max_steps * cfg.rollout.prompts_per_step)
    if isinstance(episodes, int):
        if episodes < 1:
            raise ConfigError(f"env.environment: openenv: episodes={episodes}, expected >= 1")
        episodes = [{"seed": k} for k in range(episodes)]
    rows = []
    for i, kwargs in enumerate(episodes):
        if not isinstance(kwargs, dict) or any(k in ROW_KEYS for k in kwargs):
            raise ConfigError(
                f"env.environment: openenv: episode {i} is {kwargs!r:.80}, expected a dict of "
                f"reset arguments without the keys {list(ROW_KEYS)}"
            )
        rows.append({**kwargs, "prompt": f"OpenEnv episode {json.dumps(kwargs, default=str)}"})
    return rows


class Episodes:
    """The agent's episodes, one per call, each on a session of its own (see the module)."""

    def __init__(self, spec: OpenEnv, schema: dict, timeout: float):
        self.spec, self.url, self.schema, self.timeout = spec, spec.server, schema, timeout
        self.action = spec.action or default_action(schema)
        self.observation = spec.observation or default_observation

    async def _reset(self, row: dict, deadline: float):
        """(session, first result) on a new WebSocket session; while the server's sessions
        are all taken (CAPACITY_REACHED), asked again until `deadline`."""
        kwargs = {k: v for k, v in row.items() if k not in ROW_KEYS}
        wait = 0.05
        while True:
            env = GenericEnvClient(
                base_url=self.url, connect_timeout_s=self.timeout, message_timeout_s=self.timeout
            )
            try:
                return env, await env.reset(**kwargs)
            except Exception as e:
                await env.close()
                # a full server sends CAPACITY_REACHED and closes the session, often before
                # the reset is sent: the client then sees the closed connection
                full = CAPACITY in str(e) or isinstance(e, ConnectionClosed)
                if not full or time.monotonic() + wait > deadline:
                    hint = " (all its sessions taken: max_concurrent_envs?)" if full else ""
                    raise RuntimeError(f"OpenEnv server {self.url}: reset: {e}{hint}") from None
            await asyncio.sleep(wait)
            wait = min(2 * wait, 1.0)

    async def run(self, client, row: dict) -> float:
        """One episode; its return."""
        env, result = await self._reset(row, time.monotonic() + 0.9 * self.timeout)
        try:
            total = float(result.reward or 0.0)
            system = self.spec.system_prompt
            messages = [{"role": "system", "content": system}] if system else []
            for _ in range(self.spec.max_turns):
                if result.done:
                    break
                messages.append({"role": "user", "content": self.observation(result.observation)})
                reply = await client.chat.completions.create(model="policy", messages=messages)
                text = reply.choices[0].message.content or ""
                messages.append({"role": "assistant", "content": text})
                result = await self._step(env, text)
                total += float(result.reward or 0.0)
            return total
        finally:
            await env.close()

    async def _step(self, env: GenericEnvClient, text: str) -> StepResult:
        """The environment's step on the model's text; an action that cannot be built or that
        the server rejects (VALIDATION_ERROR) is the next observation, an error the model
        reads, with reward 0."""
        try:
            action = self.action(text, self.schema)
        except ValueError as e:
            return StepResult(observation={"error": f"invalid action: {e}"}, reward=0.0)
        try:
            return await env.step(action)
        except Exception as e:  # openenv raises RuntimeError("Server error: ... (code: ...)")
            if "VALIDATION_ERROR" not in str(e):
                raise RuntimeError(f"OpenEnv server {self.url}: step: {e}") from None
            return StepResult(observation={"error": f"invalid action: {e}"}, reward=0.0)

    def agent(self) -> Callable:
        """`run` as the coroutine function `env.agent` takes."""

        async def openenv_episode(client, row):
            return await self.run(client, row)

        openenv_episode.server = self.url  # the server's URL, for the run's messages
        return openenv_episode


def adapt(target, cfg) -> Adapted:
    """`target` (see the module) as the rows and agent a run trains on; the server is asked
    for /health and /schema first, each within env.timeout."""
    spec, close = resolve(target, cfg)
    try:
        if spec.max_turns < 1:
            raise ConfigError(
                f"env.environment: openenv: max_turns={spec.max_turns}, expected >= 1"
            )
        deadline = min(cfg.env.timeout, 60.0)
        _get_json(spec.server, "/health", deadline)
        schema = _get_json(spec.server, "/schema", deadline).get("action", {})
        rows = train_rows(spec, cfg)
    except BaseException:
        close()
        raise
    agent = Episodes(spec, schema, cfg.env.timeout).agent()
    return Adapted(kind="openenv", train_rows=rows, eval_rows=None, agent=agent, close=close)
