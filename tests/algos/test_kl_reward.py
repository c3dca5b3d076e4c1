"""The per-token PPO reward, the KL controllers, and REINFORCE++ advantages against loops."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from rlvr.algos import (
    ADVANTAGES,
    AdaptiveKLController,
    AdvantageInputs,
    FixedKLController,
    kl_penalized_rewards,
    last_valid_index,
)

from .helpers import PROPS, loop_kl, with_garbage


def test_hand_example():
    # docs/algorithms.md#ppo: beta 0.1, k1 = logp - ref = [0.1, -0.2, 0.3, 0.0], score 1.0
    # -> r = -0.1 * kl + [0, 0, 0, 1] = [-0.01, 0.02, -0.03, 1.0]. A second row of length 2
    # with score -1 and kl [0.5, 0.0]: r = [-0.05, -1.0].
    ref = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, 0.0, 0.0]], dtype=torch.float64)
    kl = torch.tensor([[0.1, -0.2, 0.3, 0.0], [0.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
    logp = ref + kl
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    r, got_kl = kl_penalized_rewards(
        torch.tensor([1.0, -1.0]), mask, log_probs=with_garbage(logp, mask.bool(), 0),
        ref_log_probs=ref, kl_coef=0.1,
    )  # fmt: skip
    want = [[-0.01, 0.02, -0.03, 1.0], [-0.05, -1.0, 0.0, 0.0]]
    assert_close(r, torch.tensor(want, dtype=torch.float64))
    assert_close(got_kl, kl * mask)


@PROPS
@given(
    seed=st.integers(0, 2**16),
    B=st.integers(1, 6),
    T=st.integers(1, 8),
    kind=st.sampled_from(["k1", "k2", "k3"]),
    beta=st.sampled_from([0.0, 0.05, 1.0]),
)
def test_matches_loop(seed, B, T, kind, beta):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) > 0.3  # holes: the score goes on the last valid token
    scores = torch.randn(B, generator=g, dtype=torch.float64)
    ref = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = ref + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    r, _ = kl_penalized_rewards(
        scores, mask, log_probs=logp, ref_log_probs=ref, kl_coef=beta, kl_kind=kind
    )
    for i in range(B):
        valid = [t for t in range(T) if mask[i, t]]
        assert last_valid_index(mask)[i].item() == (valid[-1] if valid else -1)
        for t in range(T):
            want = 0.0
            if mask[i, t]:
                want = -beta * loop_kl(logp[i, t].item(), ref[i, t].item(), kind)
                if t == valid[-1]:
                    want += scores[i].item()
            assert r[i, t].item() == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_without_reference_and_errors():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    r, kl = kl_penalized_rewards(torch.tensor([2.0, 5.0]), mask)
    # The empty row has no token to carry its score.
    assert r.tolist() == [[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]
    assert (kl == 0).all()
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="both log_probs and ref_log_probs"):
        kl_penalized_rewards(torch.zeros(2), mask, log_probs=x)
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        kl_penalized_rewards(torch.zeros(2), mask, kl_coef=-1.0)
    with pytest.raises(ValueError, match="unknown kl_kind"):
        kl_penalized_rewards(torch.zeros(2), mask, kl_kind="k4")
    with pytest.raises(ValueError, match="non-finite score at index \\[1\\]"):
        kl_penalized_rewards(torch.tensor([0.0, float("nan")]), mask)
    with pytest.raises(ValueError, match="scores has shape"):
        kl_penalized_rewards(torch.zeros(3), mask)


def test_adaptive_controller_by_hand():
    c = AdaptiveKLController(value=0.1, target=6.0, horizon=10000)
    # KL 9: e = 9/6 - 1 = 0.5 -> clipped to 0.2; beta = 0.1 * (1 + 0.2 * 256/10000) = 0.1005120
    c.update(9.0, 256)
    assert c.value == pytest.approx(0.1 * 1.00512, rel=1e-15)
    # KL 4.5: e = -0.25 -> -0.2; beta *= 1 - 0.2 * 500/10000 = 0.99
    c.update(4.5, 500)
    assert c.value == pytest.approx(0.1 * 1.00512 * 0.99, rel=1e-15)
    # KL 6.6: e = 0.1 (inside the clip); beta *= 1 + 0.1 * 1000/10000 = 1.01
    c.update(6.6, 1000)
    assert c.value == pytest.approx(0.1 * 1.00512 * 0.99 * 1.01, rel=1e-12)
    # On target: unchanged. State round-trips (resume).
    before = c.value
    c.update(6.0, 1000)
    assert c.value == before
    d = AdaptiveKLController(value=1.0, target=6.0, horizon=10000)
    d.load_state_dict(c.state_dict())
    assert d.value == c.value
    with pytest.raises(ValueError, match="target > 0"):
        AdaptiveKLController(value=0.1, target=0.0, horizon=10)


def test_fixed_controller():
    c = FixedKLController(0.05)
    c.update(100.0, 64)
    assert c.value == 0.05
    c.load_state_dict({"value": 0.2})
    assert c.value == 0.2


def loop_reinforce_pp(rewards, mask, gamma):
    """Discounted returns over valid tokens, then (G - mean) / sqrt(population var + 1e-8)
    over every valid token of the batch (OpenRLHF's REINFORCE++)."""
    returns = []
    for i in range(len(rewards)):
        row, g = [0.0] * len(rewards[i]), 0.0
        for t in reversed(range(len(rewards[i]))):
            if mask[i][t]:
                g = rewards[i][t] + gamma * g
                row[t] = g
        returns.append(row)
    vals = [returns[i][t] for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t]]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / len(vals)
    return [
        [
            (returns[i][t] - mean) / math.sqrt(var + 1e-8) if mask[i][t] else 0.0
            for t in range(len(mask[i]))
        ]
        for i in range(len(mask))
    ]


@PROPS
@given(seed=st.integers(0, 2**16), B=st.integers(2, 6), T=st.integers(1, 8),
       gamma=st.sampled_from([1.0, 0.9]))  # fmt: skip
def test_reinforce_pp_matches_loop(seed, B, T, gamma):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    x = AdvantageInputs(rewards=torch.zeros(B), token_rewards=r, response_mask=mask, gamma=gamma)
    got = ADVANTAGES["reinforce_pp"](x)
    want = loop_reinforce_pp(r.tolist(), mask.tolist(), gamma)
    assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-9, atol=1e-9)
