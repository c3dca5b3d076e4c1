"""DAPO dynamic sampling: the group filter and the buffer that refills a batch."""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlvr.algos import DynamicSamplingBuffer, keep_groups, keep_groups_with_spread, refill_size

from .helpers import PROPS, loop_keep_groups


@PROPS
@given(seed=st.integers(0, 2**16), groups=st.integers(1, 8), G=st.integers(2, 6))
def test_keep_groups_matches_loop(seed, groups, G):
    correct = torch.rand(groups * G, generator=torch.Generator().manual_seed(seed)) < 0.5
    got = keep_groups(correct, G)
    assert got.dtype == torch.bool and got.shape == (groups,)
    assert got.tolist() == loop_keep_groups(correct.tolist(), G)


def test_keep_groups_cases():
    correct = torch.tensor([1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 1, 0]).bool()
    # all right, all wrong, 1 of 3, 2 of 3
    assert keep_groups(correct, 3).tolist() == [False, False, True, True]


def test_keep_groups_with_spread_cases():
    # TRL's length reward -|12 - len| / 12: never above 0, so never "correct"; groups of 3
    rewards = torch.tensor([-0.5, -0.5, -0.5,      # all equal: dropped
                            -1.0, -0.25, -0.5,     # spread 0.75: kept
                            0.0, 0.0, -1e-7,       # any difference keeps it
                            2.0, 2.0, 2.0])  # fmt: skip
    assert keep_groups_with_spread(rewards, 3).tolist() == [False, True, True, False]
    # a binary reward: the spread filter keeps exactly the groups the accuracy filter keeps
    binary = torch.tensor([1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 1, 0]).float()
    assert keep_groups_with_spread(binary, 3).tolist() == keep_groups(binary > 0, 3).tolist()
    with pytest.raises(ValueError, match=r"len\(rewards\)=4 is not a multiple of group_size=3"):
        keep_groups_with_spread(torch.zeros(4), 3)


def test_keep_groups_errors():
    with pytest.raises(ValueError, match="group_size must be an int >= 2"):
        keep_groups(torch.ones(4, dtype=torch.bool), 1)
    with pytest.raises(ValueError, match="not a multiple of group_size=3"):
        keep_groups(torch.ones(4, dtype=torch.bool), 3)
    with pytest.raises(ValueError, match="1-D"):
        keep_groups(torch.ones(2, 2, dtype=torch.bool), 2)


def test_buffer_fills_across_batches_and_truncates():
    buf = DynamicSamplingBuffer(target_groups=3, max_gen_batches=5)
    buf.add(["a", "b", "c"], torch.tensor([True, False, False]))
    assert not buf.ready and len(buf) == 1
    buf.add(["d", "e", "f"], [False, True, True])
    assert buf.ready  # 3 groups after 2 batches
    with pytest.raises(RuntimeError, match="call pop"):
        buf.add(["g"], [True])
    res = buf.pop()
    assert res.groups == ["a", "e", "f"]
    assert (res.num_gen_batches, res.num_groups_seen, res.num_kept) == (2, 6, 3)
    assert res.complete and res.num_dropped_surplus == 0
    # reset after pop
    assert len(buf) == 0 and buf.num_gen_batches == 0 and not buf.ready


def test_buffer_drops_surplus_keeping_arrival_order():
    buf = DynamicSamplingBuffer(target_groups=2, max_gen_batches=3)
    buf.add([1, 2, 3, 4], [True, True, False, True])
    res = buf.pop()
    assert res.groups == [1, 2] and res.complete and res.num_dropped_surplus == 1


@pytest.mark.parametrize("kept_per_batch", [0, 1])
def test_bound_returns_partial_batch_without_raising(kept_per_batch):
    buf = DynamicSamplingBuffer(target_groups=4, max_gen_batches=2)
    for _ in range(2):
        assert not buf.ready
        buf.add(["x", "y"], [True] * kept_per_batch + [False] * (2 - kept_per_batch))
    assert buf.ready
    res = buf.pop()
    assert not res.complete
    assert len(res.groups) == 2 * kept_per_batch  # possibly zero groups
    assert res.num_gen_batches == 2 and res.num_dropped_surplus == 0


def test_state_dict_roundtrip():
    buf = DynamicSamplingBuffer(target_groups=3, max_gen_batches=4)
    payload = {"ids": torch.arange(3), "reward": [1.0, 0.0]}
    buf.add([payload, "other"], [True, False])
    state = pickle.loads(pickle.dumps(buf.state_dict()))  # what a checkpoint does
    fresh = DynamicSamplingBuffer(target_groups=3, max_gen_batches=4)
    fresh.load_state_dict(state)
    assert len(fresh) == 1 and fresh.num_gen_batches == 1
    fresh.add(["p", "q"], [True, True])
    res = fresh.pop()
    assert res.groups[0]["ids"].tolist() == [0, 1, 2] and res.groups[1:] == ["p", "q"]
    assert (res.num_gen_batches, res.num_groups_seen) == (2, 4)
    # The restoring object's bounds win (a resumed run may change its config).
    small = DynamicSamplingBuffer(target_groups=1, max_gen_batches=4)
    small.load_state_dict(state)
    assert small.ready


def test_buffer_errors():
    with pytest.raises(ValueError, match="target_groups must be an int >= 1"):
        DynamicSamplingBuffer(0, 1)
    with pytest.raises(ValueError, match="max_gen_batches must be an int >= 1"):
        DynamicSamplingBuffer(1, 0)
    buf = DynamicSamplingBuffer(2, 2)
    with pytest.raises(ValueError, match="2 groups but 3 keep flags"):
        buf.add(["a", "b"], [True, False, True])


def test_refill_size_cases():
    # 12 of 16 kept from 16 seen: 4 missing at keep rate 3/4 -> ceil(1.25 * 4 * 16 / 12) = 7
    assert refill_size(16, kept=12, seen=16) == 7
    assert refill_size(16, kept=15, seen=16) == 2  # ceil(1.25 * 1 * 16 / 15) = ceil(1.33)
    assert refill_size(16, kept=5, seen=32) == 16  # ceil(1.25 * 11 * 32 / 5) = 88: capped
    assert refill_size(16, kept=0, seen=16) == 16  # no keep rate yet: a whole batch
    assert refill_size(16, kept=16, seen=20) == 0  # nothing missing
    assert refill_size(8, kept=6, seen=8, margin=1.0) == 3  # 2 missing at rate 3/4: ceil(2.67)


@PROPS
@given(
    target=st.integers(1, 64), seen=st.integers(1, 200), kept=st.integers(0, 200), data=st.data()
)
def test_refill_size_properties(target, seen, kept, data):
    kept = min(kept, seen, target)
    n = refill_size(target, kept, seen)
    missing = target - kept
    assert 0 <= n <= target
    assert (n == 0) == (missing == 0)
    if 0 < kept < target:  # the expected kept groups cover what is missing (or a whole batch)
        assert n == target or n * kept / seen >= missing
        more = data.draw(st.integers(1, target - kept))  # fewer kept: never a smaller refill
        assert refill_size(target, kept - min(more, kept - 1), seen) >= n
