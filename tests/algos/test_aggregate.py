"""Aggregations: loops, masked garbage, micro-batch invariance, empty batches, errors."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from rlvr.algos import AGGREGATIONS, aggregate

from .helpers import PROPS, loop_aggregate, random_batch, with_garbage

MODES = ["sample_mean", "token_mean", "token_sum_norm"]
NORM = 7.0  # a generation budget for token_sum_norm


def _kw(mode):
    return {"norm_constant": NORM} if mode == "token_sum_norm" else {}


shapes = st.tuples(st.integers(1, 6), st.integers(1, 7))


@PROPS
@given(seed=st.integers(0, 2**16), shape=shapes, mode=st.sampled_from(MODES))
def test_matches_loop(seed, shape, mode):
    B, T = shape
    x, _, _, _, mask = random_batch(seed, B, T)
    got = aggregate(x, mask, mode, **_kw(mode))
    want = loop_aggregate(x.tolist(), mask.tolist(), mode, norm_constant=NORM)
    assert got.shape == ()
    assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-14)


@PROPS
@given(seed=st.integers(0, 2**16), shape=shapes, mode=st.sampled_from(MODES))
def test_garbage_at_masked_positions_changes_nothing(seed, shape, mode):
    B, T = shape
    x, _, _, _, mask = random_batch(seed, B, T)
    clean = x.clone().requires_grad_()
    dirty = with_garbage(x, mask, seed).requires_grad_()
    (g_clean,) = torch.autograd.grad(aggregate(clean, mask, mode, **_kw(mode)), clean)
    loss = aggregate(dirty, mask, mode, **_kw(mode))
    (g_dirty,) = torch.autograd.grad(loss, dirty)
    assert_close(loss, aggregate(x, mask, mode, **_kw(mode)), rtol=0, atol=0)
    assert_close(g_dirty, g_clean, rtol=0, atol=0)
    assert (g_dirty[~mask] == 0).all()


@PROPS
@given(
    seed=st.integers(0, 2**16),
    shape=st.tuples(st.integers(2, 8), st.integers(1, 7)),
    mode=st.sampled_from(MODES),
    data=st.data(),
)
def test_micro_batches_with_global_counts_sum_to_whole_batch(seed, shape, mode, data):
    B, T = shape
    x, _, _, _, mask = random_batch(seed, B, T)
    # Arbitrary contiguous split points, micro-batches of uneven size.
    cuts = sorted(data.draw(st.sets(st.integers(1, B - 1), max_size=B - 1)))
    bounds = [0, *cuts, B]
    whole = x.clone().requires_grad_()
    full = aggregate(whole, mask, mode, **_kw(mode))
    (g_full,) = torch.autograd.grad(full, whole)
    counts = {"num_tokens": int(mask.sum()), "num_sequences": B}
    parts = x.clone().requires_grad_()
    total = sum(
        aggregate(parts[a:b], mask[a:b], mode, **counts, **_kw(mode))
        for a, b in itertools.pairwise(bounds)
    )
    total.backward()
    assert_close(total, full, rtol=1e-12, atol=1e-14)
    assert_close(parts.grad, g_full, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("counts", [{}, {"num_tokens": 0, "num_sequences": 0}])
def test_all_masked_batch_gives_zero_loss_and_zero_grad(mode, counts):
    mask = torch.zeros(3, 4, dtype=torch.bool)
    x = torch.full((3, 4), float("nan")).requires_grad_()
    loss = aggregate(x, mask, mode, **counts, **_kw(mode))
    loss.backward()
    assert loss.item() == 0.0
    assert (x.grad == 0).all()


def test_empty_rows_count_in_sample_mean():
    # GRPO's mean over responses counts an all-masked row as 0 (num_sequences defaults to B).
    x = torch.tensor([[2.0, 4.0], [9.0, 9.0]])
    mask = torch.tensor([[True, True], [False, False]])
    assert aggregate(x, mask, "sample_mean").item() == 1.5  # (3 + 0) / 2
    assert aggregate(x, mask, "sample_mean", num_sequences=1).item() == 3.0


def test_numeric_mask_and_tensor_counts():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # token_mean: (1 + 2 + 4) / 3
    assert aggregate(x, mask, "token_mean").item() == pytest.approx(7 / 3)
    assert aggregate(
        x, mask.float(), "token_mean", num_tokens=torch.tensor(7)
    ).item() == pytest.approx(1.0)
    # token_sum_norm: (1 + 2 + 4) / (budget 2 * 2 sequences)
    assert aggregate(x, mask, "token_sum_norm", norm_constant=2.0).item() == pytest.approx(7 / 4)
    # sample_mean: (1.5 + 4) / 2
    assert aggregate(x, mask, "sample_mean").item() == pytest.approx(2.75)


def test_registry_and_errors():
    assert set(AGGREGATIONS) == set(MODES)
    x, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"unknown aggregation 'mean'; valid: \['sample_mean'"):
        aggregate(x, mask, "mean")
    with pytest.raises(ValueError, match="token_sum_norm needs norm_constant"):
        aggregate(x, mask, "token_sum_norm")
    with pytest.raises(ValueError, match="norm_constant must be > 0"):
        aggregate(x, mask, "token_sum_norm", norm_constant=0.0)
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        aggregate(x, mask, "token_mean", num_tokens=-1)
    with pytest.raises(TypeError, match="num_sequences must be a number"):
        aggregate(x, mask, "sample_mean", num_sequences=torch.ones(2))
    with pytest.raises(ValueError, match=r"must both be \(B, T\)"):
        aggregate(x, mask[:, :2], "token_mean")
