"""Clip-Cov and KL-Cov (rlvr.algos.cov): hand-computed cases, plain loops on random ragged
inputs, the selection's invariance to how the rows are split, the limits where each is PPO's
clip or the plain policy gradient, Clip-Cov's seeded draws, and the settings refused."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlvr.algos.cov import ClipCovSettings, KLCovSettings, uniform_keys
from rlvr.algos.objectives import OBJECTIVES, LossInputs
from rlvr.config.algorithm import Algorithm
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError

from .helpers import PROPS, loop_aggregate, loop_cov_selection, stage_totals

F64 = torch.float64
CLIP_COV, KL_COV, CLIP = OBJECTIVES["clip_cov"], OBJECTIVES["kl_cov"], OBJECTIVES["clip"]


def _inputs(logp, old, adv, mask, rows=None, **kw):
    n = float(mask.sum())
    rows = torch.arange(len(mask)) if rows is None else rows
    return LossInputs(
        log_probs=logp, old_log_probs=old, advantages=adv, response_mask=mask,
        num_tokens=n, row_ids=rows, **kw,
    )  # fmt: skip


def _loss(objective, inputs, settings, draw_seed=5):
    totals = stage_totals(objective, settings, [inputs], draw_seed)
    return objective.fn(replace(inputs, batch_stats=totals, draw_seed=draw_seed), settings)


def _hand():
    """Rows A = 1, -1, logp (-1, -2), (-0.5, -3): mean A 0, mean logp -1.625, cov 0.625,
    -0.375, -1.125, 1.375. log rho 0 except token (1, 1): 0.2; with `first`, token (0, 0): 0.5."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], dtype=F64).requires_grad_(True)
    old = logp.detach().clone()
    old[1, 1] = -3.2
    return logp, old, torch.tensor([1.0, -1.0], dtype=F64), torch.ones(2, 2, dtype=torch.bool)


def test_kl_cov_hand_computed():
    """k = max(1, floor(0.25 * 4)) = 1: the largest cov, token (1, 1), gets + |log rho| = 0.2.
    loss = (-1 - 1 + 1 + e^0.2 + 0.2) / 4 = 0.105351; d/d logp = -A rho / 4, plus 1/4 at
    (1, 1): -1/4, -1/4, 1/4, (e^0.2 + 1) / 4."""
    logp, old, adv, mask = _hand()
    out = _loss(KL_COV, _inputs(logp, old, adv, mask), KLCovSettings(kl_cov_ratio=0.25))
    e = math.exp(0.2)
    assert out.loss.item() == pytest.approx((e - 0.8) / 4, rel=1e-12)
    assert (e - 0.8) / 4 == pytest.approx(0.105351, abs=1e-6)
    out.loss.backward()
    want = torch.tensor([[-0.25, -0.25], [0.25, (e + 1) / 4]], dtype=F64)
    torch.testing.assert_close(logp.grad, want)
    assert out.metrics["cov_frac"] == 0.25 and out.metrics["clip_frac_high"] == 0.0


def test_clip_cov_hand_computed():
    """Token (0, 0) also moves: log rho 0.5, A = 1, so PPO's upper bound clips it (loss -1.2)
    and it is no candidate. Band (0.5, 5): candidates are tokens with cov 0.625 and 1.375,
    minus the clipped one: (1, 1) alone. k = floor(0.5 * 4) = 2 > 1 candidate: (1, 1) cut.
    loss = (-1.2 - 1 + 1 + 0) / 4 = -0.3; gradient 0 at the clipped and the cut token."""
    logp, old, adv, mask = _hand()
    old = old.clone()
    old[0, 0] = -1.5
    s = ClipCovSettings(clip_cov_ratio=0.5, clip_cov_lb=0.5, clip_cov_ub=5.0)
    out = _loss(CLIP_COV, _inputs(logp, old, adv, mask), s)
    assert out.loss.item() == pytest.approx(-0.3, rel=1e-12)
    out.loss.backward()
    want = torch.tensor([[0.0, -0.25], [0.25, 0.0]], dtype=F64)
    torch.testing.assert_close(logp.grad, want)
    assert out.metrics["cov_frac"] == 0.25 and out.metrics["clip_frac_high"] == 0.25
    # k = 1 with two candidates (no clipped token): one of them, by the seeded draw
    logp2, old2, adv2, mask2 = _hand()
    out = _loss(CLIP_COV, _inputs(logp2, old2, adv2, mask2), replace(s, clip_cov_ratio=0.25))
    assert out.metrics["cov_frac"] == 0.25
    cut_11, cut_00 = -0.25, math.exp(0.2) / 4  # (1, 1) cut, or (0, 0)
    assert min(abs(out.loss.item() - v) for v in (cut_11, cut_00)) < 1e-12


def _random(seed, B=5, T=7, spread=0.4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    logp = -torch.rand(B, T, generator=g, dtype=F64) * 4
    old = logp + spread * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, generator=g, dtype=F64) * 2
    return logp, old, adv, mask


def _lists(logp, old, adv, mask):
    B, T = mask.shape
    a = adv[:, None].expand(B, T)
    return logp.tolist(), old.tolist(), a.tolist(), mask.tolist()


@PROPS
@given(seed=st.integers(0, 10_000), ratio=st.sampled_from([0.05, 0.2, 0.6]))
def test_kl_cov_matches_a_plain_loop(seed, ratio):
    logp, old, adv, mask = _random(seed)
    if not mask.any():
        return
    s = KLCovSettings(kl_cov_ratio=ratio, kl_cov_coef=0.7)
    out = _loss(KL_COV, _inputs(logp, old, adv, mask), s)
    lp, od, a, m = _lists(logp, old, adv, mask)
    k = max(1, int(ratio * int(mask.sum())))
    _, chosen = loop_cov_selection(lp, a, m, lambda p, c: c, lambda p, c: True, k)
    per = [
        [-a[i][t] * math.exp(lp[i][t] - od[i][t])
         + (0.7 * abs(lp[i][t] - od[i][t]) if (i, t) in chosen else 0.0)
         for t in range(len(m[i]))]
        for i in range(len(m))
    ]  # fmt: skip
    assert out.loss.item() == pytest.approx(loop_aggregate(per, m, "token_mean"), rel=1e-10)
    assert out.metrics["cov_frac"] * mask.sum().item() == pytest.approx(len(chosen))


@PROPS
@given(seed=st.integers(0, 10_000), ratio=st.sampled_from([0.05, 0.2, 0.6]))
def test_clip_cov_matches_a_plain_loop(seed, ratio):
    """The candidates, their count and PPO's clipped loss on the rest from loops; the random
    ranking key is the objective's own seeded draw (uniform_keys)."""
    logp, old, adv, mask = _random(seed)
    if not mask.any():
        return
    s = ClipCovSettings(clip_low=0.2, clip_high=0.28, clip_cov_ratio=ratio, clip_cov_lb=0.1)
    inputs = _inputs(logp, old, adv, mask, draw_seed=5)
    out = _loss(CLIP_COV, inputs, s)
    lp, od, a, m = _lists(logp, old, adv, mask)
    keys = uniform_keys(inputs).tolist()

    def ppo(i, t):
        r = math.exp(lp[i][t] - od[i][t])
        return -a[i][t] * r, -a[i][t] * min(max(r, 0.8), 1.28)

    def eligible(p, c):
        pg1, pg2 = ppo(*p)
        return not pg2 > pg1 and 0.1 < c < 5.0

    k = max(1, int(ratio * int(mask.sum())))
    _, cut = loop_cov_selection(lp, a, m, lambda p, c: keys[p[0]][p[1]], eligible, k)
    per = [[0.0 if (i, t) in cut else max(ppo(i, t)) for t in range(len(m[i]))]
           for i in range(len(m))]  # fmt: skip
    assert out.loss.item() == pytest.approx(loop_aggregate(per, m, "token_mean"), rel=1e-10)
    assert out.metrics["cov_frac"] * mask.sum().item() == pytest.approx(len(cut))


@PROPS
@given(seed=st.integers(0, 10_000), cut=st.integers(1, 4), name=st.sampled_from(["c", "k"]))
def test_selection_and_gradient_do_not_depend_on_the_split(seed, cut, name):
    """Rows split into two parts (micro-batches), each its own width: the same totals, and
    the parts' losses add up to the whole batch's loss and gradient."""
    objective = CLIP_COV if name == "c" else KL_COV
    s = ClipCovSettings(clip_cov_ratio=0.3, clip_cov_lb=-10.0)
    s = s if name == "c" else KLCovSettings(kl_cov_ratio=0.3)
    logp, old, adv, mask = _random(seed)
    leaf = logp.clone().requires_grad_(True)
    whole = _inputs(leaf, old, adv, mask)
    n = float(mask.sum())

    def part(rows):
        w = max(int(mask[rows].sum(1).max()), 1)
        return replace(
            whole, log_probs=leaf[rows, :w], old_log_probs=old[rows, :w], advantages=adv[rows],
            response_mask=mask[rows, :w], row_ids=torch.tensor(rows), num_tokens=n,
        )  # fmt: skip

    parts = [part(list(range(cut))), part(list(range(cut, 5)))]
    t_whole = stage_totals(objective, s, [whole], 9)
    t_parts = stage_totals(objective, s, parts, 9)
    top_whole, top_parts = t_whole["cov/top"], t_parts["cov/top"]
    assert torch.equal(top_whole[:, 1], top_parts[:, 1])  # the same tokens; cov to rounding
    torch.testing.assert_close(top_whole[:, 0], top_parts[:, 0], rtol=1e-12, atol=1e-14)
    loss = objective.fn(replace(whole, batch_stats=t_whole, draw_seed=9), s).loss
    (g_whole,) = torch.autograd.grad(loss, leaf)
    split = sum(objective.fn(replace(p, batch_stats=t_parts, draw_seed=9), s).loss for p in parts)
    assert split.item() == pytest.approx(loss.item(), rel=1e-12, abs=1e-15)
    (g_split,) = torch.autograd.grad(split, leaf)
    torch.testing.assert_close(g_split, g_whole)


@PROPS
@given(seed=st.integers(0, 10_000))
def test_the_limits_are_ppo_and_the_policy_gradient(seed):
    """A cov band nothing falls in: Clip-Cov is PPO's clipped loss. kl_cov_coef 0: KL-Cov is
    the unclipped -A rho."""
    logp, old, adv, mask = _random(seed)
    inputs = _inputs(logp, old, adv, mask)
    s = ClipCovSettings(clip_high=0.28, clip_cov_lb=1e6, clip_cov_ub=2e6)
    assert _loss(CLIP_COV, inputs, s).loss.item() == pytest.approx(
        CLIP.fn(inputs, replace(s, clip_cov_lb=1.0, clip_cov_ub=5.0)).loss.item(), rel=1e-12
    )
    out = _loss(KL_COV, inputs, KLCovSettings(kl_cov_coef=0.0, kl_cov_ratio=0.5))
    rho = torch.exp(logp - old)
    want = torch.where(mask, -adv[:, None] * rho, 0.0).sum() / max(int(mask.sum()), 1)
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-15)


def test_clip_cov_draws_are_seeded_per_row_and_width_free():
    mask = torch.ones(3, 9, dtype=torch.bool)
    z = torch.zeros(3, 9, dtype=F64)
    keys = uniform_keys(_inputs(z, z, z[:, 0], mask, draw_seed=1))
    again = uniform_keys(_inputs(z, z, z[:, 0], mask, draw_seed=1))
    other = uniform_keys(_inputs(z, z, z[:, 0], mask, draw_seed=2))
    narrow = uniform_keys(_inputs(z[:, :4], z[:, :4], z[:, 0], mask[:, :4], draw_seed=1))
    assert torch.equal(keys, again) and not torch.equal(keys, other)
    assert torch.equal(narrow, keys[:, :4])  # a micro-batch's width does not change a draw
    assert not torch.equal(keys[0], keys[1])
    assert ((keys >= 0) & (keys < 1)).all()
    moved = uniform_keys(_inputs(z[:1], z[:1], z[:1, 0], mask[:1], torch.tensor([2]), draw_seed=1))
    assert torch.equal(moved[0], keys[2])  # a row's draws follow its id, not its place


@pytest.mark.parametrize(
    ("algo", "match"),
    [
        ({"loss": "kl_cov"}, "algo.clip_high: got 0.28, expected 0.2 \\(unused by kl_cov\\)"),
        ({"loss": "clip", "kl_cov_coef": 2.0}, "algo.kl_cov_coef: got 2.0, .*unused by clip"),
        ({"loss": "clip_cov", "kl_cov_ratio": 0.1}, "algo.kl_cov_ratio: .*unused by clip_cov"),
        ({"loss": "clip_cov", "clip_cov_ratio": 0.0}, "algo.clip_cov_ratio: got 0.0, expected in"),
        ({"loss": "clip_cov", "clip_cov_ub": 0.5}, "algo.clip_cov_ub: got 0.5, expected > clip"),
        ({"loss": "clip_cov", "dual_clip": 3.0}, "algo.dual_clip: got 3.0, expected none under"),
        ({"loss": "kl_cov", "clip_high": 0.2, "top_entropy_quantile": 0.2}, "expected 1 with"),
    ],
)
def test_one_error_line_naming_the_key(algo, match):
    with pytest.raises(ConfigError, match=match):
        Algorithm.from_config(load_config(None, {"preset": "dapo", "algo": algo}))
