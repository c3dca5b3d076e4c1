"""KL estimators: loops, k3 >= 0, accuracy for tiny log-ratios, Monte Carlo unbiasedness."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from rlvr.algos import KL_ESTIMATORS, kl_estimate

from .helpers import PROPS, loop_kl


@PROPS
@given(
    seed=st.integers(0, 2**16),
    B=st.integers(1, 4),
    T=st.integers(1, 6),
    kind=st.sampled_from(["k1", "k2", "k3"]),
    spread=st.sampled_from([1e-3, 0.5, 5.0]),
)
def test_matches_loop(seed, B, T, kind, spread):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 5
    ref = logp + spread * torch.randn(B, T, generator=g, dtype=torch.float64)
    got = kl_estimate(logp, ref, kind)
    want = [
        [loop_kl(logp[i, t].item(), ref[i, t].item(), kind) for t in range(T)] for i in range(B)
    ]
    assert got.shape == (B, T)
    assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    if kind in ("k2", "k3"):
        assert (got >= 0).all()


def test_k3_nonnegative_and_zero_only_at_equality():
    x = torch.arange(-3000, 3001, dtype=torch.float64) / 100  # x[3000] == 0 exactly
    k3 = kl_estimate(torch.zeros_like(x), x, "k3")  # x = ref - logp
    assert (k3 >= 0).all()
    assert (k3 == 0).nonzero().flatten().tolist() == [3000]  # x = 0 only


def test_k3_accurate_for_tiny_log_ratios_in_float32():
    # x = 1e-4: k3 = x^2/2 + x^3/6 + ... = 5.0003e-9. Naive exp(x) - 1 - x in float32 is
    # pure rounding noise at this size; expm1(x) - x keeps ~3 significant digits.
    x64 = torch.tensor([1e-4, -1e-4, 3e-3, -2e-2], dtype=torch.float64)
    exact = x64**2 / 2 + x64**3 / 6 + x64**4 / 24 + x64**5 / 120
    got = kl_estimate(torch.zeros(4), x64.float(), "k3")
    assert got.dtype == torch.float32
    assert_close(got.double(), exact, rtol=2e-3, atol=0)


def test_k3_gradient():
    # d k3 / d logp = 1 - exp(ref - logp) = 1 - pi_ref / pi_theta (docs/algorithms.md#kl-penalty)
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.5, -1.0, -0.5], dtype=torch.float64)
    (g,) = torch.autograd.grad(kl_estimate(logp, ref, "k3").sum(), logp)
    assert_close(g, 1 - torch.exp(ref - logp.detach()))


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_monte_carlo_mean_matches_exact_kl(kind):
    # KL(pi || pi_ref) of a 5-way categorical, estimated from float64 samples of pi.
    pi = torch.tensor([0.05, 0.1, 0.2, 0.3, 0.35], dtype=torch.float64)
    pi_ref = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1], dtype=torch.float64)
    exact = float((pi * (pi.log() - pi_ref.log())).sum())  # 0.4238...
    n = 200_000
    idx = torch.multinomial(pi, n, replacement=True, generator=torch.Generator().manual_seed(0))
    est = kl_estimate(pi.log()[idx], pi_ref.log()[idx], kind)
    stderr = float(est.std()) / math.sqrt(n)
    assert abs(float(est.mean()) - exact) < 4 * stderr
    assert stderr < 0.005  # the test is sharp enough to catch a wrong formula


def test_half_precision_is_upcast():
    out = kl_estimate(
        torch.zeros(2, 3, dtype=torch.bfloat16), torch.full((2, 3), -0.5, dtype=torch.bfloat16)
    )
    assert out.dtype == torch.float32


def test_registry_and_errors():
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k4'; valid: \['k1', 'k2', 'k3'\]"):
        kl_estimate(torch.zeros(2), torch.zeros(2), "k4")
    with pytest.raises(ValueError, match="same shape"):
        kl_estimate(torch.zeros(2, 3), torch.zeros(2, 4))
