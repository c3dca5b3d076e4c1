"""Environments written for other frameworks (`verifiers`, OpenEnv) as rlvr trains them: each
kind's adapter turns its environment into the rows a run's prompts come from and an agent
function that makes each rollout through the run's endpoint (rlvr.environments.runner), so
the trained ids are the sampled ids whatever drives the conversation.

`env.environment` / `rlvr train --env KIND:TARGET` names one: KIND is a key of `KINDS`
(rlvr.config.schema_env), TARGET
what that kind's `adapt` takes (for `verifiers`, "module:function" returning the environment).
`rlvr.train(environment=obj)` hands the object itself to the first kind whose `accepts` says
it is one of its own.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlvr.config.schema import ConfigError
from rlvr.config.schema_env import KINDS
from rlvr.config.validate import split_spec


@dataclass
class Adapted:
    """An external environment as a run trains it.

    train_rows / eval_rows: dataset rows, each with "prompt" (a string or chat messages) and
        whatever else the agent reads; None eval_rows: the run evaluates on no held-out rows of
        the environment's own.
    agent: `fn(client, row) -> reward` (or a coroutine function), as `env.agent` takes it; the
        reward is a number, or a mapping of named reward terms when `reward_weights` is set.
    reward_weights: each named term's weight in the reward trained on; None: a single number.
    close: releases what the adapter started (servers, clients), called once when the run ends.
    """

    kind: str
    train_rows: list[dict[str, Any]]
    eval_rows: list[dict[str, Any]] | None
    agent: Callable
    reward_weights: dict[str, float] | None = None
    close: Callable[[], None] = field(default=lambda: None)


def adapter_module(kind: str):
    """The adapter module of `kind`; a missing package is one line with its install command."""
    module, dist, extra = KINDS[kind]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in (dist.replace("-", "_"), dist.split("-")[0]):
            raise ConfigError(
                f"env.environment: {kind} environments need the {dist} package: "
                f'pip install "rlvr[{extra}]"'
            ) from None
        raise


def _modules_present():
    """(kind, module) of every kind whose adapter module and package import."""
    for kind in KINDS:
        try:
            yield kind, adapter_module(kind)
        except ConfigError:  # its package is not installed: not a kind of this object
            continue
        except ModuleNotFoundError as e:
            if e.name != KINDS[kind][0]:
                raise


def adapt(cfg, environment: Any = None) -> Adapted | None:
    """The run's environment: `environment` (an object, or a "KIND:TARGET" string) handed in
    by the Python API, else env.environment; None when neither. A spec is adapted by its
    kind's module; an object by the first kind whose `accepts` takes it."""
    spec = environment if isinstance(environment, str) else None
    if environment is None:
        spec = cfg.env.environment
        if spec is None:
            return None
    if spec is not None:
        kind, target = split_spec(spec)
        return _closed_once(adapter_module(kind).adapt(target, cfg))
    for _kind, module in _modules_present():
        if module.accepts(environment):
            return _closed_once(module.adapt(environment, cfg))
    raise ConfigError(
        f"environment: expected a `verifiers.v1` Env, an OpenEnv environment or a "
        f'"KIND:TARGET" string (KIND one of {sorted(KINDS)}), got {type(environment).__name__} '
        f'(the package of its kind may be missing: pip install "rlvr[verifiers]" or '
        f'"rlvr[openenv]")'
    )


def _closed_once(adapted: Adapted) -> Adapted:
    """`adapted` whose close runs once however often it is called."""
    close, done = adapted.close, threading.Event()

    def once() -> None:
        if not done.is_set():
            done.set()
            close()

    adapted.close = once
    return adapted


def run_environment(cfg, environment: Any = None, agent: Callable | None = None):
    """The run's `Adapted` environment (`environment` from the Python API, else
    env.environment), None without one; beside it an agent, a dataset or a reward term named
    as one of the run's own is refused by name before anything starts."""
    from rlvr.config.algorithm import reward_terms

    if cfg.train.inflight_updates and (environment or agent) is not None:
        raise ConfigError("train.inflight_updates: expected false beside an agent or an "
                          "environment (in flight, rlvr's own rollouts only)")  # fmt: skip
    if environment is None and cfg.env.environment is None:
        return None
    where = "environment" if environment is not None else "env.environment"
    if agent is not None or cfg.env.agent is not None:
        raise ConfigError(f"{where}: not with an agent (env.agent / agent=): the environment "
                          "drives the rollouts; give one of the two")  # fmt: skip
    if cfg.data.path is not None:
        raise ConfigError(f"{where}: not with a dataset (data.path / train_dataset): the "
                          "environment gives the prompts; give one of the two")  # fmt: skip
    adapted = adapt(cfg, environment)
    taken = sorted(set(adapted.reward_weights or ()) & {*reward_terms(cfg), "accuracy"})
    if taken:
        adapted.close()
        raise ConfigError(f"{where}: its reward terms {taken} have the names of the run's "
                          "own terms (reward/<name>); rename them")  # fmt: skip
    return adapted


@contextlib.contextmanager
def closed_on_error(adapted: Adapted | None):
    """The environment's servers and clients released when building the run around it fails
    (once it is built, the run's agents hold it and close it with the run)."""
    try:
        yield
    except BaseException:
        if adapted is not None:
            adapted.close()
        raise


def environment_prompts(cfg, tokenizer, model, adapted: Adapted | None):
    """The run's prompts: the environment's rows (loaded as a dataset file would be, from a
    file of their own that is gone once read), else the config's data. Its held-out rows are
    evaluated (by rlvr's own rollouts) only where reward.accuracy names a reward that scores
    them: the environment scores training rollouts only."""
    import dataclasses
    import tempfile
    from pathlib import Path

    from rlvr.api.inputs import rows_text
    from rlvr.data.prompts import load_prompts

    context = getattr(model.config, "max_position_embeddings", None)
    if adapted is None:
        return load_prompts(cfg, tokenizer, context)
    evaluated = adapted.eval_rows and cfg.reward.accuracy not in ("task", "none")
    with tempfile.TemporaryDirectory(prefix="rlvr-environment-") as tmp:
        paths = {}
        for stem, rows in (("train", adapted.train_rows), ("eval", adapted.eval_rows)):
            if rows and (stem == "train" or evaluated):
                paths[stem] = str(Path(tmp) / f"{stem}.jsonl")
                text = rows_text(rows, f"{adapted.kind} {stem} rows")
                Path(paths[stem]).write_text(text, encoding="utf-8")
        if "train" not in paths:
            raise ConfigError(f"env.environment: the {adapted.kind} environment has no rows")
        data = dataclasses.replace(cfg.data, path=paths["train"], eval_path=paths.get("eval"))
        source = load_prompts(dataclasses.replace(cfg, data=data), tokenizer, context)
    return dataclasses.replace(source, name=f"{adapted.kind} environment")
