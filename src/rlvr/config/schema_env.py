"""The config schema's environment keys: `data.reasoning_gym.*` (reasoning-gym's procedural
tasks as a run's prompts) and the `env` section (an agent function that drives rollouts through
the run's OpenAI-compatible endpoint, docs/environments.md), documented as the rest of the
schema is (rlvr.config.schema)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# KIND -> (adapter module, the distribution a user installs for it, the extra naming it)
KINDS: dict[str, tuple[str, str, str]] = {
    "verifiers": ("rlvr.environments.verifiers_env", "verifiers", "verifiers"),
    "openenv": ("rlvr.environments.openenv_env", "openenv", "openenv"),
}


@dataclass(frozen=True)
class ReasoningGymSettings:
    """reasoning-gym's tasks as prompts (`data.reasoning_gym.KEY`, read under
    data.task=reasoning_gym; the `reasoning-gym` package, the `envs` extra).

    tasks: reasoning-gym dataset names, e.g. basic_arithmetic,chain_sum,leg_counting;
        their rows are interleaved in order.
    size: training rows drawn from each task.
    seed: the seed of the training rows; the held-out rows are drawn from another seed, and
        a held-out question that is also a training question is left out.
    system_prompt: the system message put before every question: one of reasoning-gym's
        prompts (default, DeepSeekZero, simple, direct, chain_of_draft) or none.
    """

    tasks: tuple[str, ...] = ("basic_arithmetic", "chain_sum", "leg_counting")
    size: int = 500
    seed: int = 42
    system_prompt: Literal[
        "default", "DeepSeekZero", "simple", "direct", "chain_of_draft", "none"
    ] = "default"


@dataclass(frozen=True)
class EnvConfig:
    """An agent that drives the rollouts (docs/environments.md).

    agent: "module:function" called as fn(client, row) -> reward (a coroutine function is
        awaited): client is an `openai.OpenAI` (or `AsyncOpenAI`) pointed at the run's own
        OpenAI-compatible endpoint, row one dataset row; training uses the token ids the
        endpoint sampled (none = rlvr's own rollouts).
    timeout: seconds one agent call may take, from its start to its reward.
    on_error: an agent call that raises, passes env.timeout, returns a non-finite or
        non-numeric reward (or misses a named reward term), or makes no completion: "raise"
        ends the run naming it, "drop" leaves its group out of the step and counts it
        (env/dropped).
    environment: "KIND:TARGET", an environment of another framework that gives the run its
        prompts, its rollouts and its rewards (docs/environments.md): KIND verifiers (TARGET
        "module:function" or "file.py:function" returning a `verifiers.v1` Env) or openenv;
        none = the run's own data and env.agent.
    """

    agent: str | None = None
    timeout: float = 120.0
    on_error: Literal["raise", "drop"] = "raise"
    environment: str | None = None
