"""Agent calls as a generation batch: `fn(client, row) -> reward` for every response row, run
at once, each with a client pointed at its own rollout on the run's endpoint; their recorded
turns become the batch's `Rollout` and their rewards its accuracy scores.

A coroutine function runs on one event loop (a thread of its own) with an `openai.AsyncOpenAI`
client; a plain function on a thread of its own per call with an `openai.OpenAI` client. Each
call has `env.timeout` seconds from its start. A call that raises, passes its time, returns a
reward that is not a finite number, or makes no request, or one whose turns do not extend each
other (`drift`), is a fault: under `env.on_error: raise` the step ends with an error naming the
row and the fault; under `drop` the rollout is left empty, its group is not trained (the rule
of groups dynamic sampling leaves out) and it is counted (`env/dropped`, `env/faults/<kind>`).
A plain function that hangs cannot be stopped from outside: its thread is abandoned, its
rollout closed, and any request it makes later refused.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.config.schema import ConfigError
from rlvr.data.prompts import Prompt
from rlvr.environments.batcher import Batcher
from rlvr.environments.endpoint import Endpoint
from rlvr.environments.recorder import AgentFault, Recorder, rollout_of, trajectory
from rlvr.rollout import Rollout, RolloutEngine, SamplingParams, derive_seed

Reward = tuple[float, dict[str, float]]  # the reward trained on, its named terms
LOOP_GRACE_S = 5.0  # past env.timeout, what the event loop of async agents has to wind down


class AgentError(RuntimeError):
    """An agent call failed under env.on_error=raise; the message names the row and fault."""


@dataclass(frozen=True)
class AgentBatch:
    """A generation batch's rollouts: `rewards` (B,) the agents' (0 where dropped),
    `dropped` (B,) bool, counts for the step's metrics, and `terms`: each named reward term's
    (B,) values (0 where dropped) when the environment names them (`Adapted.reward_weights`)."""

    rollout: Rollout
    rewards: torch.Tensor
    dropped: torch.Tensor
    sums: dict[str, float]
    terms: dict[str, torch.Tensor] = field(default_factory=dict)


def _openai():
    try:
        import openai
    except ImportError:
        raise ConfigError(
            "env.agent needs the openai package for the client it hands the agent: "
            "pip install 'rlvr[agents]'"
        ) from None
    return openai


def agent_row(prompt: Prompt, task, system_prompt: str | None, template: str) -> dict[str, Any]:
    """What an agent receives of a dataset row: `messages` (the prompt as chat messages, as
    the run renders it), `prompt` (its rendered text), `answer`, `example` (a built-in
    task's `Example`, or the dataset's `PromptExample`) and the row's other columns."""
    from rlvr.data.dataset import PromptExample, build_messages

    ex = prompt.example
    if isinstance(ex, PromptExample):
        messages = build_messages(ex, template=template, system_prompt=system_prompt)
    elif task is not None:
        messages = task.prompt_messages(ex)
        if system_prompt:
            messages = [{"role": "system", "content": system_prompt}, *messages]
    else:
        messages = [{"role": "user", "content": prompt.text}]
    return {
        **prompt.columns,
        "messages": messages,
        "prompt": prompt.text,
        "answer": prompt.answer,
        "example": ex,
    }


def check_reward(value) -> float:
    """The agent's reward as a float; AgentFault when it is not a finite real number."""
    if not isinstance(value, numbers.Real):
        raise AgentFault(
            "non_numeric", f"returned {type(value).__name__} {value!r:.80}, expected a number"
        )
    if not math.isfinite(float(value)):
        raise AgentFault("non_finite", f"returned {value!r}, expected a finite number")
    return float(value)


class AgentRunner:
    """The endpoint over the run's engine, and `run` for one generation batch."""

    def __init__(self, fn: Callable, engine: RolloutEngine, tokenizer, **kw):
        """`kw`: params (the run's SamplingParams), eos_ids, max_tokens, context, timeout,
        on_error, task, system_prompt, template, name (the endpoint's model name),
        reward_weights (named reward terms' weights: the agent returns a mapping), on_close
        (called once the endpoint is closed: the environment's own close)."""
        self.fn, self.tokenizer = fn, tokenizer
        self.is_async = inspect.iscoroutinefunction(fn)
        self.openai = _openai()
        self.timeout, self.on_error = kw["timeout"], kw["on_error"]
        self.reward_weights = kw.get("reward_weights")
        self.on_close = kw.get("on_close") or (lambda: None)
        self.task, self.system_prompt, self.template = (
            kw["task"],
            kw["system_prompt"],
            kw["template"],
        )
        self.recorder = Recorder(tokenizer, kw["eos_ids"])
        self.batcher = Batcher(engine, kw["params"])
        self.endpoint = Endpoint(
            self.batcher,
            self.recorder,
            max_tokens=kw["max_tokens"],
            context=kw["context"],
            model_name=kw["name"],
        )

    def close(self) -> None:
        """The endpoint, then what the environment started (`on_close`)."""
        try:
            self.endpoint.close()
        finally:
            self.on_close()

    def run(self, prompts: list[Prompt], params: SamplingParams, step: int) -> AgentBatch:
        """`params.n` agent calls per prompt, all at once; rows in the engine's order."""
        G = params.n
        rows = [p for p in prompts for _ in range(G)]
        seeds = params.row_seeds or tuple(derive_seed(params.seed, k) for k in range(len(prompts)))
        rids = [f"s{step}-{i}-{secrets.token_hex(4)}" for i in range(len(rows))]
        for i, rid in enumerate(rids):
            self.recorder.open(rid, derive_seed(seeds[i // G], "agent", i % G))
        self.batcher.set_params(params)
        self.batcher.set_active(len(rows))
        t0, calls0, requests0 = time.perf_counter(), self.batcher.calls, self.batcher.requests
        try:
            results = self._calls(rids, rows)
        finally:
            self.batcher.set_active(0)
        if self.endpoint.failure is not None:  # not the agents' fault: never dropped
            for rid in rids:
                self.recorder.close(rid)
            failure, self.endpoint.failure = self.endpoint.failure, None
            raise RuntimeError(f"the run's endpoint failed: {failure}") from failure
        sums: Counter[str] = Counter({"env/dropped": 0.0, "env/tool_parse_failures": 0.0})
        trajectories, rewards, dropped = [], [], []
        terms: dict[str, list[float]] = {k: [] for k in self.reward_weights or {}}
        traces = [self.recorder.close(rid) for rid in rids]  # later requests are refused
        for i, (trace, result) in enumerate(zip(traces, results)):
            replies = [t.reply for t in trace.turns if t.reply is not None]
            sums["env/tool_parse_failures"] += sum(r.failed for r in replies)
            # the endpoint's record first: the agent's error is often its consequence
            fault = trace.fault or (result if isinstance(result, AgentFault) else None)
            if fault is None and not trace.turns:
                fault = AgentFault("no_completion", "made no request to the endpoint")
            if fault is not None:
                if self.on_error == "raise":
                    raise AgentError(
                        f"env.agent: the call on row {i} (prompt {i // G}, response {i % G}) "
                        f"{fault} [{fault.kind}]; env.on_error=drop leaves such a rollout out"
                    )
                sums["env/dropped"] += 1
                sums[f"env/faults/{fault.kind}"] += 1
                trajectories.append(None)
                rewards.append(0.0)
                dropped.append(True)
                for values in terms.values():
                    values.append(0.0)
                continue
            trajectories.append(trajectory(trace.turns))
            reward, named = result
            rewards.append(reward)
            dropped.append(False)
            for name, values in terms.items():
                values.append(named[name])
            sums["env/turns"] += len(trace.turns)
            sums["env/tool_calls"] += sum(r.calls for r in replies)
        sums["env/rollouts"] += len(rows)
        sums["env/seconds"] += time.perf_counter() - t0
        sums["env/engine_calls"] += self.batcher.calls - calls0
        sums["env/requests"] += self.batcher.requests - requests0
        pad = self.tokenizer.pad_token_id
        return AgentBatch(
            rollout_of(trajectories, G, pad),
            torch.tensor(rewards, dtype=torch.float32),
            torch.tensor(dropped, dtype=torch.bool),
            dict(sums),
            {k: torch.tensor(v, dtype=torch.float32) for k, v in terms.items()},
        )

    def _calls(self, rids: list[str], prompts: list[Prompt]) -> list[Reward | AgentFault]:
        rows = [agent_row(p, self.task, self.system_prompt, self.template) for p in prompts]
        if self.is_async:
            return self._async_calls(rids, rows)
        results: list[Reward | AgentFault | None] = [None] * len(rows)

        http = self.openai.DefaultHttpxClient()  # one connection pool for the batch's clients

        def call(i: int) -> None:
            client = self._client(self.openai.OpenAI, rids[i], http)
            try:
                results[i] = weighted_reward(self.fn(client, rows[i]), self.reward_weights)
            except AgentFault as fault:
                results[i] = fault
            except Exception as e:
                results[i] = AgentFault("raised", f"raised {type(e).__name__}: {e}")
            finally:
                self.batcher.finished_one()

        threads = [
            threading.Thread(target=call, args=(i,), name=f"rlvr-agent-{i}", daemon=True)
            for i in range(len(rows))
        ]
        deadline = time.monotonic() + self.timeout
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0.0))
        late = AgentFault("timeout", f"did not return within env.timeout={self.timeout:g}s")
        out = [late if t.is_alive() or r is None else r for t, r in zip(threads, results)]
        if not any(t.is_alive() for t in threads):  # an abandoned call may still use it
            http.close()
        return out

    def _client(self, cls, rid: str, http):
        """An `openai` client (`cls`: OpenAI or AsyncOpenAI) on rollout `rid`'s base URL: no
        retries, the run's timeout (env.timeout), the batch's connection pool."""
        return cls(
            base_url=self.endpoint.base_url(rid),
            api_key="rlvr",
            max_retries=0,
            timeout=self.timeout,
            http_client=http,
        )

    def _async_calls(self, rids: list[str], rows: list[dict]) -> list[Reward | AgentFault]:
        async def one(i: int, http) -> Reward | AgentFault:
            client = self._client(self.openai.AsyncOpenAI, rids[i], http)
            try:
                value = await asyncio.wait_for(self.fn(client, rows[i]), self.timeout)
                return weighted_reward(value, self.reward_weights)
            except AgentFault as fault:
                return fault
            except asyncio.TimeoutError:
                return AgentFault("timeout", f"did not return within env.timeout={self.timeout:g}s")
            except Exception as e:
                return AgentFault("raised", f"raised {type(e).__name__}: {e}")
            finally:
                self.batcher.finished_one()

        results: list[Reward | AgentFault | None] = [None] * len(rows)

        async def every() -> None:
            async with self.openai.DefaultAsyncHttpxClient() as http:

                async def into(i: int) -> None:
                    results[i] = await one(i, http)

                await asyncio.gather(*(into(i) for i in range(len(rows))))

        # a loop of its own on a thread of its own: the caller may be inside a running loop
        # (a notebook), and an agent that blocks the loop is then still bounded by the join
        loop = threading.Thread(
            target=asyncio.run, args=(every(),), name="rlvr-agents", daemon=True
        )
        loop.start()
        loop.join(self.timeout + LOOP_GRACE_S)
        late = AgentFault("timeout", f"did not return within env.timeout={self.timeout:g}s")
        return [late if r is None else r for r in results]


def build_agents(
    cfg, engine: RolloutEngine, tokenizer, model, source, fn: Callable | None, adapted=None
):
    """The run's `AgentRunner` for `fn` (handed in by the Python API), `env.agent`
    ("module:function") or the agent of an environment (`adapted`, rlvr.environments.adapter),
    None when none; its endpoint starts now."""
    from rlvr.config.callables import extend_sys_path, load_callable
    from rlvr.training.settings import CollectSettings

    if adapted is not None:
        fn = adapted.agent
    if fn is None and cfg.env.agent is None:
        return None
    if cfg.rollout.tools:
        raise ConfigError(
            f"rollout.tools: {', '.join(cfg.rollout.tools)} would not run: under env.agent the "
            "agent runs its own tools (docs/environments.md); leave rollout.tools empty"
        )
    if fn is None:
        extend_sys_path(cfg.reward.python_path)
        try:
            fn = load_callable(cfg.env.agent, "env.agent")
        except (ValueError, ImportError, AttributeError) as e:
            raise ConfigError(str(e)) from None
    from rlvr.models import eos_ids

    return AgentRunner(
        fn,
        engine,
        tokenizer,
        params=CollectSettings.from_config(cfg).params,
        eos_ids=eos_ids(tokenizer, model),
        max_tokens=cfg.rollout.max_new_tokens,
        context=getattr(model.config, "max_position_embeddings", None),
        timeout=cfg.env.timeout,
        on_error=cfg.env.on_error,
        task=source.task,
        system_prompt=cfg.data.system_prompt,
        template=cfg.data.prompt_template,
        name=cfg.model.name_or_path,
        reward_weights=adapted.reward_weights if adapted is not None else None,
        on_close=adapted.close if adapted is not None else None,
    )


def weighted_reward(value: Any, weights: dict[str, float] | None) -> tuple[float, dict[str, float]]:
    """An agent's reward as (the reward trained on, its named terms): a number as it is (no
    terms); under `weights`, a mapping of exactly the weighted terms, each a finite number,
    summed with their weights. Anything else is an AgentFault naming the term."""

    if weights is None:
        return check_reward(value), {}
    if not isinstance(value, Mapping):
        raise AgentFault(
            "non_numeric",
            f"returned {type(value).__name__} {value!r:.80}, expected a mapping of the reward "
            f"terms {sorted(weights)}",
        )
    missing = [k for k in weights if k not in value]
    if missing:
        raise AgentFault("missing_term", f"returned no value for the reward terms {missing}")
    unknown = [k for k in value if k not in weights]
    if unknown:
        raise AgentFault(
            "unknown_term", f"returned the reward terms {unknown}, not among {sorted(weights)}"
        )
    terms = {}
    for name, v in value.items():
        try:
            terms[str(name)] = check_reward(v)
        except AgentFault as fault:
            raise AgentFault(fault.kind, f"term {name!r}: {fault}") from None
    return sum(w * terms[k] for k, w in weights.items()), terms
