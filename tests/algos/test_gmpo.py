"""GMPO (rlvr.algos.gmpo): a hand-computed case, the geometric mean's properties, a plain loop
on random ragged inputs, micro-batch splits, rollout weights, and the settings it refuses."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlvr.algos.objectives import OBJECTIVES, LossInputs, LossSettings

from .helpers import PROPS

GMPO = OBJECTIVES["gmpo"].fn
CLIP = OBJECTIVES["clip"].fn
F64 = torch.float64


def _inputs(logp, old, adv, mask, **kw):
    return LossInputs(log_probs=logp, old_log_probs=old, advantages=adv, response_mask=mask, **kw)


def test_hand_computed():
    """Bounds +-0.4 on the log-ratio. Row 0: A = 1, x = 0.5, -0.1: the upper bound cuts the
    first, l = 0.4, -0.1, R0 = exp(0.15) = 1.161834. Row 1: A = -1, x = -0.6, 0.2, 0: the lower
    bound cuts the first, l = -0.4, 0.2, 0, R1 = exp(-0.2 / 3) = 0.935507. Row 2 masked, NaN.
        loss = (-R0 + R1) / 2 = -0.113164
    d loss / d logp: the cut tokens 0; row 0's other -R0 / 2 / 2 = -0.290459; row 1's others
    R1 / 3 / 2 = 0.155918."""
    nan = float("nan")
    logp = torch.tensor([[0.5, -0.1, 0.0], [-0.6, 0.2, 0.0], [nan, nan, nan]], dtype=F64)
    logp = (logp - 1.0).requires_grad_(True)
    old = torch.tensor([[-1.0, -1.0, nan], [-1.0, -1.0, -1.0], [nan, 0.0, nan]], dtype=F64)
    adv = torch.tensor([1.0, -1.0, nan], dtype=F64)
    mask = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])
    s = LossSettings(clip_low=0.4, clip_high=0.4, agg="sample_mean")
    out = GMPO(_inputs(logp, old, adv, mask, num_sequences=2), s)
    r0, r1 = math.exp(0.15), math.exp(-0.2 / 3)
    assert out.loss.item() == pytest.approx((r1 - r0) / 2, rel=1e-12)
    assert (r1 - r0) / 2 == pytest.approx(-0.113164, abs=1e-6)
    out.loss.backward()
    want = [[0.0, -r0 / 4, 0.0], [0.0, r1 / 6, r1 / 6], [0.0, 0.0, 0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(want, dtype=F64))
    assert (-r0 / 4, r1 / 6) == pytest.approx((-0.290459, 0.155918), abs=1e-6)
    m = out.metrics
    assert m["clip_frac_high"] == pytest.approx(1 / 5) and m["clip_frac_low"] == pytest.approx(
        1 / 5
    )
    assert m["ratio_mean"] == pytest.approx((2 * r0 + 3 * r1) / 5)
    assert m["ratio_max"] == pytest.approx(r0) and m["num_tokens"] == 5


def _random(seed, B=4, T=6, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T)[None] < torch.randint(0, T + 1, (B,), generator=g)[:, None]
    logp = -torch.rand(B, T, generator=g, dtype=F64) * 3
    old = logp + spread * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, generator=g, dtype=F64)
    return logp, old, adv, mask


@PROPS
@given(seed=st.integers(0, 2**16))
def test_inside_the_band_r_is_the_geometric_mean_and_below_the_arithmetic(seed):
    logp, old, adv, mask = _random(seed, spread=0.1)
    s = LossSettings(clip_low=1.0, clip_high=10.0, agg="sample_mean")
    out = GMPO(_inputs(logp, old, adv, mask), s)
    rho = torch.exp(logp - old)
    total = 0.0
    for i in range(logp.shape[0]):
        r = rho[i][mask[i]]
        if len(r):
            geo = float(torch.prod(r)) ** (1 / len(r))
            assert geo <= float(r.mean()) + 1e-12
            total += -float(adv[i]) * geo
    assert out.loss.item() == pytest.approx(total / logp.shape[0], rel=1e-9, abs=1e-12)


@PROPS
@given(seed=st.integers(0, 2**16))
def test_on_policy_gradient_is_the_sample_mean_policy_gradient(seed):
    logp, _, adv, mask = _random(seed)
    logp.requires_grad_(True)
    s = LossSettings(clip_low=0.4, clip_high=0.4, agg="sample_mean")
    inputs = _inputs(logp, logp.detach(), adv, mask)
    (g_gmpo,) = torch.autograd.grad(GMPO(inputs, s).loss, logp)
    (g_clip,) = torch.autograd.grad(CLIP(inputs, LossSettings(agg="sample_mean")).loss, logp)
    torch.testing.assert_close(g_gmpo, g_clip)


def _loop(logp, old, adv, mask, lo, hi):
    """Plain floats: per response -A exp(mean of the sign-side-clipped log-ratios), mean."""
    total = 0.0
    for i in range(logp.shape[0]):
        a, ls = float(adv[i]), []
        for t in range(logp.shape[1]):
            if mask[i, t]:
                x = float(logp[i, t]) - float(old[i, t])
                if a > 0:
                    x = min(x, hi)
                elif a < 0:
                    x = max(x, -lo)
                else:
                    x = 0.0
                ls.append(x)
        if ls:
            total += -a * math.exp(sum(ls) / len(ls))
    return total / logp.shape[0]


@PROPS
@given(seed=st.integers(0, 2**16))
def test_matches_a_plain_loop_on_ragged_inputs(seed):
    logp, old, adv, mask = _random(seed, spread=0.6)
    s = LossSettings(clip_low=0.3, clip_high=0.4, agg="sample_mean")
    out = GMPO(_inputs(logp, old, adv, mask), s)
    want = _loop(logp, old, adv, mask, 0.3, 0.4)
    assert out.loss.item() == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_micro_batches_sum_to_the_whole_batch():
    g = torch.Generator().manual_seed(3)
    B, T = 6, 5
    mask = torch.arange(T)[None] < torch.tensor([5, 0, 3, 1, 4, 2])[:, None]
    logp = (-torch.rand(B, T, generator=g) * 2).requires_grad_(True)
    old = logp.detach() + 0.4 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    s = LossSettings(clip_low=0.4, clip_high=0.4, agg="sample_mean")
    whole = GMPO(_inputs(logp, old, adv, mask, num_sequences=5.0), s).loss
    (g_whole,) = torch.autograd.grad(whole, logp)
    parts = sum(
        GMPO(_inputs(logp[r], old[r], adv[r], mask[r], num_sequences=5.0), s).loss
        for r in (slice(0, 2), slice(2, 3), slice(3, 6))
    )
    (g_parts,) = torch.autograd.grad(parts, logp)
    torch.testing.assert_close(parts, whole, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(g_parts, g_whole, atol=1e-7, rtol=1e-6)


def test_rollout_weights_scale_each_response_by_their_mean():
    logp, old, adv, mask = _random(7)
    s = LossSettings(clip_low=0.4, clip_high=0.4, agg="sample_mean")
    w = torch.rand(logp.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    got = GMPO(_inputs(logp, old, adv, mask, rollout_weights=w), s).loss
    want = 0.0
    for i in range(logp.shape[0]):
        one = GMPO(_inputs(logp[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1]), s)
        mean_w = float(w[i][mask[i]].mean()) if mask[i].any() else 0.0
        want += one.loss.item() * mean_w / logp.shape[0]
    assert got.item() == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    ("algo", "match"),
    [
        ({"ratio": "sequence"}, r"^algo\.ratio: got 'sequence', expected token"),
        ({"dual_clip": 3.0}, r"^algo\.dual_clip: got 3\.0, expected none under gmpo$"),
        ({"log_ratio_clamp": 20.0}, r"^algo\.log_ratio_clamp: got 20\.0, expected none"),
        ({"agg": "token_mean"}, r"^algo\.agg: got 'token_mean', expected sample_mean under gmpo"),
        ({"tau_neg": 2.0}, r"^algo\.tau_neg: got 2\.0, expected 1\.05 \(unused by gmpo\)$"),
        ({"advantage": "reinforce_pp"}, r"^algo\.loss: got 'gmpo', expected not gmpo with per-"),
    ],
)
def test_refused_settings_name_the_key(algo, match):
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError

    with pytest.raises(ConfigError, match=match):
        load_config(None, {"preset": "gmpo", "algo": algo})


def test_preset():
    from rlvr.config.algorithm import Algorithm
    from rlvr.config.load import load_config

    algo = Algorithm.from_config(load_config(None, {"preset": "gmpo"}))
    assert algo.objective.name == "gmpo" and algo.settings.agg == "sample_mean"
    assert (algo.settings.clip_low, algo.settings.clip_high) == (0.4, 0.4)
