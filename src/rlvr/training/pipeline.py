"""The step's seam (docs/algorithms.md#bounded-staleness): `produce` makes a step's batch,
`consume` (rlvr.training.trainer) trains on it.

    produce:  prompts, G responses each, rewards, dynamic sampling; the behaviour log-probs
              the engine sampled with (`Sample.sampling_log_probs`) and the policy version
              that sampled (`Sample.version`: the steps trained before the rollout)
    consume:  old and reference log-probs, advantages, critic, update

A synchronous run (train.max_staleness = 0) is consume(produce(step)). Under
max_staleness = k the `Pipeline` keeps the batches of steps t+1 .. t+k, produced ahead:
at step t it produces the batch of step t+k with the weights of version t-1 (the first
iteration produces steps 1 .. k+1 from the initial weights), then consumes step t's, sampled
at version t-1-k or later. Staleness, the trainer's version t-1 minus the sample's, is at
most k by construction; `check_staleness` refuses a batch beyond it rather than train on it
(no schedule makes one: it could only come from an edited checkpoint). Nothing is dropped:
dynamic sampling filters inside `produce`, where every sample of a batch has one version.

For an engine that reports no log-probs of its own (`reports_log_probs` false: hf), under
staleness `produce` computes mu with a no-grad forward of the weights that sampled (one extra
forward per batch, as pi_old's).
The fast and hf engines keep sampling on the live module: the delay is in which batch is
trained, not in a second copy of the weights, so the memory cost is k batches of token ids and
log-probs (a few MB at most), not a model. The batches ahead are part of the trainer state
(`state`, plain lists, numbers and tensors: loaded with weights_only=True), so a resumed run
trains on the very samples an uninterrupted one would. `produce` runs all its collectives
(collect's gathers and sums) before `consume` starts any, on the one process group.

With an engine that samples apart from the trainer's weights (`pins_weights`: vLLM servers,
rollout.vllm.mode=server) the batch of step t+k is produced on a thread beside step t's
update instead of before it: the servers sample with the pinned weights of version t-1 while
the trainer computes version t, and `settle`, after the update, waits for it. The schedule (which version samples which step) is the same, so the
batches are too; only the wall clock differs. Each batch carries the wall-clock times its
production started and ended (`time/gen_start`, `time/gen_end`), and `settle` reports the
time the trainer waited for the batch (`time/gen_wait`) or the batch for the trainer
(`time/train_wait`).

Under `train.inflight_updates` the run's pipeline is `rlvr.training.inflight.Inflight` instead
(same `next`, `settle`, `state`): generation never stops and a step takes the first groups to
complete, each token with its own version.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

import torch

from rlvr.models import autocast
from rlvr.rewards.sandbox.liveness import during
from rlvr.run.distributed import Dist, gathered
from rlvr.training.batch import Batch, Sample
from rlvr.training.collect import Collecting, collect
from rlvr.training.policy import Policy
from rlvr.training.settings import UpdateContext, UpdateSettings
from rlvr.training.update import batch_log_probs


class Run(Collecting, Protocol):
    """The parts of a run (`rlvr.training.setup.Run`, built once) that producing a step's
    batch reads: the producer depends on these, not on how the run is set up. Beside what
    collection reads: the device, the policy, the batches produced ahead (`pipeline`), the
    update's settings (the forward's precision) and the step's `UpdateContext` (the behaviour
    log-probs of an engine that reports none)."""

    device: torch.device
    policy: Policy
    pipeline: Pipeline
    update_settings: UpdateSettings

    def step_context(self) -> UpdateContext: ...


@dataclass(frozen=True)
class Produced:
    """One step's batch as the producer made it: this rank's kept groups with their rewards,
    behaviour log-probs and version, the collection's metrics and logged examples, and the
    seconds it took (a step's time/step counts them)."""

    step: int  # the step that trains on it
    version: int  # the policy version that sampled it
    batch: Batch
    metrics: dict[str, float]
    examples: list[dict]
    seconds: float
    started: float = 0.0  # wall clock (time.time()) when its production began
    ended: float = 0.0

    def state(self) -> dict[str, Any]:
        """Plain values and tensors only, for the checkpoint's trainer state."""
        samples = [{f.name: getattr(s, f.name) for f in fields(Sample)} for s in self.batch.samples]
        return {
            "step": self.step,
            "version": self.version,
            "num_groups": self.batch.num_groups,
            "samples": samples,
            "metrics": dict(self.metrics),
            "examples": list(self.examples),
            "seconds": self.seconds,
            "started": self.started,
            "ended": self.ended,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Produced:
        batch = Batch([Sample(**s) for s in state["samples"]], state["num_groups"])
        return cls(
            state["step"], state["version"], batch, dict(state["metrics"]),
            list(state["examples"]), state["seconds"], state.get("started", 0.0),
            state.get("ended", 0.0),
        )  # fmt: skip


def produce(step: int, run: Run, version: int) -> Produced:
    """Step `step`'s batch, sampled by the current weights, which are policy `version`."""
    model, precision = run.policy.model, run.update_settings.autocast
    t_start, started = time.perf_counter(), time.time()
    # FSDP2: whole weights for the rollout (else a no-op); bf16 sampling when asked; a helper
    # process lost meanwhile (a reward's worker) is named with the step
    with gathered(model), autocast(precision, run.device), during(f"step {step}'s batch"):
        got = collect(step, run)
        run.engine.release()  # vllm sleeps through the update
        batch = got.batch
        if run.pipeline.k and not run.engine.reports_log_probs:
            batch = behaviour_log_probs(batch, run)  # from the weights that sampled
    batch = replace(batch, samples=[replace(s, version=version) for s in batch.samples])
    seconds = time.perf_counter() - t_start
    return Produced(step, version, batch, got.metrics, got.examples, seconds, started, time.time())


def behaviour_log_probs(batch: Batch, run: Run) -> Batch:
    """`batch` with each sample's `sampling_log_probs` from a no-grad forward of the current
    weights (those that sampled it, before any update), for an engine that reports none
    (hf): the behaviour policy mu that a stale sample's correction needs."""
    if not len(batch):
        return batch
    lp = batch_log_probs(run.policy.model, batch, run.step_context())
    rows = [replace(s, sampling_log_probs=lp[i, : len(s.completion_ids)].clone())
            for i, s in enumerate(batch.samples)]  # fmt: skip
    return replace(batch, samples=rows)


class StaleBatchError(RuntimeError):
    """A batch older than train.max_staleness reached the update: it is not trained on."""


def check_staleness(batch: Batch, version: int, bound: int) -> list[int]:
    """Each sample's staleness (trainer `version` minus its own); StaleBatchError naming the
    bound when any exceeds it."""
    lags = [version - s.version for s in batch.samples]
    if any(lag > bound or lag < 0 for lag in lags):
        raise StaleBatchError(
            f"train.max_staleness: a batch with samples {max(lags)} versions behind (or ahead: "
            f"{min(lags)}) reached the update at version {version}, bound {bound}; not trained on"
        )
    return lags


def staleness_metrics(lags: list[int], d: Dist) -> dict[str, float]:
    """staleness/mean and staleness/max over the samples trained on (all ranks)."""
    total, n = d.sum([float(sum(lags)), float(len(lags))])
    return {
        "staleness/mean": total / max(n, 1.0),
        "staleness/max": d.max(float(max(lags, default=0))),
    }


class Pipeline:
    """The batches produced ahead under train.max_staleness = k (the module docstring)."""

    def __init__(self, k: int, queue: list[Produced] | None = None, max_steps: int = 0):
        self.k = k
        self.max_steps = max_steps  # train.max_steps: no batch is produced past it
        self.queue: deque[Produced] = deque(queue or ())
        self._beside: Beside | None = None

    def next(self, step: int, run: Run) -> Produced | None:
        """Step `step`'s batch (None when k = 0: the step produces its own), after producing
        the batches up to step + k (within train.max_steps) with the current weights,
        version step - 1; with an engine that pins weights, the last of them on a thread
        beside the update (`settle` waits for it)."""
        if self.k == 0:
            return None
        last = self.queue[-1].step if self.queue else step - 1
        todo = list(range(last + 1, min(step + self.k, self.max_steps) + 1))
        # an engine that pins weights (vLLM servers): the last batch ahead is generated
        # beside this step's update
        beside = todo.pop() if todo and todo[-1] > step and run.engine.pins_weights else None
        for ahead in todo:
            self.queue.append(produce(ahead, run, version=step - 1))
        if beside is not None:
            if self._beside is not None:
                raise RuntimeError(f"pipeline: step {step} began before the last one settled")
            self._beside = Beside(beside, run, version=step - 1)
        got = self.queue.popleft()
        if got.step != step:
            raise RuntimeError(f"pipeline: the batch of step {got.step} came up at step {step}")
        return got

    def settle(self) -> dict[str, float]:
        """After the step's update: the batch produced beside it joins the queue. Returns
        the seconds the trainer then waited for it (`time/gen_wait`) or it had waited for the
        trainer (`time/train_wait`); nothing when no batch was produced beside the update."""
        if self._beside is None:
            return {}
        beside, self._beside = self._beside, None
        got, waited = beside.join()
        self.queue.append(got)
        return {"time/gen_wait": max(waited, 0.0), "time/train_wait": max(-waited, 0.0)}

    def state(self) -> list[dict[str, Any]]:
        return [p.state() for p in self.queue]

    @classmethod
    def from_state(cls, k: int, state: list[dict[str, Any]] | None, max_steps: int) -> Pipeline:
        return cls(k, [Produced.from_state(p) for p in state or ()], max_steps)


class Beside:
    """`produce(step, run, version)` on a thread, with the servers' weights pinned to
    `version` until it is joined (the trainer updates its own meanwhile)."""

    def __init__(self, step: int, run: Run, version: int):
        self._pin = run.engine.pinned()
        self._pin.__enter__()  # the server receives version `version` now, in this thread
        self._box: dict[str, Any] = {}
        self._thread = threading.Thread(
            target=self._work, args=(step, run, version), name=f"rlvr-produce-{step}", daemon=True
        )
        self._thread.start()

    def _work(self, step: int, run: Run, version: int) -> None:
        try:
            self._box["got"] = produce(step, run, version)
        except BaseException as e:  # raised in the trainer's thread by join
            self._box["error"] = e
        self._box["done"] = time.time()

    def join(self) -> tuple[Produced, float]:
        """The batch, and how long this call waited for it (negative: how long it had been
        ready)."""
        called = time.time()
        self._thread.join()
        self._pin.__exit__(None, None, None)
        if "error" in self._box:
            raise self._box["error"]
        return self._box["got"], self._box["done"] - called
