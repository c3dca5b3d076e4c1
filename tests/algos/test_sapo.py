"""SAPO (rlvr.algos.sapo): a hand-computed case, the gate's properties, a plain loop on random
ragged inputs, micro-batch splits, rollout weights, and the settings it refuses."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlvr.algos.objectives import OBJECTIVES, LossInputs
from rlvr.algos.sapo import SapoSettings, sapo_gate

from .helpers import PROPS

SAPO = OBJECTIVES["sapo"].fn
CLIP = OBJECTIVES["clip"].fn


def _inputs(logp, old, adv, mask, **kw):
    return LossInputs(log_probs=logp, old_log_probs=old, advantages=adv, response_mask=mask, **kw)


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_hand_computed():
    """Row 0: A = 1 (tau_pos = 1), rho = 1, 2; row 1: A = -2 (tau_neg = 1.05), rho = 0.5; row 2
    fully masked, NaN. f(1, 1) = 2, f(2, 1) = 4 sigmoid(1) = 2.924234,
    f(0.5, 1.05) = 4 sigmoid(-0.525) / 1.05 = 1.415939. Sample mean over the 2 responses:
        loss = (-(2 + 2.924234) / 2 + 2 * 1.415939) / 2 = 0.184880
    d L_t / d logp_t = -A 4 s (1 - s) rho / |o_i| / 2, s = sigmoid(tau (rho - 1)):
        -0.25, -4 s1 (1 - s1) 2 / 4 = -0.393224, 4 s2 (1 - s2) 0.5 * 2 / 2 = 0.467070."""
    nan = float("nan")
    logp = torch.log(torch.tensor([[0.4, 0.4], [0.2, nan], [nan, nan]], dtype=torch.float64))
    logp.requires_grad_(True)
    old = torch.log(torch.tensor([[0.4, 0.2], [0.4, nan], [nan, 0.3]], dtype=torch.float64))
    adv = torch.tensor([1.0, -2.0, nan]).double()
    mask = torch.tensor([[True, True], [True, False], [False, False]])
    s = SapoSettings(agg="sample_mean")
    out = SAPO(_inputs(logp, old, adv, mask, num_sequences=2), s)
    f1, f2, f3 = 2.0, 4 * _sig(1.0), 4 * _sig(-0.525) / 1.05
    want = (-(f1 + f2) / 2 + 2 * f3) / 2
    assert out.loss.item() == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(0.184880, abs=1e-6)
    out.loss.backward()
    s1, s2 = _sig(1.0), _sig(-0.525)
    grad = [[-0.25, -4 * s1 * (1 - s1) * 2 / 4], [4 * s2 * (1 - s2) * 0.5 * 2 / 2, 0.0], [0, 0]]
    torch.testing.assert_close(logp.grad, torch.tensor(grad, dtype=torch.float64))
    assert grad[0][1] == pytest.approx(-0.393224, abs=1e-6)
    assert grad[1][0] == pytest.approx(0.467070, abs=1e-6)
    m = out.metrics
    assert m["clip_frac_low"] == m["clip_frac_high"] == m["dual_clip_frac"] == 0.0
    assert m["ratio_mean"] == pytest.approx(3.5 / 3) and m["ratio_max"] == pytest.approx(2.0)


@PROPS
@given(rho=st.floats(0.01, 20.0), tau=st.floats(0.1, 10.0))
def test_gate_is_bounded_increasing_and_flat_at_one(rho, tau):
    r = torch.tensor([rho, rho * 1.01, 1.0], dtype=torch.float64, requires_grad=True)
    f = sapo_gate(r, torch.tensor(tau, dtype=torch.float64))
    assert 0 < f[0] <= 4 / tau and f[1] >= f[0]  # <=: sigmoid saturates to 1 in floats
    (g,) = torch.autograd.grad(f[2], r)
    assert f[2].item() == pytest.approx(2 / tau) and g[2].item() == pytest.approx(1.0)


@PROPS
@given(seed=st.integers(0, 2**16), agg=st.sampled_from(["sample_mean", "token_mean"]))
def test_on_policy_gradient_is_the_policy_gradient(seed, agg):
    """At rho = 1 the gate's slope is 1 whatever tau: SAPO's gradient is the clip objective's."""
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 5
    mask = torch.arange(T)[None] < torch.randint(0, T + 1, (B,), generator=g)[:, None]
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    s = SapoSettings(agg=agg, tau_pos=0.5, tau_neg=3.0)
    inputs = _inputs(logp, logp.detach(), adv, mask)
    (g_sapo,) = torch.autograd.grad(SAPO(inputs, s).loss, logp)
    (g_clip,) = torch.autograd.grad(CLIP(inputs, SapoSettings(agg=agg)).loss, logp)
    torch.testing.assert_close(g_sapo, g_clip)


def test_larger_tau_damps_off_policy_tokens_more():
    logp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0, 1.0]], dtype=torch.float64)  # rho = e, 1/e
    mask = torch.ones(1, 2, dtype=torch.bool)
    grads = []
    for tau in (1.0, 4.0):
        s = SapoSettings(tau_pos=tau, tau_neg=tau)
        out = SAPO(_inputs(logp, old, torch.ones(1, dtype=torch.float64), mask), s)
        grads.append(torch.autograd.grad(out.loss, logp)[0].abs())
    assert (grads[1] < grads[0]).all() and (grads[0] > 0).all()


def _loop(logp, old, adv, mask, tau_pos, tau_neg):
    """Plain floats, sample mean: per response the mean of -f(rho, tau) A, then over rows."""
    total = 0.0
    for i in range(logp.shape[0]):
        row = []
        for t in range(logp.shape[1]):
            if mask[i, t]:
                a = float(adv[i] if adv.dim() == 1 else adv[i, t])
                tau = tau_pos if a > 0 else tau_neg
                rho = math.exp(float(logp[i, t]) - float(old[i, t]))
                row.append(-_sig(tau * (rho - 1)) * 4 / tau * a)
        total += sum(row) / max(len(row), 1)
    return total / logp.shape[0]


@PROPS
@given(seed=st.integers(0, 2**16), token_adv=st.booleans())
def test_matches_a_plain_loop_on_ragged_inputs(seed, token_adv):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 6
    mask = torch.arange(T)[None] < torch.randint(0, T + 1, (B,), generator=g)[:, None]
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + 0.7 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn((B, T) if token_adv else (B,), generator=g, dtype=torch.float64)
    s = SapoSettings(agg="sample_mean", tau_pos=1.0, tau_neg=1.05)
    out = SAPO(_inputs(logp, old, adv, mask), s)
    assert out.loss.item() == pytest.approx(_loop(logp, old, adv, mask, 1.0, 1.05), rel=1e-9)


def test_micro_batches_sum_to_the_whole_batch():
    g = torch.Generator().manual_seed(3)
    B, T = 6, 5
    mask = torch.arange(T)[None] < torch.tensor([5, 0, 3, 1, 4, 2])[:, None]
    logp = (-torch.rand(B, T, generator=g) * 2).requires_grad_(True)
    old = logp.detach() + 0.4 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    for agg in ("token_mean", "sample_mean", "token_sum_norm"):
        s = SapoSettings(agg=agg)
        counts = dict(num_tokens=float(mask.sum()), num_sequences=5.0, norm_constant=5.0)
        whole = SAPO(_inputs(logp, old, adv, mask, **counts), s).loss
        (g_whole,) = torch.autograd.grad(whole, logp)
        parts = sum(
            SAPO(_inputs(logp[r], old[r], adv[r], mask[r], **counts), s).loss
            for r in (slice(0, 2), slice(2, 3), slice(3, 6))
        )
        (g_parts,) = torch.autograd.grad(parts, logp)
        torch.testing.assert_close(parts, whole, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(g_parts, g_whole, atol=1e-7, rtol=1e-6)


def test_rollout_weights_scale_the_policy_term_not_the_kl():
    g = torch.Generator().manual_seed(5)
    logp = -torch.rand(2, 3, generator=g, dtype=torch.float64)
    old = logp + 0.3 * torch.randn(2, 3, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(2, 3, generator=g, dtype=torch.float64)
    adv, mask = torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(2, 3, dtype=torch.bool)
    s, s_kl = SapoSettings(agg="sample_mean"), SapoSettings(agg="sample_mean", kl_coef=0.1)
    base = SAPO(_inputs(logp, old, adv, mask), s).loss
    w = torch.full((2, 3), 3.0, dtype=torch.float64)
    assert SAPO(_inputs(logp, old, adv, mask, rollout_weights=w), s).loss.item() == pytest.approx(
        3 * base.item()
    )
    kl = SAPO(_inputs(logp, old, adv, mask, ref_log_probs=ref), s_kl).loss - base
    both = SAPO(_inputs(logp, old, adv, mask, ref_log_probs=ref, rollout_weights=w), s_kl).loss
    assert both.item() == pytest.approx(3 * base.item() + kl.item())


@pytest.mark.parametrize(
    ("algo", "match"),
    [
        ({"ratio": "sequence"}, r"^algo\.ratio: got 'sequence', expected token"),
        ({"dual_clip": 3.0}, r"^algo\.dual_clip: got 3\.0, expected none under sapo$"),
        ({"clip_high": 0.28}, r"^algo\.clip_high: got 0\.28, expected 0\.2 \(unused by sapo\)$"),
        ({"tau_neg": 0.0}, r"^algo\.tau_neg: got 0\.0, expected > 0"),
    ],
)
def test_refused_settings_name_the_key(algo, match):
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError

    with pytest.raises(ConfigError, match=match):
        load_config(None, {"preset": "sapo", "algo": algo})


def test_taus_are_refused_by_the_objectives_without_a_gate():
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError

    for loss in ("clip", "cispo"):
        with pytest.raises(ConfigError, match=rf"^algo\.tau_pos: got 2\.0, .*unused by {loss}"):
            load_config(None, {"preset": "dapo", "algo": {"loss": loss, "tau_pos": 2.0}})


def test_preset():
    from rlvr.config.algorithm import Algorithm
    from rlvr.config.load import load_config

    algo = Algorithm.from_config(load_config(None, {"preset": "sapo"}))
    assert algo.objective.name == "sapo" and algo.settings.agg == "sample_mean"
    assert (algo.settings.tau_pos, algo.settings.tau_neg) == (1.0, 1.05)
