"""DAPO dynamic sampling (arXiv 2503.14476 §3.2, docs/algorithms.md#dynamic-sampling).

A group whose responses are all right or all wrong has zero advantage and gives no policy
gradient. DAPO over-samples and keeps only groups with 0 < #correct < G, refilling the
batch over several generation batches (all from the same pi_old) until it holds the wanted
number of prompts. Filter on accuracy, not on the shaped reward: length shaping gives an
all-wrong group a non-zero reward std. A run with no notion of correctness (a continuous
reward) filters on the reward's spread instead, as verl's `filter_groups.metric=score`:
a group whose G rewards are all equal has zero advantage and is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from torch import Tensor

GroupT = TypeVar("GroupT")


def keep_groups(correct: Tensor, group_size: int) -> Tensor:
    """(N // G,) bool: True for groups with 0 < #correct < G (DAPO Eq. 11's constraint).

    correct: (N,) bool (or 0/1), groups contiguous. Raises ValueError if N % G != 0 or
    G < 2 (a group of one is always all-right or all-wrong, so nothing could be kept).
    """
    _check_groups(correct, group_size, "correct")
    n_correct = (correct != 0).view(-1, group_size).sum(dim=1)
    return (n_correct > 0) & (n_correct < group_size)


def keep_groups_with_spread(rewards: Tensor, group_size: int) -> Tensor:
    """(N // G,) bool: True for groups whose rewards are not all equal (max > min).

    rewards: (N,) float, groups contiguous. A group of equal rewards has zero advantage
    under every group baseline, so it gives no policy gradient. Raises ValueError as
    `keep_groups` does.
    """
    _check_groups(rewards, group_size, "rewards")
    grouped = rewards.view(-1, group_size)
    return grouped.amax(dim=1) > grouped.amin(dim=1)


def _check_groups(values: Tensor, group_size: int, name: str) -> None:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2:
        raise ValueError(f"group_size must be an int >= 2 for dynamic sampling, got {group_size!r}")
    if values.dim() != 1:
        raise ValueError(f"{name} must be 1-D (N,), got shape {tuple(values.shape)}")
    if values.numel() % group_size != 0:
        raise ValueError(
            f"len({name})={values.numel()} is not a multiple of group_size={group_size}"
        )


REFILL_MARGIN = 1.25


def refill_size(target: int, kept: int, seen: int, margin: float = REFILL_MARGIN) -> int:
    """Prompts to draw for the next generation batch of a step that holds `kept` of its
    `target` groups after `seen` generated: the missing groups divided by the step's keep
    rate so far, times `margin`, rounded up; a whole batch (`target`) when nothing was kept
    yet, and never more.

    verl's DAPO recipe refills with whole batches and discards the surplus: with 12 of 16
    groups kept, a refill of 16 prompts generates ~12 groups to use 4. Here it draws
    ceil(1.25 * 4 * 16 / 12) = 7. Same distribution of kept groups (the first informative ones
    in sampler order); a shortfall costs one more, smaller, refill.
    """
    if kept <= 0 or seen <= 0:
        return target
    missing = target - kept
    if missing <= 0:
        return 0
    return max(1, min(target, math.ceil(margin * missing * seen / kept)))


@dataclass(frozen=True)
class DynamicSamplingResult(Generic[GroupT]):
    """What DynamicSamplingBuffer.pop returns.

    groups: kept group payloads in arrival order, at most target_groups of them.
    num_gen_batches: generation batches spent filling this batch.
    num_groups_seen: groups offered to add() in total (kept or not), so
        1 - num_kept / num_groups_seen is the fraction filtered out.
    num_kept: groups that passed the filter (before truncation).
    complete: len(groups) == target_groups. False when max_gen_batches ran out first.
    num_dropped_surplus: kept groups beyond target_groups that were discarded.
    """

    groups: list[GroupT]
    num_gen_batches: int
    num_groups_seen: int
    num_kept: int
    complete: bool
    num_dropped_surplus: int


class DynamicSamplingBuffer(Generic[GroupT]):
    """Accumulates kept groups over generation batches until a training batch is full.

        buf = DynamicSamplingBuffer(target_groups=prompts_per_step, max_gen_batches=4)
        while not buf.ready:
            groups = generate_and_score(next_prompts())        # one payload per group
            buf.add(groups, keep_groups(correct, group_size))
        result = buf.pop()                                     # then compute advantages

    ready is True once it holds >= target_groups groups, or once max_gen_batches batches
    were added. pop() keeps the first target_groups groups (as verl's DAPO recipe does).

    When the bound is hit with too few groups, pop() returns what it has (possibly none)
    with complete=False; it never raises. DAPO's verl recipe raises instead, which kills
    a long run over one unlucky stretch of too-easy or too-hard prompts; we would rather
    log it and train on a smaller batch (the trainer skips the update when there are no
    groups). A token-level loss normalises by the real token count, so a smaller batch is
    still an unbiased, only noisier, step.

    Payloads are opaque (whatever the trainer stores per group); state_dict() holds them
    as they are, so they must be picklable for a checkpoint (tensors on CPU preferably).
    """

    def __init__(self, target_groups: int, max_gen_batches: int) -> None:
        if not isinstance(target_groups, int) or target_groups < 1:
            raise ValueError(f"target_groups must be an int >= 1, got {target_groups!r}")
        if not isinstance(max_gen_batches, int) or max_gen_batches < 1:
            raise ValueError(f"max_gen_batches must be an int >= 1, got {max_gen_batches!r}")
        self.target_groups = target_groups
        self.max_gen_batches = max_gen_batches
        self._reset()

    def _reset(self) -> None:
        self._groups: list[GroupT] = []
        self._num_gen_batches = 0
        self._num_groups_seen = 0

    def __len__(self) -> int:
        return len(self._groups)

    @property
    def num_gen_batches(self) -> int:
        return self._num_gen_batches

    @property
    def num_groups_seen(self) -> int:
        return self._num_groups_seen

    @property
    def ready(self) -> bool:
        return (
            len(self._groups) >= self.target_groups or self._num_gen_batches >= self.max_gen_batches
        )

    def add(self, groups: Sequence[GroupT], keep: Tensor | Sequence[bool]) -> None:
        """Record one generation batch: append the groups whose keep flag is True.

        Raises RuntimeError if the buffer is already ready (pop() first): adding more
        would spend generation on groups that pop() discards.
        """
        if self.ready:
            raise RuntimeError("buffer is ready; call pop() before adding another batch")
        flags = keep.tolist() if isinstance(keep, Tensor) else list(keep)
        if len(flags) != len(groups):
            raise ValueError(f"{len(groups)} groups but {len(flags)} keep flags")
        self._groups.extend(g for g, k in zip(groups, flags) if k)
        self._num_gen_batches += 1
        self._num_groups_seen += len(flags)

    def pop(self) -> DynamicSamplingResult[GroupT]:
        """Return the batch (at most target_groups groups) and empty the buffer."""
        kept = len(self._groups)
        result = DynamicSamplingResult(
            groups=self._groups[: self.target_groups],
            num_gen_batches=self._num_gen_batches,
            num_groups_seen=self._num_groups_seen,
            num_kept=kept,
            complete=kept >= self.target_groups,
            num_dropped_surplus=max(0, kept - self.target_groups),
        )
        self._reset()
        return result

    def state_dict(self) -> dict[str, Any]:
        """Contents for a checkpoint; payloads are stored as they are (must be picklable)."""
        return {
            "target_groups": self.target_groups,
            "max_gen_batches": self.max_gen_batches,
            "groups": list(self._groups),
            "num_gen_batches": self._num_gen_batches,
            "num_groups_seen": self._num_groups_seen,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the contents. target_groups / max_gen_batches stay this object's (the
        resumed run's config wins); ready and pop() apply them to the restored contents."""
        self._groups = list(state["groups"])
        self._num_gen_batches = int(state["num_gen_batches"])
        self._num_groups_seen = int(state["num_groups_seen"])
