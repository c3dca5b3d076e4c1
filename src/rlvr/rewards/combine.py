"""Weighted sums of reward functions, with errors that say which reward, which sample, what input.

A reward function is `fn(prompts, completions, answers, **kwargs) -> list[float | None]`, one
value per completion; None means "no score" and counts as 0 in the total (and in `none_counts`).
kwargs holds the trainer's `group_ids`, `completion_lengths`, `truncated`, `max_new_tokens` and
the extra dataset columns; a kwarg that is a list as long as the batch is per-sample.

When a call raises (or returns something that is not one finite float or None per
completion), the reward is run again one sample at a time to find the samples at fault. With
`on_error="raise"` the first of them is reported in a `RewardError`; with `on_error="zero"` they
score 0, the others keep their scores, and `failures[name]` counts them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

RewardFn = Callable[..., list]
_SNIPPET = 200


class RewardError(RuntimeError):
    """A reward function failed on one sample."""

    def __init__(self, name: str, index: int, completion: str, cause: BaseException | str):
        snippet = completion if len(completion) <= _SNIPPET else completion[:_SNIPPET] + "..."
        why = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        super().__init__(
            f"reward {name!r} failed on sample {index} ({why}); completion: {snippet!r}"
        )
        self.name, self.index, self.completion = name, index, completion


@dataclass(frozen=True)
class RewardResult:
    """total: weighted sum per sample; per_reward: each reward's unweighted scores (None -> 0);
    failures / none_counts: samples scored 0 for an error / for "no score"; seconds: wall time."""

    total: list[float]
    per_reward: dict[str, list[float]]
    failures: dict[str, int]
    none_counts: dict[str, int]
    seconds: dict[str, float] = field(default_factory=dict)

    def metrics(self, prefix: str = "reward/") -> dict[str, float]:
        """Each reward's mean under its own name, plus the total and the error counts."""
        n = max(len(self.total), 1)
        out = {f"{prefix}total": sum(self.total) / n}
        for name, scores in self.per_reward.items():
            out[f"{prefix}{name}"] = sum(scores) / n
            out[f"{prefix}{name}/failures"] = float(self.failures[name])
            out[f"{prefix}{name}/none"] = float(self.none_counts[name])
        return out


def _check(name: str, scores, n: int) -> str | None:
    """Why `scores` is not a valid reward output, or None if it is."""
    if not isinstance(scores, (list, tuple)):
        return f"returned {type(scores).__name__}, expected a list"
    if len(scores) != n:
        return f"returned {len(scores)} scores for {n} completions"
    for i, s in enumerate(scores):
        if s is None:
            continue
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            return f"score {i} is {s!r}, expected a finite float or None"
    return None


def _one(kwargs: dict, n: int, i: int) -> dict:
    return {
        k: ([v[i]] if isinstance(v, (list, tuple)) and len(v) == n else v)
        for k, v in kwargs.items()
    }


def _per_sample(name, fn, prompts, completions, answers, kwargs, on_error):
    n = len(completions)
    scores: list[float | None] = []
    bad = 0
    for i in range(n):
        try:
            s = fn([prompts[i]], [completions[i]], [answers[i]], **_one(kwargs, n, i))
            why = _check(name, s, 1)
        except Exception as e:
            why = e
        if why is not None:
            if on_error == "raise":
                raise RewardError(name, i, completions[i], why) from (
                    why if isinstance(why, BaseException) else None
                )
            bad += 1
            scores.append(0.0)
        else:
            scores.append(s[0])
    return scores, bad


def run_reward(
    name: str, fn: RewardFn, prompts, completions, answers, *, on_error: str = "raise", **kwargs
) -> tuple[list[float | None], int]:
    """One reward's scores and its failure count, under the error policy above."""
    n = len(completions)
    try:
        scores = fn(list(prompts), list(completions), list(answers), **kwargs)
        why = _check(name, scores, n)
    except Exception as e:
        why = e
    if why is None:
        return list(scores), 0
    scores, bad = _per_sample(name, fn, prompts, completions, answers, kwargs, on_error)
    if bad == 0 and on_error == "raise":
        # fails on the batch, passes on every sample alone: report it as a batch failure
        raise RewardError(name, -1, "<whole batch>", why)
    return scores, bad


def combine_rewards(
    specs: Sequence[tuple[str, float, RewardFn]],
    prompts: Sequence[str],
    completions: Sequence[str],
    answers: Sequence[str],
    *,
    on_error: str = "raise",
    **kwargs,
) -> RewardResult:
    """Score every completion with every (name, weight, fn) and sum with the weights."""
    if on_error not in ("raise", "zero"):
        raise ValueError(f"on_error must be 'raise' or 'zero', got {on_error!r}")
    n = len(completions)
    if len(prompts) != n or len(answers) != n:
        raise ValueError(f"{len(prompts)} prompts, {n} completions, {len(answers)} answers")
    names = [s[0] for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate reward names in {names}")
    total = [0.0] * n
    per_reward, failures, none_counts, seconds = {}, {}, {}, {}
    for name, weight, fn in specs:
        t0 = time.perf_counter()
        raw, bad = run_reward(name, fn, prompts, completions, answers, on_error=on_error, **kwargs)
        seconds[name] = time.perf_counter() - t0
        scores = [0.0 if s is None else float(s) for s in raw]
        none_counts[name] = sum(1 for s in raw if s is None)
        per_reward[name], failures[name] = scores, bad
        total = [t + weight * s for t, s in zip(total, scores)]
    return RewardResult(total, per_reward, failures, none_counts, seconds)
