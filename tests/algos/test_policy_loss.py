"""policy_loss: loop reference, masking, micro-batching, clipping sides, dual clip, GSPO,
log-ratio clamp, empty batches, metrics and errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from rlvr.algos import aggregate, policy_loss

from .helpers import (
    PROPS,
    loop_aggregate,
    loop_gspo_value,
    loop_token_terms,
    random_batch,
    with_garbage,
)

MODES = ["sample_mean", "token_mean", "token_sum_norm"]
shapes = st.tuples(st.integers(1, 6), st.integers(1, 7))


def _agg_kw(agg):
    return {"agg": agg, "norm_constant": 7.0} if agg == "token_sum_norm" else {"agg": agg}


def _grad(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


@PROPS
@given(
    seed=st.integers(0, 2**16),
    shape=shapes,
    agg=st.sampled_from(MODES),
    clip=st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)]),
    dual_clip=st.sampled_from([None, 1.5, 3.0]),
    kl=st.sampled_from([(0.0, "k3"), (0.04, "k3"), (0.1, "k1"), (0.1, "k2")]),
    token_adv=st.booleans(),
)
def test_matches_loop(seed, shape, agg, clip, dual_clip, kl, token_adv):
    B, T = shape
    logp, old, ref, adv, mask = random_batch(seed, B, T, spread=0.6)
    if token_adv:
        adv = adv[:, None] + 0.5 * torch.randn(
            B, T, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
        )
    adv2d = (adv if token_adv else adv[:, None].expand(B, T)).tolist()
    out = policy_loss(
        logp, old, adv, mask, clip_low=clip[0], clip_high=clip[1], dual_clip=dual_clip,
        kl_coef=kl[0], ref_log_probs=ref, kl_kind=kl[1], **_agg_kw(agg),
    )  # fmt: skip
    terms = loop_token_terms(
        logp.tolist(),
        old.tolist(),
        adv2d,
        mask.tolist(),
        clip[0],
        clip[1],
        dual_clip,
        kl[0],
        ref.tolist(),
        kl[1],
    )
    want = loop_aggregate(terms, mask.tolist(), agg, norm_constant=7.0)
    assert_close(out.loss, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    # Metrics against the loop's view of the same tokens.
    rho = [
        math.exp(a - b)
        for a, b, m in zip(logp.flatten().tolist(), old.flatten().tolist(), mask.flatten().tolist())
        if m
    ]
    advs = [a for row, mrow in zip(adv2d, mask.tolist()) for a, m in zip(row, mrow) if m]
    n = len(rho)
    assert out.metrics["num_tokens"] == n
    low = sum(1 for r, a in zip(rho, advs) if a < 0 and r < 1 - clip[0])
    high = sum(1 for r, a in zip(rho, advs) if a > 0 and r > 1 + clip[1])
    dual = sum(1 for r, a in zip(rho, advs) if dual_clip and a < 0 and r > dual_clip)
    assert out.metrics["clip_frac_low"] == pytest.approx(low / max(n, 1))
    assert out.metrics["clip_frac_high"] == pytest.approx(high / max(n, 1))
    assert out.metrics["dual_clip_frac"] == pytest.approx(dual / max(n, 1))
    assert out.metrics["ratio_mean"] == pytest.approx(sum(rho) / max(n, 1))
    assert out.metrics["ratio_max"] == pytest.approx(max(rho, default=0.0))


@PROPS
@given(
    seed=st.integers(0, 2**16),
    shape=shapes,
    agg=st.sampled_from(MODES),
    ratio=st.sampled_from(["token", "sequence"]),
    token_adv=st.booleans(),
)
def test_garbage_at_masked_positions_changes_nothing(seed, shape, agg, ratio, token_adv):
    B, T = shape
    logp, old, ref, adv, mask = random_batch(seed, B, T)
    if token_adv:
        adv = adv[:, None].expand(B, T).clone()
    kw = {"kl_coef": 0.1, "ref_log_probs": ref, "ratio": ratio, "dual_clip": 3.0, **_agg_kw(agg)}
    clean = logp.clone().requires_grad_()
    base = policy_loss(clean, old, adv, mask, **kw)
    dirty = with_garbage(logp, mask, seed).requires_grad_()
    kw["ref_log_probs"] = with_garbage(ref, mask, seed + 1)
    adv_d = with_garbage(adv, mask, seed + 2) if token_adv else adv
    out = policy_loss(dirty, with_garbage(old, mask, seed + 3), adv_d, mask, **kw)
    assert_close(out.loss, base.loss, rtol=0, atol=0)
    g = _grad(out.loss, dirty)
    assert_close(g, _grad(base.loss, clean), rtol=0, atol=0)
    assert (g[~mask] == 0).all()
    assert out.metrics == base.metrics


@PROPS
@given(
    seed=st.integers(0, 2**16),
    shape=st.tuples(st.integers(2, 8), st.integers(1, 6)),
    agg=st.sampled_from(MODES),
    ratio=st.sampled_from(["token", "sequence"]),
    data=st.data(),
)
def test_micro_batches_with_global_counts_sum_to_whole_batch(seed, shape, agg, ratio, data):
    B, T = shape
    logp, old, ref, adv, mask = random_batch(seed, B, T, spread=0.5)
    kw = {"kl_coef": 0.05, "clip_high": 0.28, "ratio": ratio, **_agg_kw(agg)}
    whole = logp.clone().requires_grad_()
    full = policy_loss(whole, old, adv, mask, ref_log_probs=ref, **kw)
    g_full = _grad(full.loss, whole)
    cuts = sorted(data.draw(st.sets(st.integers(1, B - 1), max_size=B - 1)))
    bounds = list(zip([0, *cuts], [*cuts, B]))
    parts = logp.clone().requires_grad_()
    outs = [
        policy_loss(parts[a:b], old[a:b], adv[a:b], mask[a:b], ref_log_probs=ref[a:b],
                    num_tokens=int(mask.sum()), num_sequences=B, **kw)
        for a, b in bounds
    ]  # fmt: skip
    total = sum(o.loss for o in outs)
    total.backward()
    assert_close(total, full.loss, rtol=1e-12, atol=1e-14)
    assert_close(parts.grad, g_full, rtol=1e-12, atol=1e-14)
    # Metrics combine exactly: token-weighted means, max, and sums (LossOutput docstring).
    n = sum(o.metrics["num_tokens"] for o in outs)
    assert n == full.metrics["num_tokens"]
    for key in ("clip_frac_low", "clip_frac_high", "ratio_mean", "kl"):
        combined = sum(o.metrics[key] * o.metrics["num_tokens"] for o in outs) / max(n, 1)
        assert combined == pytest.approx(full.metrics[key], abs=1e-12)
    assert max(o.metrics["ratio_max"] for o in outs) == full.metrics["ratio_max"]


@PROPS
@given(
    seed=st.integers(0, 2**16), shape=shapes, agg=st.sampled_from(MODES), token_adv=st.booleans()
)
def test_ratio_one_gives_plain_policy_gradient(seed, shape, agg, token_adv):
    # At rho = 1 nothing is clipped, so grad = grad of aggregate(-A * logp): -w A per token.
    B, T = shape
    logp, _, _, adv, mask = random_batch(seed, B, T)
    if token_adv:
        adv = adv[:, None] * torch.rand(
            B, T, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
        )
    x = logp.clone().requires_grad_()
    out = policy_loss(
        x, logp, adv, mask, clip_low=0.01, clip_high=0.01, dual_clip=1.1, **_agg_kw(agg)
    )
    a2 = adv if token_adv else adv[:, None].expand(B, T)
    y = logp.clone().requires_grad_()
    pg = aggregate(
        -a2 * y, mask, **{("mode" if k == "agg" else k): v for k, v in _agg_kw(agg).items()}
    )
    assert_close(_grad(out.loss, x), _grad(pg, y), rtol=1e-12, atol=1e-15)
    assert out.metrics["clip_frac_low"] == out.metrics["clip_frac_high"] == 0.0


def _one_token_per_case(rhos, advs):
    """A (N, 1) batch: row k has ratio rhos[k] and advantage advs[k]."""
    old = torch.zeros(len(rhos), 1, dtype=torch.float64)
    logp = torch.tensor(rhos, dtype=torch.float64).log()[:, None].requires_grad_()
    return (
        logp,
        old,
        torch.tensor(advs, dtype=torch.float64),
        torch.ones(len(rhos), 1, dtype=torch.bool),
    )


def test_each_bound_clips_only_on_its_advantage_side():
    # Bounds [0.8, 1.3]. Only (A > 0, rho > 1.3) and (A < 0, rho < 0.8) lose their gradient.
    rhos = [0.5, 0.9, 1.1, 1.6, 0.5, 0.9, 1.1, 1.6]
    advs = [1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0]
    logp, old, adv, mask = _one_token_per_case(rhos, advs)
    out = policy_loss(
        logp,
        old,
        adv,
        mask,
        clip_low=0.2,
        clip_high=0.3,
        agg="token_sum_norm",
        norm_constant=1.0,
        num_sequences=1,
    )
    g = _grad(out.loss, logp).flatten()
    # unclipped: d(-rho A)/d logp = -rho A
    want = [-r * a for r, a in zip(rhos, advs)]
    want[3] = 0.0  # A > 0, rho 1.6 > 1.3: upper bound
    want[4] = 0.0  # A < 0, rho 0.5 < 0.8: lower bound
    assert_close(g, torch.tensor(want, dtype=torch.float64))
    assert out.metrics["clip_frac_high"] == 1 / 8
    assert out.metrics["clip_frac_low"] == 1 / 8
    # value: -min(rho A, clip(rho) A): [-0.5, -0.9, -1.1, -1.3, 0.8, 0.9, 1.1, 1.6]
    assert out.loss.item() == pytest.approx(-0.5 - 0.9 - 1.1 - 1.3 + 0.8 + 0.9 + 1.1 + 1.6)


def test_dual_clip():
    # A < 0 with rho > c = 3: loss capped at -c A = 3, gradient 0. A > 0 is never dual-clipped.
    rhos = [5.0, 2.0, 5.0, 0.5]
    advs = [-1.0, -1.0, 1.0, -1.0]
    logp, old, adv, mask = _one_token_per_case(rhos, advs)
    kw = {"agg": "token_sum_norm", "norm_constant": 1.0, "num_sequences": 1}
    out = policy_loss(logp, old, adv, mask, dual_clip=3.0, **kw)
    # terms: min(5, 3) = 3; 2.0 (< c, untouched); -1.2 (upper clip); 0.8 (lower clip)
    assert out.loss.item() == pytest.approx(3.0 + 2.0 - 1.2 + 0.8)
    assert_close(
        _grad(out.loss, logp).flatten(), torch.tensor([0.0, 2.0, 0.0, 0.0], dtype=torch.float64)
    )
    assert out.metrics["dual_clip_frac"] == 1 / 4
    plain = policy_loss(logp, old, adv, mask, **kw)
    assert plain.loss.item() == pytest.approx(5.0 + 2.0 - 1.2 + 0.8)
    assert plain.metrics["dual_clip_frac"] == 0.0


@PROPS
@given(seed=st.integers(0, 2**16), shape=shapes)
def test_gspo_at_ratio_one_equals_token_sample_mean(seed, shape):
    B, T = shape
    logp, _, _, adv, mask = random_batch(seed, B, T)
    x, y = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    seq = policy_loss(x, logp, adv, mask, ratio="sequence", agg="sample_mean")
    tok = policy_loss(y, logp, adv, mask, ratio="token", agg="sample_mean")
    assert_close(seq.loss, tok.loss)
    assert_close(_grad(seq.loss, x), _grad(tok.loss, y), rtol=1e-12, atol=1e-15)


@PROPS
@given(seed=st.integers(0, 2**16), shape=shapes, clip=st.sampled_from([(3e-4, 4e-4), (0.2, 0.2)]))
def test_gspo_matches_sequence_objective(seed, shape, clip):
    # GSPO-token with sample_mean has GSPO's value and gradient: compare with autograd
    # through the plain sequence objective mean_i -min(s_i A_i, clip(s_i) A_i).
    B, T = shape
    logp, old, _, adv, mask = random_batch(seed, B, T, spread=0.05)
    x = logp.clone().requires_grad_()
    out = policy_loss(
        x, old, adv, mask, clip_low=clip[0], clip_high=clip[1], ratio="sequence", agg="sample_mean"
    )
    want = loop_gspo_value(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), *clip)
    assert_close(out.loss, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    y = logp.clone().requires_grad_()
    n = mask.sum(1).clamp_min(1)
    s = torch.exp(torch.where(mask, y - old, 0.0).sum(1) / n)
    ref = -torch.minimum(s * adv, s.clamp(1 - clip[0], 1 + clip[1]) * adv).mean()
    assert_close(_grad(out.loss, x), _grad(ref, y), rtol=1e-10, atol=1e-14)


def test_gspo_clips_whole_sequences():
    # Row 0: token log-ratios +0.5 and -0.5 (token rho 1.65 and 0.61) average to s = 1:
    # nothing clipped at sequence level, although each token is outside [0.8, 1.2].
    # Row 1: log-ratios 0.3 and 0.2, s = exp(0.25) = 1.284 > 1.2 with A > 0: both clipped.
    old = torch.zeros(2, 2, dtype=torch.float64)
    logp = torch.tensor([[0.5, -0.5], [0.3, 0.2]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    out = policy_loss(logp, old, adv, mask, ratio="sequence", agg="sample_mean")
    g = _grad(out.loss, logp)
    # row 0: -s A / (|o| B) = -1 / 4 per token; row 1: clipped
    assert_close(g, torch.tensor([[-0.25, -0.25], [0.0, 0.0]], dtype=torch.float64))
    assert out.metrics["clip_frac_high"] == 0.5
    assert out.metrics["ratio_max"] == pytest.approx(math.exp(0.25))
    # -(1 + 1.2) / 2
    assert out.loss.item() == pytest.approx(-1.1)
    tok = policy_loss(logp, old, adv, mask, ratio="token", agg="sample_mean")
    # token level: 0.5, 0.3, 0.2 are above ln 1.2 = 0.182 (rho 1.65, 1.35, 1.22)
    assert tok.metrics["clip_frac_high"] == 0.75


def test_log_ratio_clamp_is_counted():
    old = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.tensor(
        [[30.0, 0.1, -25.0], [0.1, 0.0, 99.0]], dtype=torch.float64, requires_grad=True
    )
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    out = policy_loss(logp, old, adv, mask, log_ratio_clamp=20.0)
    assert torch.isfinite(out.loss)
    # 30 and -25 are cut (99 is masked); rho of the first token is exp(20)
    assert out.metrics["log_ratio_clamped"] == 2
    assert out.metrics["ratio_max"] == pytest.approx(math.exp(20))
    # a clamped token gets no gradient; the unclamped ones still do
    g = _grad(out.loss, logp)
    assert (g[0, [0, 2]] == 0).all() and (g[0, 1] != 0) and (g[1, :2] != 0).all()
    seq = policy_loss(logp, old, adv, mask, log_ratio_clamp=1.0, ratio="sequence")
    # sequence log-ratios: (30 + 0.1 - 25) / 3 = 1.7 (cut to 1), (0.1 + 0) / 2 = 0.05
    assert seq.metrics["log_ratio_clamped"] == 1
    assert seq.metrics["ratio_max"] == pytest.approx(math.e)
    # The clamp bounds s_0's value only; its tokens keep the gradient -A s / num_tokens = e / 5
    gs = _grad(seq.loss, logp)
    assert_close(gs[0], torch.full((3,), math.e / 5, dtype=torch.float64))
    assert policy_loss(logp, old, adv, mask).metrics["log_ratio_clamped"] == 0


@pytest.mark.parametrize("agg", MODES)
@pytest.mark.parametrize("ratio", ["token", "sequence"])
def test_all_masked_batch(agg, ratio):
    mask = torch.zeros(3, 4, dtype=torch.bool)
    logp = torch.full((3, 4), float("nan"), requires_grad=True)
    nan = torch.full((3, 4), float("nan"))
    out = policy_loss(
        logp, nan, torch.ones(3), mask, kl_coef=0.1, ref_log_probs=nan, ratio=ratio, **_agg_kw(agg)
    )
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert (logp.grad == 0).all()
    assert all(v == 0.0 for v in out.metrics.values())
    assert set(out.metrics) >= {
        "clip_frac_low",
        "clip_frac_high",
        "dual_clip_frac",
        "ratio_mean",
        "ratio_max",
        "kl",
        "log_ratio_clamped",
        "num_tokens",
    }


def test_kl_metric_and_coefficient():
    logp, old, ref, adv, mask = random_batch(0, 3, 4, empty_rows=False)
    k3 = (torch.exp(ref - logp) - (ref - logp) - 1)[mask].mean().item()
    base = policy_loss(logp, old, adv, mask)
    logged = policy_loss(logp, old, adv, mask, ref_log_probs=ref)  # kl_coef 0: logged only
    assert "kl" not in base.metrics
    assert logged.metrics["kl"] == pytest.approx(k3)
    assert logged.loss.item() == base.loss.item()
    # k3 is logged even when the loss uses k1
    with_k1 = policy_loss(logp, old, adv, mask, ref_log_probs=ref, kl_coef=0.5, kl_kind="k1")
    assert with_k1.metrics["kl"] == pytest.approx(k3)
    k1 = (logp - ref)[mask].mean().item()
    assert with_k1.loss.item() == pytest.approx(base.loss.item() + 0.5 * k1)


def test_half_precision_inputs():
    logp, old, _, adv, mask = random_batch(1, 3, 5, dtype=torch.float32)
    out = policy_loss(logp.bfloat16().requires_grad_(), old.bfloat16(), adv, mask)
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)


def test_errors():
    z = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    a = torch.zeros(2)
    cases = [
        ({"log_probs": torch.zeros(2, 3, 1)}, r"log_probs must be \(B, T\)"),
        (
            {"old_log_probs": torch.zeros(2, 4)},
            r"old_log_probs has shape \(2, 4\), expected \(2, 3\)",
        ),
        ({"response_mask": m[:1]}, "response_mask has shape"),
        (
            {"advantages": torch.zeros(3)},
            r"advantages has shape \(3,\), expected \(2,\) or \(2, 3\)",
        ),
        ({"ref_log_probs": torch.zeros(1, 3)}, "ref_log_probs has shape"),
        ({"clip_low": 1.5}, r"clip_low: got 1.5, expected 0 <= clip_low <= 1"),
        ({"clip_high": -0.1}, r"clip_high: got -0.1, expected >= 0"),
        ({"dual_clip": 1.0}, r"dual_clip: got 1.0, expected none or > 1"),
        ({"kl_coef": -0.1}, r"kl_coef: got -0.1, expected >= 0"),
        ({"kl_coef": 0.1}, "kl_coef > 0 needs ref_log_probs"),
        ({"kl_kind": "k9", "ref_log_probs": z}, r"kl_kind: got 'k9', expected one of"),
        ({"ratio": "seq"}, r"ratio: got 'seq', expected token or sequence"),
        ({"agg": "seq-mean-token-mean"}, r"agg: got 'seq-mean-token-mean', expected one of"),
        ({"agg": "token_sum_norm"}, "token_sum_norm needs norm_constant"),
        ({"log_ratio_clamp": 0.0}, r"log_ratio_clamp: got 0.0, expected none or > 0"),
    ]
    for override, match in cases:
        kw = {"log_probs": z, "old_log_probs": z, "advantages": a, "response_mask": m, **override}
        with pytest.raises(ValueError, match=match):
            policy_loss(**kw)
