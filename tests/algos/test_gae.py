"""GAE, discounted returns and masked whitening: plain loops, the 4-token hand example,
ragged and holey masks, garbage at masked positions, distributed-style global sums."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from rlvr.algos import discounted_returns, gae, masked_moments, masked_whiten

from .helpers import PROPS, with_garbage


def loop_gae(rewards, values, mask, gamma, lam):
    """Per row, over its valid tokens only, backwards (docs/algorithms.md#ppo)."""
    adv = [[0.0] * len(r) for r in rewards]
    ret = [[0.0] * len(r) for r in rewards]
    for i in range(len(rewards)):
        idx = [t for t in range(len(mask[i])) if mask[i][t]]
        next_v, next_a = 0.0, 0.0
        for t in reversed(idx):
            delta = rewards[i][t] + gamma * next_v - values[i][t]
            a = delta + gamma * lam * next_a
            adv[i][t], ret[i][t] = a, a + values[i][t]
            next_v, next_a = values[i][t], a
    return adv, ret


def loop_returns(rewards, mask, gamma):
    out = [[0.0] * len(r) for r in rewards]
    for i in range(len(rewards)):
        g = 0.0
        for t in reversed([t for t in range(len(mask[i])) if mask[i][t]]):
            g = rewards[i][t] + gamma * g
            out[i][t] = g
    return out


def _batch(seed, B, T, holes):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    if holes:  # masked tokens inside a response (tool output, filtered tokens)
        mask &= torch.rand(B, T, generator=g) > 0.3
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    return r, v, mask


@PROPS
@given(
    seed=st.integers(0, 2**16),
    B=st.integers(1, 6),
    T=st.integers(1, 9),
    gamma=st.sampled_from([1.0, 0.99, 0.5, 0.0]),
    lam=st.sampled_from([1.0, 0.95, 0.5, 0.0]),
    holes=st.booleans(),
)
def test_gae_matches_loop(seed, B, T, gamma, lam, holes):
    r, v, mask = _batch(seed, B, T, holes)
    adv, ret = gae(r, v, mask, gamma=gamma, lam=lam)
    want_a, want_r = loop_gae(r.tolist(), v.tolist(), mask.tolist(), gamma, lam)
    assert adv.shape == ret.shape == (B, T)
    assert_close(adv, torch.tensor(want_a, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert_close(ret, torch.tensor(want_r, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    # Garbage at masked positions changes nothing.
    adv2, ret2 = gae(with_garbage(r, mask, seed), with_garbage(v, mask, seed + 1), mask,
                     gamma=gamma, lam=lam)  # fmt: skip
    assert_close(adv2, adv, rtol=0, atol=0)
    assert_close(ret2, ret, rtol=0, atol=0)
    # lam = 1, values 0: GAE is the discounted return.
    a1, _ = gae(r, torch.zeros_like(v), mask, gamma=gamma, lam=1.0)
    assert_close(a1, discounted_returns(r, mask, gamma=gamma), rtol=1e-12, atol=1e-12)


@PROPS
@given(seed=st.integers(0, 2**16), B=st.integers(1, 6), T=st.integers(1, 9),
       gamma=st.sampled_from([1.0, 0.9, 0.0]), holes=st.booleans())  # fmt: skip
def test_discounted_returns_match_loop(seed, B, T, gamma, holes):
    r, _, mask = _batch(seed, B, T, holes)
    want = torch.tensor(loop_returns(r.tolist(), mask.tolist(), gamma), dtype=torch.float64)
    assert_close(discounted_returns(r, mask, gamma=gamma), want, rtol=1e-12, atol=1e-12)


def test_gae_hand_example():
    # docs/algorithms.md#ppo: beta 0.1, k1 KL [0.1, -0.2, 0.3, 0.0], score 1.0 on the last
    # token -> r = [-0.01, 0.02, -0.03, 1.0]; V = [0.5, 0.6, 0.7, 0.8]; gamma 1, lam 0.95.
    #   t=3: delta = 1.0 - 0.8 = 0.2                       A = 0.2
    #   t=2: delta = -0.03 + 0.8 - 0.7 = 0.07              A = 0.07 + 0.95 * 0.2   = 0.26
    #   t=1: delta = 0.02 + 0.7 - 0.6 = 0.12               A = 0.12 + 0.95 * 0.26  = 0.367
    #   t=0: delta = -0.01 + 0.6 - 0.5 = 0.09              A = 0.09 + 0.95 * 0.367 = 0.43865
    # R = A + V. A fifth, padded position holds garbage and stays 0.
    r = torch.tensor([[-0.01, 0.02, -0.03, 1.0, float("nan")]], dtype=torch.float64)
    v = torch.tensor([[0.5, 0.6, 0.7, 0.8, 1e30]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    adv, ret = gae(r, v, mask, gamma=1.0, lam=0.95)
    assert_close(adv, torch.tensor([[0.43865, 0.367, 0.26, 0.2, 0.0]], dtype=torch.float64))
    assert_close(ret, torch.tensor([[0.93865, 0.967, 0.96, 1.0, 0.0]], dtype=torch.float64))
    # lam = 0: the one-step TD errors; gamma = 0.5, lam = 1: discounted sum minus V.
    a0, _ = gae(r, v, mask, gamma=1.0, lam=0.0)
    assert_close(a0[0, :4], torch.tensor([0.09, 0.12, 0.07, 0.2], dtype=torch.float64))
    a_half, _ = gae(r, v, mask, gamma=0.5, lam=1.0)
    # G_3 = 1; G_2 = -0.03 + 0.5 = 0.47; G_1 = 0.02 + 0.235 = 0.255; G_0 = -0.01 + 0.1275
    want = torch.tensor([0.1175 - 0.5, 0.255 - 0.6, 0.47 - 0.7, 1.0 - 0.8], dtype=torch.float64)
    assert_close(a_half[0, :4], want)


def test_gae_gradient_free_and_dtypes():
    r = torch.randn(2, 3, dtype=torch.bfloat16)
    adv, ret = gae(r, torch.zeros(2, 3, dtype=torch.bfloat16), torch.ones(2, 3), gamma=1, lam=1)
    assert adv.dtype == ret.dtype == torch.float32  # half precision computed in fp32
    with pytest.raises(ValueError, match="gamma and lam in"):
        gae(r, r, torch.ones(2, 3), gamma=1.1, lam=0.9)
    with pytest.raises(ValueError, match="values has shape"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), gamma=1, lam=1)


@PROPS
@given(seed=st.integers(0, 2**16), B=st.integers(1, 6), T=st.integers(1, 9),
       unbiased=st.booleans(), shift=st.booleans())  # fmt: skip
def test_masked_whiten_matches_loop(seed, B, T, unbiased, shift):
    x, _, mask = _batch(seed, B, T, holes=True)
    vals = [x[i, t].item() for i in range(B) for t in range(T) if mask[i, t]]
    out = masked_whiten(with_garbage(x, mask, seed), mask, shift, unbiased=unbiased)
    n = len(vals)
    mean = sum(vals) / n if n else 0.0
    dof = n - 1 if unbiased else n
    var = sum((v - mean) ** 2 for v in vals) / dof if dof > 0 else 0.0
    want = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        for t in range(T):
            if mask[i, t] and var > 0:
                want[i, t] = (x[i, t].item() - mean) / math.sqrt(var + 1e-8) + (
                    0 if shift else mean
                )
            elif mask[i, t] and not shift:
                want[i, t] = (x[i, t].item() - mean) / math.sqrt(1e-8) + mean
    assert_close(out, want, rtol=1e-10, atol=1e-10)
    if n >= 2 and var > 1e-3 and shift:  # whitened: mean 0, variance ~1 over valid tokens
        sel = out[mask]
        assert abs(float(sel.mean())) < 1e-9
        assert abs(float(sel.var(correction=1 if unbiased else 0)) - 1) < 1e-6


def test_whiten_hand_example_and_constant_input():
    # [1, 2, 3, 6]: mean 3, unbiased variance (4 + 1 + 0 + 9) / 3 = 14/3.
    x = torch.tensor([[1.0, 2.0, 0.0], [3.0, 6.0, 0.0]], dtype=torch.float64)
    m = torch.tensor([[1, 1, 0], [1, 1, 0]])
    sd = math.sqrt(14 / 3 + 1e-8)
    want = torch.tensor([[-2 / sd, -1 / sd, 0], [0, 3 / sd, 0]], dtype=torch.float64)
    assert_close(masked_whiten(x, m), want)
    # Equal valid values (and a single one): 0, not rounding noise magnified by 1/sqrt(eps).
    c = torch.full((2, 3), 0.1)
    assert (masked_whiten(c, torch.ones(2, 3)) == 0).all()
    assert (masked_whiten(c, torch.tensor([[1, 0, 0], [0, 0, 0]])) == 0).all()
    assert (masked_whiten(c, torch.zeros(2, 3)) == 0).all()


def test_global_sum_gives_whole_batch_statistics():
    # Two "ranks" each hold half of the batch; a global sum that adds the other half's
    # partial sums gives each half exactly its slice of the whole batch's whitening.
    x, _, mask = _batch(7, 6, 5, holes=True)
    whole = masked_whiten(x, mask)
    halves = [(x[:3], mask[:3]), (x[3:], mask[3:])]

    def partials(i):
        # Record each rank's partial sums in order, then replay them as an all-reduce.
        out = []

        def s(vals):
            out.append(vals)
            return vals

        masked_moments(halves[i][0], halves[i][1], global_sum=s)
        return out

    p0, p1 = partials(0), partials(1)
    for i, (xi, mi) in enumerate(halves):
        k = iter(range(2))

        def all_reduce(vals, i=i, k=k):
            j = next(k)
            if j == 0:
                return [a + b for a, b in zip(p0[0], p1[0])]
            # the second reduction depends on the global mean: recompute both halves with it
            mean = (p0[0][0] + p1[0][0]) / (p0[0][1] + p1[0][1])
            ss = sum(
                float(torch.where(mm, xx - mean, torch.zeros(())).square().sum())
                for xx, mm in halves
            )
            return [ss]

        got = masked_whiten(xi, mi, global_sum=all_reduce)
        assert_close(got, whole[3 * i : 3 * i + 3], rtol=1e-12, atol=1e-12)
