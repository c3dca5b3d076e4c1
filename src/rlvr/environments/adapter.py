"""Environments written for other frameworks (`verifiers`, OpenEnv) as rlvr trains them: each
kind's adapter turns its environment into the rows a run's prompts come from and an agent
function that makes each rollout through the run's endpoint (rlvr.environments.runner), so
the trained ids are the sampled ids whatever drives the conversation.

`env.environment` / `rlvr train --env KIND:TARGET` names one: KIND is a key of `KINDS`, TARGET
what that kind's `adapt` takes (for `verifiers`, "module:function" returning the environment).
`rlvr.train(environment=obj)` hands the object itself to the first kind whose `accepts` says
it is one of its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlvr.config.schema import ConfigError

# KIND -> (adapter module, the distribution a user installs for it, the extra naming it)
KINDS: dict[str, tuple[str, str, str]] = {
    "verifiers": ("rlvr.environments.verifiers_env", "verifiers", "verifiers"),
    "openenv": ("rlvr.environments.openenv_env", "openenv", "openenv"),
}


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


def split_spec(spec: str) -> tuple[str, str]:
    """ "KIND:TARGET" -> (KIND, TARGET), or a ConfigError naming what was expected."""
    kind, sep, target = spec.partition(":")
    if not sep or kind not in KINDS or not target:
        raise ConfigError(
            f"env.environment: got {spec!r}, expected KIND:TARGET with KIND one of "
            f"{sorted(KINDS)} (e.g. verifiers:my_env:load_environment)"
        )
    return kind, target


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
