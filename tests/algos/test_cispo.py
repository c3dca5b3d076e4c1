"""CISPO (rlvr.algos.cispo): a hand-computed case, a plain loop on random ragged inputs,
micro-batch splits, garbage at masked positions, and the settings it refuses."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlvr.algos.objectives import OBJECTIVES, LossInputs, LossSettings

from .helpers import PROPS

CISPO = OBJECTIVES["cispo"].fn


def _inputs(logp, old, adv, mask, **kw):
    return LossInputs(log_probs=logp, old_log_probs=old, advantages=adv, response_mask=mask, **kw)


def test_hand_computed():
    """One response of 3 tokens with rho = 1, 2, 0.5 and A = 2; a second, fully masked row
    holds NaN. Bounds [1 - 0.2, 1 + 0.28] = [0.8, 1.28], so w = 1, 1.28, 0.8; token mean
    over 3 tokens:
        loss = -(1 * 2 ln 0.5 + 1.28 * 2 ln 0.2 + 0.8 * 2 ln 0.4) / 3
             = -(-1.386294 - 4.120161 - 1.466065) / 3 = 2.324173
        d loss / d logp = -w A / 3 = -2/3, -2.56/3, -1.6/3
    PPO's clip would give the second token (A > 0, rho > 1.28) no gradient; CISPO gives it
    the capped weight."""
    nan = float("nan")
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.4], [nan, nan, nan]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.5, 0.1, 0.8], [nan, 0.3, nan]]))
    adv = torch.tensor([2.0, nan])
    mask = torch.tensor([[True, True, True], [False, False, False]])
    out = CISPO(
        _inputs(logp, old, adv, mask), LossSettings(clip_low=0.2, clip_high=0.28, agg="token_mean")
    )
    want = -(2 * math.log(0.5) + 2.56 * math.log(0.2) + 1.6 * math.log(0.4)) / 3
    assert out.loss.item() == pytest.approx(want, rel=1e-6)
    assert want == pytest.approx(2.324173, abs=1e-6)
    out.loss.backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[-2 / 3, -2.56 / 3, -1.6 / 3], [0.0, 0.0, 0.0]])
    )
    m = out.metrics
    assert m["clip_frac_high"] == pytest.approx(1 / 3) and m["clip_frac_low"] == pytest.approx(
        1 / 3
    )
    assert m["ratio_mean"] == pytest.approx(3.5 / 3) and m["ratio_max"] == pytest.approx(2.0)
    assert m["num_tokens"] == 3 and m["dual_clip_frac"] == 0


def _loop(logp, old, adv, mask, lo, hi, kl_coef, ref):
    """Plain floats: sum over valid tokens of -clip(rho) A logp + kl_coef k3, / count."""
    total, n = 0.0, 0
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[i, t]:
                continue
            lp, a = float(logp[i, t]), float(adv[i] if adv.dim() == 1 else adv[i, t])
            w = min(max(math.exp(lp - float(old[i, t])), lo), hi)
            d = float(ref[i, t]) - lp
            total += -w * a * lp + kl_coef * (math.exp(d) - d - 1)
            n += 1
    return total / max(n, 1)


@PROPS
@given(seed=st.integers(0, 2**16), token_adv=st.booleans(), kl_coef=st.sampled_from([0.0, 0.1]))
def test_matches_a_plain_loop_on_ragged_inputs(seed, token_adv, kl_coef):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 6
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn((B, T) if token_adv else (B,), generator=g, dtype=torch.float64)
    s = LossSettings(clip_low=1.0, clip_high=0.28, agg="token_mean", kl_coef=kl_coef)
    out = CISPO(_inputs(logp, old, adv, mask, ref_log_probs=ref), s)
    want = _loop(logp, old, adv, mask, 0.0, 1.28, kl_coef, ref)
    assert out.loss.item() == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_micro_batches_sum_to_the_whole_batch():
    g = torch.Generator().manual_seed(3)
    B, T = 6, 5
    mask = torch.arange(T)[None] < torch.tensor([5, 0, 3, 1, 4, 2])[:, None]
    logp = (-torch.rand(B, T, generator=g) * 2).requires_grad_(True)
    old = logp.detach() + 0.4 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    for agg in ("token_mean", "sample_mean", "token_sum_norm"):
        s = LossSettings(clip_low=0.2, clip_high=0.28, agg=agg)
        counts = dict(num_tokens=float(mask.sum()), num_sequences=float(B), norm_constant=5.0)
        whole = CISPO(_inputs(logp, old, adv, mask, **counts), s).loss
        (g_whole,) = torch.autograd.grad(whole, logp)
        parts = sum(
            CISPO(_inputs(logp[r], old[r], adv[r], mask[r], **counts), s).loss
            for r in (slice(0, 2), slice(2, 3), slice(3, 6))
        )
        (g_parts,) = torch.autograd.grad(parts, logp)
        torch.testing.assert_close(parts, whole, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(g_parts, g_whole, atol=1e-7, rtol=1e-6)


def test_every_token_keeps_a_gradient():
    """rho far outside the band on both sides, advantages of both signs: no zero gradient."""
    logp = torch.zeros(1, 4, requires_grad=True)
    old = torch.tensor([[-3.0, 3.0, -3.0, 3.0]])  # rho = e^3, e^-3, e^3, e^-3
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    CISPO(_inputs(logp, old, adv, mask), LossSettings()).loss.backward()
    assert (logp.grad != 0).all()


@pytest.mark.parametrize(
    ("algo", "match"),
    [
        ({"ratio": "sequence"}, r"^algo\.ratio: got 'sequence', expected token"),
        ({"dual_clip": 3.0}, r"^algo\.dual_clip: got 3\.0, expected none under cispo$"),
    ],
)
def test_refused_settings_name_the_key(algo, match):
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError

    with pytest.raises(ConfigError, match=match):
        load_config(None, {"preset": "cispo", "algo": algo})


def test_preset():
    from rlvr.config.algorithm import Algorithm
    from rlvr.config.load import load_config

    algo = Algorithm.from_config(load_config(None, {"preset": "cispo"}))
    assert algo.objective.name == "cispo"
    assert (algo.settings.clip_low, algo.settings.clip_high) == (1.0, 0.28)
