"""`verifiers` 0.4 environments (`verifiers.v1`: Env, Taskset / Task, Harness, Judge) as rlvr
trains them (rlvr.environments.adapter).

- The taskset's tasks are the run's rows: each row's prompt is the task's (its system prompt
  first), and `vf_task` its index, by which the agent finds the task again.
- Each rollout is one episode, `Env.run_episode(task, ctx)`, run whole by `verifiers`: the
  env's harness program talks to its interception server, which calls the model through the
  training client (`TrainClientConfig`): it renders the conversation to token ids with the
  `renderers` package and posts them to the run's endpoint at `inference/v1/generate` (vLLM's
  token route), ids in and sampled ids out, so the trained ids are the sampled ids. Every
  rollout has the same client config (the endpoint's shared base URL, `model` naming the
  rollout): `verifiers` keeps one client per distinct config while its server runs.
- The task's reward functions (`@vf.reward`, config-plugged `RewardFunctionConfig`s) and judges
  are the named reward terms, with their weights (`Adapted.reward_weights`); the trace's
  rewards (`trace.rewards`, scores before weighting) are what the agent returns.
- One event loop (a thread, one for the process) holds the env's serving resources
  (`Env.serving()`: shared tool servers, the interception server) for the whole run; `close`
  releases them.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import verifiers.v1 as vf

from rlvr.config.schema import ConfigError
from rlvr.environments.adapter import Adapted
from rlvr.environments.endpoint import BY_MODEL

START_TIMEOUT_S = 300.0  # the env's serving resources (tool servers, interception) coming up
API_KEY_VAR = "RLVR_ENDPOINT_KEY"  # unset: the client sends "EMPTY", which the endpoint takes


def accepts(obj: Any) -> bool:
    return isinstance(obj, vf.Env)


def adapt(target_or_obj: Any, cfg) -> Adapted:
    """A `verifiers.v1.Env` (or "module:function" / "file.py:function" returning one) as the
    run's rows, agent and named reward terms."""
    env = _load(target_or_obj, cfg) if isinstance(target_or_obj, str) else target_or_obj
    if not accepts(env):
        raise ConfigError(
            f"env.environment: verifiers:{target_or_obj} returned {type(env).__name__}, "
            "expected a verifiers.v1 Env"
        )
    if not env.taskset.bounded:
        raise ConfigError(
            f"env.environment: {type(env.taskset).__name__} is infinite; bound it "
            "(taskset.take(n)) so its tasks can be the run's rows"
        )
    tasks = list(env.taskset)
    if not tasks:
        raise ConfigError(f"env.environment: {type(env.taskset).__name__} yields no tasks")
    weights = reward_weights(tasks[0])
    rows = [{"prompt": _messages(task.data), "vf_task": i} for i, task in enumerate(tasks)]
    loop = _Serving(env)
    from rlvr.models import resolve_model_path

    renderer_model = resolve_model_path(cfg.model.name_or_path)
    timeout = cfg.env.timeout

    def agent(client_of_rollout, row: dict) -> dict[str, float]:
        # one client config for every rollout (verifiers keeps a client per distinct config
        # while its server runs): the endpoint's shared base URL, the rollout named as `model`
        head, _, rest = str(client_of_rollout.base_url).rstrip("/").rpartition("/rollouts/")
        rid = rest.split("/", 1)[0]
        config = vf.TrainClientConfig(base_url=f"{head}/rollouts/{BY_MODEL}/v1",
                                      api_key_var=API_KEY_VAR,
                                      renderer_model_name=renderer_model)  # fmt: skip
        ctx = vf.ModelContext(model=rid, client=config)
        episode = loop.run(env.run_episode(tasks[row["vf_task"]], ctx), timeout)
        return episode_rewards(episode)

    return Adapted("verifiers", rows, None, agent, weights, loop.close)


def reward_weights(task: vf.Task) -> dict[str, float]:
    """The task's reward functions and judges by name, each with its weight."""
    out = {fn.__name__: float(getattr(fn, "_vf_weight", 1.0)) for fn in task.hooks("reward")}
    for judge in task.plugged_judges():
        out[judge.reward_name] = float(judge.config.weight)
    if not out:
        raise ConfigError(
            f"env.environment: {type(task).__name__} has no reward function or judge to train on"
        )
    return out


def episode_rewards(episode) -> dict[str, float]:
    """One episode's reward terms, unweighted; a failed episode raises, naming its error."""
    errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
    if not episode.ok or errors:
        first = errors[0] if errors else None
        what = f"{first.type}: {first.message}" if first else "did not complete"
        raise RuntimeError(f"the verifiers episode failed: {what}"[:2000])
    if len(episode.traces) != 1:
        raise RuntimeError(
            f"the verifiers episode has {len(episode.traces)} traces; rlvr trains one-agent "
            "episodes (SingleAgentEnv)"
        )
    rewards = episode.traces[0].rewards
    return {name: r.score for name, r in rewards.items() if r is not None}


def _load(target: str, cfg):
    from rlvr.config.callables import extend_sys_path, load_callable

    extend_sys_path(cfg.reward.python_path)
    try:
        fn = load_callable(target, "env.environment")
    except (ValueError, ImportError, AttributeError) as e:
        raise ConfigError(str(e)) from None
    return fn()


def _messages(data: vf.TaskData) -> list[dict[str, Any]]:
    """The task's prompt as chat messages, its system prompt first."""
    prompt = data.prompt
    if prompt is None:
        raise ConfigError(
            f"env.environment: task {data.idx} has no prompt (the user opens the "
            "conversation); rlvr trains on tasks that give the first prompt"
        )
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = [m.model_dump(mode="json", exclude_none=True) for m in prompt]
    if data.system_prompt:
        messages = [{"role": "system", "content": data.system_prompt}, *messages]
    return messages


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """The process's one event loop for `verifiers` (a daemon thread): `renderers` and the
    training client keep process-wide state (a renderer pool, asyncio locks) bound to the loop
    that first used it, so a second run in the process must use the same loop."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="rlvr-verifiers", daemon=True).start()
        return _LOOP


class _Serving:
    """`env.serving()` held on the process's verifiers loop for the run; `run` submits a
    coroutine to it from any thread and waits for it (the runner's agent threads)."""

    def __init__(self, env: vf.Env):
        self.loop = _loop()
        self.context = env.serving()
        self.run(self.context.__aenter__(), START_TIMEOUT_S)

    def run(self, coro, timeout: float):
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"the verifiers episode passed {timeout:g}s") from None

    def close(self) -> None:
        self.run(self.context.__aexit__(None, None, None), START_TIMEOUT_S)
