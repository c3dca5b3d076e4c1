"""DPPO (rlvr.algos.dppo): hand-computed cases of both divergences, a plain loop on random
ragged inputs, micro-batch splits, garbage at masked positions, the limit where the policy has
not moved (the plain policy gradient), verl 0.9.1's `dppo_tv` / `dppo_kl` on the same inputs
(tests/fixtures/verl_dppo_gdpo.json), the preset and the settings it refuses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlvr.algos.dppo import binary_kl
from rlvr.algos.objectives import OBJECTIVES, LossInputs, LossSettings

from .helpers import PROPS

TV, KL = OBJECTIVES["dppo_tv"].fn, OBJECTIVES["dppo_kl"].fn
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "verl_dppo_gdpo.json"
VERL = json.loads(FIXTURE.read_text())["dppo"]
AGG = {"token-mean": "token_mean", "seq-mean-token-mean": "sample_mean"}


def _inputs(logp, old, adv, mask, **kw):
    return LossInputs(log_probs=logp, old_log_probs=old, advantages=adv, response_mask=mask, **kw)


def _hand(adv: float):
    """One response, p_old = 0.5, 0.1, 0.9 -> p = 0.6, 0.3, 0.95 (rho = 1.2, 3, 1.0556); a
    second, fully masked row holds NaN."""
    nan = float("nan")
    logp = torch.log(torch.tensor([[0.6, 0.3, 0.95], [nan, nan, nan]], dtype=torch.float64))
    old = torch.log(torch.tensor([[0.5, 0.1, 0.9], [nan, 0.2, nan]], dtype=torch.float64))
    mask = torch.tensor([[True, True, True], [False, False, False]])
    adv = torch.tensor([adv, nan], dtype=torch.float64)
    return logp.requires_grad_(True), old, adv, mask


def test_tv_hand_computed():
    """TV: D = p - p_old = 0.1, 0.2, 0.05. With A = +1 and delta_high 0.15 the second token
    (risen by 0.2) is dropped; the others weigh rho. Token mean over 3 tokens:
        loss = -(1.2 ln 0.6 + 1.0555556 ln 0.95) / 3 = -(-0.6129907 - 0.0541429) / 3 = 0.2223779
        d loss / d logp = -A rho / 3 = -0.4, 0, -0.3518519
    With A = -1 every D is above -delta_low: all kept,
        loss = (1.2 ln 0.6 + 3 ln 0.3 + 1.0555556 ln 0.95) / 3 = -4.2790520 / 3 = -1.4263507."""
    s = LossSettings(clip_low=0.15, clip_high=0.15, agg="token_mean")
    logp, old, adv, mask = _hand(1.0)
    out = TV(_inputs(logp, old, adv, mask), s)
    assert out.loss.item() == pytest.approx(0.2223779, abs=1e-7)
    out.loss.backward()
    want = torch.tensor([[-0.4, 0.0, -1.0555556 / 3], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, want, atol=1e-7, rtol=0)
    m = out.metrics
    assert m["clip_frac_high"] == pytest.approx(1 / 3) and m["clip_frac_low"] == 0.0
    assert m["dppo_masked_frac"] == pytest.approx(1 / 3) and m["num_tokens"] == 3
    logp, old, adv, mask = _hand(-1.0)
    out = TV(_inputs(logp, old, adv, mask), s)
    assert out.loss.item() == pytest.approx(-1.4263507, abs=1e-7)
    assert out.metrics["dppo_masked_frac"] == 0.0


def test_binary_kl_hand_computed():
    """KL(Bern(p_old) || Bern(p)) = p_old ln(p_old / p) + (1 - p_old) ln((1 - p_old) / (1 - p)):
    0.5 -> 0.6:   0.5 ln(5/6) + 0.5 ln(5/4)   = -0.0911608 + 0.1115718 = 0.0204110
    0.1 -> 0.3:   0.1 ln(1/3) + 0.9 ln(9/7)   = -0.1098612 + 0.2261830 = 0.1163218
    0.9 -> 0.95:  0.9 ln(18/19) + 0.1 ln 2    = -0.0486605 + 0.0693147 = 0.0206542"""
    old = torch.log(torch.tensor([0.5, 0.1, 0.9], dtype=torch.float64))
    new = torch.log(torch.tensor([0.6, 0.3, 0.95], dtype=torch.float64))
    want = torch.tensor([0.0204110, 0.1163218, 0.0206542], dtype=torch.float64)
    torch.testing.assert_close(binary_kl(old, new), want, atol=1e-7, rtol=0)
    assert (binary_kl(old, old).abs() < 1e-7).all()  # 0 where p has not moved (1e-8 aside)


def test_kl_hand_computed():
    """KL at delta 0.05 with A = +1: only the second token (0.116 > 0.05, p rose) is dropped,
    as under TV: the same loss 0.2223779. With delta 0.01 the other two (0.0204, 0.0207) go
    too: loss 0, gradient 0. With A = -1 no probability fell: nothing is dropped."""
    logp, old, adv, mask = _hand(1.0)
    out = KL(_inputs(logp, old, adv, mask), LossSettings(clip_low=0.05, clip_high=0.05))
    assert out.loss.item() == pytest.approx(0.2223779, abs=1e-7)
    assert out.metrics["clip_frac_high"] == pytest.approx(1 / 3)
    out = KL(_inputs(logp, old, adv, mask), LossSettings(clip_low=0.01, clip_high=0.01))
    assert out.loss.item() == 0.0 and out.metrics["dppo_masked_frac"] == pytest.approx(1.0)
    logp, old, adv, mask = _hand(-1.0)
    out = KL(_inputs(logp, old, adv, mask), LossSettings(clip_low=0.01, clip_high=0.01))
    assert out.metrics["dppo_masked_frac"] == 0.0


def _loop(logp, old, adv, mask, s: LossSettings, kind: str) -> float:
    """Plain floats: sum over kept valid tokens of -A min(rho, C) logp, / valid count."""
    total, n = 0.0, 0
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[i, t]:
                continue
            n += 1
            lp, lo, a = float(logp[i, t]), float(old[i, t]), float(adv[i])
            p, q = math.exp(lp), math.exp(lo)
            if kind == "tv":
                kept = p - q <= s.clip_high if a > 0 else p - q >= -s.clip_low
            else:
                d = q * (lo - lp) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
                kept = (d <= s.clip_high or p <= q) if a > 0 else (d <= s.clip_low or p >= q)
            rho = math.exp(lp - lo)
            w = rho if s.dual_clip is None else min(rho, s.dual_clip)
            total += -a * w * lp if kept else 0.0
    return total / max(n, 1)


def _random(seed: int, B: int = 5, T: int = 6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    old = torch.log(0.02 + 0.96 * torch.rand(B, T, generator=g, dtype=torch.float64))
    logp = (old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, adv, mask


@PROPS
@given(
    seed=st.integers(0, 2**16),
    kind=st.sampled_from(["tv", "kl"]),
    delta=st.sampled_from([0.02, 0.1, 0.3]),
    cap=st.sampled_from([None, 1.5]),
)
def test_matches_a_plain_loop_on_ragged_inputs(seed, kind, delta, cap):
    logp, old, adv, mask = _random(seed)
    s = LossSettings(clip_low=delta, clip_high=delta / 2, dual_clip=cap, agg="token_mean")
    out = (TV if kind == "tv" else KL)(_inputs(logp, old, adv, mask), s)
    assert out.loss.item() == pytest.approx(_loop(logp, old, adv, mask, s, kind), abs=1e-12)


@pytest.mark.parametrize("fn", [TV, KL])
def test_micro_batches_sum_to_the_whole_batch_and_garbage_changes_nothing(fn):
    logp, old, adv, mask = _random(3, B=6, T=5)
    logp.requires_grad_(True)
    for agg in ("token_mean", "sample_mean", "token_sum_norm"):
        s = LossSettings(clip_low=0.1, clip_high=0.1, agg=agg)
        counts = dict(num_tokens=float(mask.sum()), num_sequences=6.0, norm_constant=5.0)
        whole = fn(_inputs(logp, old, adv, mask, **counts), s).loss
        (g_whole,) = torch.autograd.grad(whole, logp)
        parts = sum(
            fn(_inputs(logp[r], old[r], adv[r], mask[r], **counts), s).loss
            for r in (slice(0, 2), slice(2, 3), slice(3, 6))
        )
        (g_parts,) = torch.autograd.grad(parts, logp)
        torch.testing.assert_close(parts, whole, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(g_parts, g_whole, atol=1e-12, rtol=1e-12)
        dirty = torch.where(mask, old, torch.full_like(old, float("nan")))
        noisy = torch.where(mask, logp, torch.full_like(old, float("inf")))
        again = fn(_inputs(noisy, dirty, adv, mask, **counts), s).loss
        (g_again,) = torch.autograd.grad(again, logp)
        assert again.item() == whole.item()
        torch.testing.assert_close(g_again, g_whole, atol=0, rtol=0)


@pytest.mark.parametrize("fn", [TV, KL])
def test_unmoved_policy_gives_the_plain_policy_gradient(fn):
    """p = p_old: every divergence is 0, nothing is dropped and rho = 1, so the gradient is
    -A / n per token: the plain policy gradient."""
    _, old, adv, mask = _random(5)
    logp = old.clone().requires_grad_(True)
    n = float(mask.sum())
    out = fn(_inputs(logp, old, adv, mask), LossSettings(clip_low=1e-3, clip_high=1e-3))
    out.loss.backward()
    want = torch.where(mask, -adv[:, None].expand_as(old) / n, torch.zeros_like(old))
    torch.testing.assert_close(logp.grad, want)
    assert out.metrics["dppo_masked_frac"] == 0.0


def test_a_move_against_the_advantage_is_never_dropped():
    """A > 0 with p fallen, A < 0 with p risen, by far more than any threshold: both kept."""
    old = torch.log(torch.tensor([[0.9, 0.05]], dtype=torch.float64))
    logp = torch.log(torch.tensor([[0.05, 0.9]], dtype=torch.float64))
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    for fn in (TV, KL):
        out = fn(_inputs(logp, old, adv, mask), LossSettings(clip_low=0.01, clip_high=0.01))
        assert out.metrics["dppo_masked_frac"] == 0.0


@pytest.mark.parametrize("case", VERL, ids=lambda c: f"{c['loss_mode']}-{c['seed']}")
def test_matches_verl(case):
    """verl's seq-mean divides by (count + 1e-8): agreement to ~1e-8 relative, not bits."""
    t = {k: torch.tensor(case[k], dtype=torch.float64) for k in
         ("log_probs", "old_log_probs", "advantages", "response_mask")}  # fmt: skip
    mask = t["response_mask"].bool()
    logp = t["log_probs"].requires_grad_(True)
    s = LossSettings(
        clip_low=case["clip_ratio_low"], clip_high=case["clip_ratio_high"],
        dual_clip=case["clip_ratio_c"], agg=AGG[case["loss_agg_mode"]],
    )  # fmt: skip
    inputs = _inputs(logp, t["old_log_probs"], t["advantages"], mask,
                     num_tokens=float(mask.sum()), num_sequences=float(mask.any(1).sum()))  # fmt: skip
    out = OBJECTIVES[case["loss_mode"]].fn(inputs, s)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert out.loss.item() == pytest.approx(case["loss"], rel=1e-7, abs=1e-10)
    torch.testing.assert_close(grad, torch.tensor(case["grad"], dtype=torch.float64),
                               rtol=1e-7, atol=1e-10)  # fmt: skip
    v, m = case["metrics"], out.metrics
    # verl's masked_mean divides by (count + 1e-8): 1e-7 relative
    assert m["dppo_masked_frac"] == pytest.approx(v["actor/pg_clipfrac"], rel=1e-7)
    assert m["dual_clip_frac"] == pytest.approx(v["actor/pg_clipfrac_lower"], rel=1e-7)


def test_the_fixture_covers_both_divergences_and_the_cap():
    assert {c["loss_mode"] for c in VERL} == {"dppo_tv", "dppo_kl"}
    assert any(c["metrics"]["actor/pg_clipfrac_lower"] > 0 for c in VERL)  # the cap cut
    assert all(c["metrics"]["actor/pg_clipfrac"] > 0 for c in VERL)  # the mask dropped


@pytest.mark.parametrize(
    ("algo", "match"),
    [
        ({"ratio": "sequence"}, r"^algo\.ratio: got 'sequence', expected token \(unused by dppo_tv\)$"),
        ({"clip_low": 1.5}, r"^algo\.clip_low: got 1\.5, expected 0 <= clip_low <= 1$"),
        ({"dual_clip": 0.5}, r"^algo\.dual_clip: got 0\.5, expected none or > 1"),
    ],
)  # fmt: skip
def test_refused_settings_name_the_key(algo, match):
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError

    with pytest.raises(ConfigError, match=match):
        load_config(None, {"preset": "dppo", "algo": algo})


def test_preset_is_the_papers_recipe():
    from rlvr.config.algorithm import Algorithm
    from rlvr.config.load import load_config

    cfg = load_config(None, {"preset": "dppo"})
    algo = Algorithm.from_config(cfg)
    assert algo.objective.name == "dppo_tv" and algo.advantage == "dr_grpo" and algo.bypass
    s = algo.settings
    assert (s.clip_low, s.clip_high, s.dual_clip, s.agg, s.kl_coef) == (
        0.15,
        0.15,
        None,
        "token_sum_norm",
        0.0,
    )
    kl = Algorithm.from_config(load_config(None, {"preset": "dppo", "algo": {"loss": "dppo_kl"}}))
    assert kl.objective.name == "dppo_kl"
