"""One generation batch, generated and scored in parts: while part k is scored on a worker
thread, part k+1 is generated (`reward.overlap`).

A reward that runs programs (the `code` reward's sandboxes) spends its time waiting on other
processes, so the step's generation can go on meanwhile; the update still waits for every
score. Parts are whole groups, consecutive in the batch, and every prompt samples from its own
seed while parts overlap (`rollout.seed_per_prompt`), so a run draws the same responses and
the same scores whatever the number of parts: overlapping changes when a score is computed,
never what it is. With one part nothing runs on another thread and the batch is generated,
decoded and scored exactly as without this module.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rlvr.data.prompts import Prompt
from rlvr.rewards.limits import _thread_state
from rlvr.rewards.scoring import Scorer, Scores
from rlvr.rollout import Rollout, RolloutEngine, SamplingParams, decode_completions

PARTS = 4  # a generation batch's parts when scoring overlaps generation


class Generation(Protocol):
    """What turns prompts into scored responses: the engine that samples, the tokenizer that
    decodes, the scorer that scores (a run, `rlvr.training.setup.Run`, has all three), and
    the agents that drive the engine through the run's endpoint (`env.agent`; None: the
    engine samples the prompts itself)."""

    engine: RolloutEngine
    tokenizer: Any
    scorer: Scorer
    agents: Any


@dataclass(frozen=True)
class Generator:
    """A `Generation` of three given parts (`rlvr eval`, `rlvr rm`)."""

    engine: RolloutEngine
    tokenizer: Any
    scorer: Scorer
    agents: Any = None


@dataclass
class Part:
    """One part's responses (`rows`: the prompt of each response) and their scores; with
    agents, the rollouts they dropped (`dropped`, (B,) bool) and their counts (`env`)."""

    rows: list[Prompt]
    rollout: Rollout
    completions: list[str]  # as the samples log shows them (tool turns included)
    scores: Scores
    dropped: torch.Tensor | None = None
    env: dict[str, float] = field(default_factory=dict)


@dataclass
class Timing:
    """Seconds over a step: generating, scoring (on whichever thread), and the main thread
    blocked on scores; responses scored."""

    generation: float = 0.0
    scoring: float = 0.0
    wait: float = 0.0
    scored: int = 0


def overlap_parts(mode: str, scorer: Scorer) -> int:
    """Parts a generation batch is split into under `reward.overlap` = `mode`: `PARTS` when
    scoring overlaps generation ("on", or "auto" with a reward that runs programs in
    sandboxes), else 1."""
    return PARTS if mode == "on" or (mode == "auto" and scorer.runs_programs()) else 1


def part_bounds(n_prompts: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous [lo, hi) ranges over `n_prompts` prompts, sizes differing by at
    most one, none empty (fewer ranges when there are fewer prompts)."""
    parts = max(1, min(parts, n_prompts))
    q, r = divmod(n_prompts, parts)
    bounds, lo = [], 0
    for k in range(parts):
        hi = lo + q + (k < r)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def generate_and_score(
    gen: Generation,
    prompts: list[Prompt],
    params_for: Callable[[int, int], SamplingParams],
    *,
    step: int,
    parts: int,
    timing: Timing,
) -> list[Part]:
    """Generate `prompts`' groups in `parts` consecutive calls (`params_for(lo, hi)`: the
    sampling of prompts[lo:hi]) and score each; the parts come back in order."""
    engine, tokenizer, scorer = gen.engine, gen.tokenizer, gen.scorer
    bounds = part_bounds(len(prompts), parts)
    caller_state = _thread_state()

    def score(
        rows: list[Prompt], scored: list[str], rollout: Rollout, given, terms
    ) -> tuple[Scores, float]:
        t0 = time.perf_counter()
        with caller_state():
            scores = scorer(rows, scored, rollout, step=step, given=given, given_terms=terms)
        return scores, time.perf_counter() - t0

    pool = ThreadPoolExecutor(1, thread_name_prefix="rlvr-scoring") if len(bounds) > 1 else None
    pending: list[tuple[Part, Future | tuple[Scores, float]]] = []
    with pool or contextlib.nullcontext():
        for lo, hi in bounds:
            t0 = time.perf_counter()
            given = dropped = terms = None  # the agents' rewards, their terms, dropped rollouts
            env: dict[str, float] = {}
            if gen.agents is not None:
                batch = gen.agents.run(prompts[lo:hi], params_for(lo, hi), step)
                rollout, given, dropped, env, terms = (
                    batch.rollout,
                    batch.rewards,
                    batch.dropped,
                    batch.sums,
                    batch.terms,
                )
            else:
                rollout = engine.generate([p.ids for p in prompts[lo:hi]], params_for(lo, hi))
            timing.generation += time.perf_counter() - t0
            rows = [p for p in prompts[lo:hi] for _ in range(rollout.group_size)]
            completions = decode_completions(tokenizer, rollout)  # logged, tool turns included
            scored = decode_completions(tokenizer, rollout, model_only=True)  # the model's text
            args = (rows, scored, rollout, given, terms)
            job = pool.submit(score, *args) if pool else score(*args)
            pending.append((Part(rows, rollout, completions, None, dropped, env), job))  # type: ignore[arg-type]
        out = []
        for part, job in pending:
            t0 = time.perf_counter()
            part.scores, seconds = job.result() if isinstance(job, Future) else job
            timing.wait += time.perf_counter() - t0 if isinstance(job, Future) else seconds
            timing.scoring += seconds
            timing.scored += len(part.rows)
            out.append(part)
    return out
