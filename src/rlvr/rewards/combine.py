"""Weighted sums of reward functions, with errors that say which reward, which sample, what input.

The one reward signature, for built-in and user rewards alike, is TRL's:

    fn(prompts, completions, completion_ids, **kwargs) -> list[float | None]

called with keyword arguments only (`RESERVED_KWARGS` lists every name the trainer passes):
`prompts` (the prompt as the dataset gave it: a string, or a list of chat messages),
`completions` (a string each, or `[{"role": "assistant", "content": ...}]` when the prompt
is a list of messages, as TRL passes them), `completion_ids` (token ids, EOS included),
`answer` (the reference answer string), `trainer_state` (`.global_step`, `.max_steps`),
`prompt_texts` (the prompt text the policy continued, chat template included),
`completion_lengths` (tokens incl. EOS), `truncated`, `group_ids`, `max_new_tokens`, and every
other dataset column under its own name. A function that takes `**kwargs` receives all of
them; one that does not receives only the parameters it names. One value per completion;
None means "no score" and counts as 0 in the total (and in `none_counts`).

When a call raises (any exception, `SystemExit` included; only KeyboardInterrupt passes
through) or returns something that is not one finite float32 value or None per completion,
the reward is run again one sample at a time to find the samples at fault. With
`on_error="raise"` the first of them is reported in a `RewardError`; with `on_error="zero"`
they score 0, the others keep their scores, and `failures[name]` counts them.
"""

from __future__ import annotations

import inspect
import math
import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.config.schema import ConfigError
from rlvr.rewards.limits import awaited

RewardFn = Callable[..., list]
_SNIPPET = 200
FLOAT32_MAX = 3.4028234663852886e38  # rewards become float32 tensors: larger is inf there

# Every keyword name the trainer passes to reward functions (TRL's GRPOTrainer names first),
# plus the scorer's own argument. A dataset column may not take one of these names: it would
# replace the trainer's value. `rlvr.data.prompts` refuses such a column when the data is loaded.
RESERVED_KWARGS: tuple[str, ...] = (
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
    "environments",
    "answer",
    "prompt_texts",
    "completion_lengths",
    "truncated",
    "group_ids",
    "max_new_tokens",
    "on_error",
)


class RewardError(RuntimeError):
    """A reward function failed on one sample."""

    def __init__(self, name: str, index: int, completion: Any, cause: BaseException | str):
        completion = completion_text(completion)
        snippet = completion if len(completion) <= _SNIPPET else completion[:_SNIPPET] + "..."
        why = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        super().__init__(
            f"reward {name!r} failed on sample {index} ({why}); completion: {snippet!r}"
        )
        self.name, self.index, self.completion = name, index, completion

    @classmethod
    def whole_batch(cls, name: str, n: int, cause: BaseException | str) -> RewardError:
        """A reward that fails on the batch of `n` and passes on every sample alone."""
        why = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        err = cls.__new__(cls)
        RuntimeError.__init__(
            err,
            f"reward {name!r} failed on the whole batch of {n} completions ({why}), "
            f"though it scores each of them alone",
        )
        err.name, err.index, err.completion = name, None, None
        return err


class RewardSignatureError(ConfigError):
    """A reward function asks for an argument that rewards are never given."""


def completion_text(completion: Any) -> str:
    """The text of a completion: the string itself, or the contents of its messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


def prompt_text(prompt: Any) -> str:
    """The text of a prompt: the string itself, or its last user message's content."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str((users or list(prompt))[-1].get("content", "")) if prompt else ""
    return str(prompt)


@dataclass(frozen=True)
class RewardResult:
    """total: weighted sum per sample; per_reward: each reward's unweighted scores (None -> 0);
    failures / none_counts: samples scored 0 for an error / for "no score"; seconds: wall time;
    errors: each failing reward's first error message."""

    total: list[float]
    per_reward: dict[str, list[float]]
    failures: dict[str, int]
    none_counts: dict[str, int]
    seconds: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def metrics(self, prefix: str = "reward/") -> dict[str, float]:
        """Each reward's mean under its own name, plus the total and the error counts."""
        n = max(len(self.total), 1)
        out = {f"{prefix}total": sum(self.total) / n}
        for name, scores in self.per_reward.items():
            out[f"{prefix}{name}"] = sum(scores) / n
            out[f"{prefix}{name}/failures"] = float(self.failures[name])
            out[f"{prefix}{name}/none"] = float(self.none_counts[name])
        return out


def _check(scores, n: int) -> str | None:
    """Why `scores` is not a valid reward output, or None if it is."""
    if not isinstance(scores, (list, tuple)):
        return f"returned {type(scores).__name__}, expected a list"
    if len(scores) != n:
        return f"returned {len(scores)} scores for {n} completions"
    for i, s in enumerate(scores):
        if s is None:
            continue
        if isinstance(s, bool) or not isinstance(s, numbers.Real):
            return f"score {i} is {s!r}, expected a finite float or None"
        if not math.isfinite(s) or abs(s) > FLOAT32_MAX:
            return f"score {i} is {s!r}, not finite in float32 (|x| <= {FLOAT32_MAX:.4g})"
    return None


def bind(name: str, fn: RewardFn, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments `fn` is called with: all of `kwargs` when it takes **kwargs,
    else only those it names. A parameter without a default that is not in `kwargs` raises
    RewardSignatureError naming it and what rewards receive."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: pass everything
        return dict(kwargs)
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    named = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    for p in params:
        missing = p.default is inspect.Parameter.empty and p.name not in kwargs
        if (p.kind is inspect.Parameter.POSITIONAL_ONLY) or (p in named and missing):
            raise RewardSignatureError(
                f"reward {name!r}: parameter {p.name!r} is not an argument rewards receive. "
                f"Rewards are called as fn(prompts, completions, completion_ids, **kwargs) with "
                f"keyword arguments {', '.join(sorted(kwargs))} (the reference answer is "
                f"'answer'; dataset columns under their own names)"
            )
    if takes_all:
        return dict(kwargs)
    return {p.name: kwargs[p.name] for p in named if p.name in kwargs}


def _call(name: str, fn: RewardFn, kwargs: Mapping[str, Any], n: int):
    """(scores, None) or (None, why): `fn` called once, any failure caught."""
    bound = bind(name, fn, kwargs)  # a signature mismatch is a config error, never scored 0
    try:
        scores = awaited(fn(**bound))  # an async reward is awaited, as TRL does
        if (
            scores is not None
            and not isinstance(scores, (list, tuple))
            and hasattr(scores, "tolist")
        ):
            scores = scores.tolist()  # a numpy array or a tensor
        why = _check(scores, n)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # SystemExit too: a reward that exits is a failing reward
        return None, e
    return (list(scores), None) if why is None else (None, why)


def _one(kwargs: Mapping[str, Any], n: int, i: int) -> dict[str, Any]:
    return {
        k: ([v[i]] if isinstance(v, (list, tuple)) and len(v) == n else v)
        for k, v in kwargs.items()
    }


def run_reward(
    name: str, fn: RewardFn, kwargs: Mapping[str, Any], *, on_error: str = "raise"
) -> tuple[list[float | None], int, str | None]:
    """One reward's scores, its failure count and its first error, under the policy above."""
    completions = kwargs["completions"]
    n = len(completions)
    scores, why = _call(name, fn, kwargs, n)
    if why is None:
        return scores, 0, None
    out: list[float | None] = []
    first: RewardError | None = None
    bad = 0
    for i in range(n):
        one, why_i = _call(name, fn, _one(kwargs, n, i), 1)
        if why_i is None:
            out.append(one[0])
            continue
        if isinstance(why_i, KeyError) and why_i.args == ("answer",) and "answer" not in kwargs:
            why_i = (
                "KeyError: 'answer': the dataset has no reference answer (a prompt-only dataset)"
            )
        err = RewardError(name, i, completions[i], why_i)
        if on_error == "raise":
            raise err from (why_i if isinstance(why_i, BaseException) else None)
        first, bad = first or err, bad + 1
        out.append(0.0)
    if first is None and on_error == "raise":
        # fails on the batch, passes on every sample alone: report it as a batch failure
        raise RewardError.whole_batch(name, n, why)
    return out, bad, None if first is None else str(first)


def combine_rewards(
    specs: Sequence[tuple[str, float, RewardFn]],
    kwargs: Mapping[str, Any],
    *,
    on_error: str = "raise",
) -> RewardResult:
    """Score every completion with every (name, weight, fn) and sum with the weights.
    `kwargs` holds the reward arguments (`completions` at least; see the module docstring)."""
    if on_error not in ("raise", "zero"):
        raise ValueError(f"on_error must be 'raise' or 'zero', got {on_error!r}")
    n = len(kwargs["completions"])
    for key, value in kwargs.items():
        if key in ("prompts", "completion_ids", "answer") and len(value) != n:
            raise ValueError(f"{len(value)} {key} for {n} completions")
    names = [s[0] for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate reward names in {names}")
    total = [0.0] * n
    per_reward, failures, none_counts, seconds, errors = {}, {}, {}, {}, {}
    for name, weight, fn in specs:
        t0 = time.perf_counter()
        raw, bad, error = run_reward(name, fn, kwargs, on_error=on_error)
        seconds[name] = time.perf_counter() - t0
        scores = [0.0 if s is None else float(s) for s in raw]
        none_counts[name] = sum(1 for s in raw if s is None)
        per_reward[name], failures[name] = scores, bad
        if error is not None:
            errors[name] = error
        total = [t + weight * s for t, s in zip(total, scores)]
    return RewardResult(total, per_reward, failures, none_counts, seconds, errors)
