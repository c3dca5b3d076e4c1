"""value_loss and explained_variance: the hand example, a loop, clipping, masking, errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from rlvr.algos import (
    explained_from_parts,
    explained_variance,
    pooled_explained_variance,
    value_loss,
    variance_parts,
)

from .helpers import PROPS, loop_aggregate, with_garbage

# docs/algorithms.md#ppo: returns of the 4-token GAE example, new values after an update.
V_OLD = [0.5, 0.6, 0.7, 0.8]
RET = [0.93865, 0.967, 0.96, 1.0]
V_NEW = [0.6, 0.95, 0.9, 0.85]


def test_hand_example():
    # clip 0.2: clip(V, V_old +- 0.2) = [0.6, 0.8, 0.9, 0.85] (only token 2 moves)
    #   (V - R)^2      = [0.33865^2, 0.017^2, 0.06^2, 0.15^2] = [0.1146838, 0.000289, 0.0036, 0.0225]
    #   (V_clip - R)^2 = [0.1146838, 0.167^2 = 0.027889, 0.0036, 0.0225]
    #   max            = [0.11468382, 0.027889, 0.0036, 0.0225], sum 0.16867282
    #   L_V = 0.5 * 0.16867282 / 4 = 0.0210841; vf_clipfrac = 1/4
    # float32, where 0.7 + 0.2 rounds to 0.9 and token 3 is not counted as clipped.
    v = torch.tensor([V_NEW], requires_grad=True)
    out = value_loss(v, torch.tensor([V_OLD]), torch.tensor([RET]), torch.ones(1, 4), clip=0.2)
    assert_close(out.loss, torch.tensor(0.0210841), rtol=0, atol=1e-7)
    assert out.metrics["vf_clipfrac"] == 0.25
    assert out.metrics["vf_loss"] == pytest.approx(0.0210841, abs=1e-7)
    assert out.metrics["value_mean"] == pytest.approx(0.825)
    assert out.metrics["num_tokens"] == 4
    # Gradient: the clipped token's term is constant in V (zero gradient); unclipped ones
    # d/dV 0.5 * (V - R)^2 / 4 = (V - R) / 4. (Token 2 sits exactly on the clip bound, where
    # the two terms tie and autograd splits the gradient: not checked.)
    (g,) = torch.autograd.grad(out.loss, v)
    want = [(0.6 - 0.93865) / 4, 0.0, (0.85 - 1.0) / 4]
    assert_close(g[0, [0, 1, 3]], torch.tensor(want), rtol=0, atol=1e-7)
    # Unclipped: 0.5 * (0.1146838 + 0.000289 + 0.0036 + 0.0225) / 4 = 0.0176341
    plain = value_loss(v, torch.tensor([V_OLD]), torch.tensor([RET]), torch.ones(1, 4), clip=None)
    assert_close(plain.loss, torch.tensor(0.01763410), rtol=0, atol=1e-7)
    assert plain.metrics["vf_clipfrac"] == 0.0


def loop_value_terms(v, v_old, ret, mask, clip):
    out = []
    for i in range(len(v)):
        row = []
        for t in range(len(v[i])):
            if not mask[i][t]:
                row.append(0.0)
                continue
            a = (v[i][t] - ret[i][t]) ** 2
            if clip is None:
                row.append(a)
                continue
            vc = min(max(v[i][t], v_old[i][t] - clip), v_old[i][t] + clip)
            row.append(max(a, (vc - ret[i][t]) ** 2))
        out.append(row)
    return out


@PROPS
@given(
    seed=st.integers(0, 2**16),
    B=st.integers(1, 5),
    T=st.integers(1, 7),
    clip=st.sampled_from([None, 0.1, 0.5]),
    agg=st.sampled_from(["token_mean", "sample_mean"]),
)
def test_matches_loop_and_ignores_garbage(seed, B, T, clip, agg):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) > 0.3
    v_old = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = v_old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ret = v_old + torch.randn(B, T, generator=g, dtype=torch.float64)
    out = value_loss(v, v_old, ret, mask, clip=clip, agg=agg)
    terms = loop_value_terms(v.tolist(), v_old.tolist(), ret.tolist(), mask.tolist(), clip)
    want = 0.5 * loop_aggregate(terms, mask.tolist(), agg)
    assert out.loss.item() == pytest.approx(want, rel=1e-12, abs=1e-14)
    garbage = value_loss(
        with_garbage(v, mask, seed), with_garbage(v_old, mask, seed + 1),
        with_garbage(ret, mask, seed + 2), mask, clip=clip, agg=agg,
    )  # fmt: skip
    assert garbage.loss.item() == out.loss.item()
    # Micro-batching with the global token count sums to the whole-batch loss.
    if agg == "token_mean" and B > 1:
        n = int(mask.sum())
        parts = [
            value_loss(v[s], v_old[s], ret[s], mask[s], clip=clip, num_tokens=n).loss
            for s in (slice(0, 1), slice(1, B))
        ]
        assert_close(sum(parts), out.loss, rtol=1e-12, atol=1e-14)


def test_all_masked_and_errors():
    v = torch.randn(2, 3, requires_grad=True)
    out = value_loss(v, torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), clip=0.2)
    assert out.loss.item() == 0.0
    assert (torch.autograd.grad(out.loss, v)[0] == 0).all()
    assert out.metrics == {"vf_loss": 0.0, "vf_clipfrac": 0.0, "value_mean": 0.0, "num_tokens": 0.0}
    with pytest.raises(ValueError, match="clip must be > 0"):
        value_loss(v, v, v, torch.ones(2, 3), clip=0.0)
    with pytest.raises(ValueError, match="agg must be"):
        value_loss(v, v, v, torch.ones(2, 3), clip=0.2, agg="token_sum_norm")
    with pytest.raises(ValueError, match="returns has shape"):
        value_loss(v, v, torch.zeros(2, 4), torch.ones(2, 3), clip=0.2)


def test_explained_variance():
    ret = torch.tensor([[1.0, 2.0, 3.0, 99.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]])
    # Perfect prediction: 1; predicting the mean return (2) everywhere: 0.
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(ret, 2.0), ret, mask) == pytest.approx(0.0)
    # V = [1.5, 2, 2.5]: residuals [-0.5, 0, 0.5], Var = 1/6; Var(R) = 2/3 -> 1 - 1/4 = 0.75
    v = torch.tensor([[1.5, 2.0, 2.5, float("nan")]], dtype=torch.float64)
    assert explained_variance(v, ret, mask) == pytest.approx(0.75)
    # Undefined (constant returns, no tokens): NaN, never a made-up number.
    assert torch.isnan(torch.tensor(explained_variance(ret, torch.ones_like(ret), mask)))
    assert torch.isnan(torch.tensor(explained_variance(ret, ret, torch.zeros(1, 4))))


def test_variance_parts_by_hand_and_pooled_over_steps():
    ret = torch.tensor([[1.0, 2.0, 3.0, 99.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]])
    v = torch.tensor([[1.5, 2.0, 2.5, 7.0]], dtype=torch.float64)
    # n 3, Var(R) = 2/3, residuals [-0.5, 0, 0.5]: Var = 1/6
    n, var_r, var_e = variance_parts(v, ret, mask)
    assert (n, var_r, var_e) == (3.0, pytest.approx(2 / 3), pytest.approx(1 / 6))
    assert explained_from_parts(n, var_r, var_e) == explained_variance(v, ret, mask)
    assert variance_parts(v, ret, torch.zeros(1, 4)) == (0.0, 0.0, 0.0)
    # two steps with the same mean return pool into the EV of their tokens taken together
    g = torch.Generator().manual_seed(0)
    rets, vals = (
        torch.rand(2, 1, 6, generator=g).double(),
        torch.rand(2, 1, 6, generator=g).double(),
    )
    rets[1] += rets[0].mean() - rets[1].mean()
    vals[1] += (rets[1] - vals[1]).mean() - (rets[0] - vals[0]).mean()
    ones = torch.ones(1, 6)
    parts = [variance_parts(vals[k], rets[k], ones) for k in range(2)]
    pooled = 1 - sum(n * e for n, _, e in parts) / sum(n * r for n, r, _ in parts)
    whole = explained_variance(vals.reshape(1, 12), rets.reshape(1, 12), torch.ones(1, 12))
    assert pooled == pytest.approx(whole)


def test_pooled_explained_variance_of_logged_steps():
    # step 1: 10 tokens, Var(R) 0.2, Var(R - V) 0.1; step 2: 30 tokens, 0.02 and 0.03
    # 1 - (10 * 0.1 + 30 * 0.03) / (10 * 0.2 + 30 * 0.02) = 1 - 1.9 / 2.6
    rows = [
        {"critic/tokens": 10, "critic/return_var": 0.2, "critic/error_var": 0.1},
        {"critic/tokens": 30, "critic/return_var": 0.02, "critic/error_var": 0.03},
        {"loss_tokens": 5, "loss": 1.0},  # a step without a critic is not in the window
    ]
    assert pooled_explained_variance(rows) == pytest.approx(1 - 1.9 / 2.6)
    assert math.isnan(pooled_explained_variance(rows[2:]))
