"""Top-entropy tokens (rlvr.algos.top_entropy): a hand-computed case, the selection's
properties against a plain loop, micro-batch splits with the histograms summed, and the
config's refusals. The update-level check is in tests/test_objectives.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlvr.algos.objectives import OBJECTIVES, LossInputs, LossSettings
from rlvr.algos.top_entropy import NBINS, ROWS, TOKENS, entropy_stats, with_top_entropy

from .helpers import PROPS

F64 = torch.float64


def _inputs(logp, old, adv, mask, entropy, **kw):
    return LossInputs(
        log_probs=logp, old_log_probs=old, advantages=adv, response_mask=mask, entropy=entropy,
        **kw,
    )  # fmt: skip


def _with_stats(inputs, parts=None):
    """The inputs with the histograms summed over `parts` (row slices), as the update does."""
    parts = parts or [slice(0, inputs.log_probs.shape[0])]
    total = {}
    for r in parts:
        one = _inputs(
            inputs.log_probs[r], inputs.old_log_probs[r], inputs.advantages[r],
            inputs.response_mask[r], inputs.entropy[r],
        )  # fmt: skip
        for k, v in entropy_stats(one).items():
            total[k] = total[k] + v if k in total else v
    return replace(inputs, batch_stats=total)


def test_hand_computed():
    """6 loss tokens, entropies 0.1 0.5 0.9 2.0 | 0.3 0.2; q = 0.2 keeps ceil(1.2) = 2: the
    tokens at 2.0 and 0.9, both in row 0. A = 1, rho = 2 and 0.5 there; clip 0.2: the clipped
    surrogate gives -min(2, 1.2) = -1.2 and -0.5; token mean over the 2 kept tokens:
        loss = (-1.2 - 0.5) / 2 = -0.85
    d loss / d logp: the rho = 2 token is clipped (0), the other -rho / 2 = -0.25; the four
    dropped tokens 0. Sample mean: the one response with kept tokens, the same -0.85."""
    H = torch.tensor([[0.1, 0.5, 0.9, 2.0], [0.3, 0.2, 9.0, 9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    logp = torch.full((2, 4), -1.0, dtype=F64, requires_grad=True)
    old = torch.tensor([[-1.0, -1.0, -1 - math.log(0.5), -1 - math.log(2.0)], [-1.0] * 4])
    old = old.to(F64)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    for agg in ("token_mean", "sample_mean"):
        top = with_top_entropy(OBJECTIVES["clip"], 0.2)
        inputs = _with_stats(_inputs(logp, old, adv, mask, H, num_tokens=6.0, num_sequences=2.0))
        out = top.fn(inputs, LossSettings(agg=agg))
        assert out.loss.item() == pytest.approx(-0.85)
        (grad,) = torch.autograd.grad(out.loss, logp)
        want = torch.zeros(2, 4, dtype=F64)
        want[0, 2] = -0.25
        torch.testing.assert_close(grad, want)
        m = out.metrics
        assert m["num_tokens"] == 2 and m["top_entropy_kept_frac"] == pytest.approx(1 / 3)
        assert m["clip_frac_high"] == pytest.approx(0.5)  # of the kept tokens
        assert m["top_entropy_threshold"] == pytest.approx(math.floor(0.9 * 512) / 512)


def _loop_keep(H, mask, q):
    """Plain Python: bins floor(H * 512); from the top, the fewest whole bins holding at least
    ceil(q N) loss tokens."""
    bins = {}
    for i in range(H.shape[0]):
        for t in range(H.shape[1]):
            if mask[i, t]:
                b = min(math.floor(float(H[i, t]) * 512), NBINS - 1)
                bins[(i, t)] = b
    n = len(bins)
    if n == 0:
        return set()
    want = max(1, math.ceil(q * n - 1e-9))
    for k in sorted(set(bins.values()), reverse=True):
        kept = {pos for pos, b in bins.items() if b >= k}
        if len(kept) >= want:
            return kept
    raise AssertionError("unreachable")


@PROPS
@given(seed=st.integers(0, 2**16), q=st.sampled_from([0.05, 0.2, 0.5, 0.9]))
def test_selection_matches_a_plain_loop_and_keeps_the_highest(seed, q):
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 7
    mask = torch.arange(T)[None] < torch.randint(0, T + 1, (B,), generator=g)[:, None]
    # coarse entropies so that ties and shared bins happen
    H = torch.randint(0, 12, (B, T), generator=g).to(F64) / 8
    logp = torch.zeros(B, T, dtype=F64, requires_grad=True)
    adv = torch.ones(B, dtype=F64)
    n = int(mask.sum())
    inputs = _with_stats(_inputs(logp, logp.detach(), adv, mask, H, num_tokens=float(n)))
    out = with_top_entropy(OBJECTIVES["clip"], q).fn(inputs, LossSettings(agg="token_mean"))
    (grad,) = torch.autograd.grad(out.loss, logp)
    kept = {(int(i), int(t)) for i, t in (grad != 0).nonzero()}
    assert kept == _loop_keep(H, mask, q)
    if n:
        assert len(kept) >= math.ceil(q * n - 1e-9)
        dropped = [float(H[i, t]) for i in range(B) for t in range(T)
                   if mask[i, t] and (i, t) not in kept]  # fmt: skip
        assert max(dropped, default=-1.0) < min(float(H[i, t]) for i, t in kept)
        assert out.loss.item() == pytest.approx(-1.0)  # on-policy, A = 1: the kept mean


def test_micro_batches_sum_to_the_whole_batch():
    g = torch.Generator().manual_seed(3)
    B, T = 6, 5
    mask = torch.arange(T)[None] < torch.tensor([5, 0, 3, 1, 4, 2])[:, None]
    logp = (-torch.rand(B, T, generator=g) * 2).requires_grad_(True)
    old = logp.detach() + 0.4 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    H = torch.rand(B, T, generator=g) * 3
    parts = (slice(0, 2), slice(2, 3), slice(3, 6))
    for name in ("clip", "cispo", "sapo"):
        top = with_top_entropy(OBJECTIVES[name], 0.3)
        for agg in ("token_mean", "sample_mean"):
            s = top.settings(agg=agg, clip_low=0.2, clip_high=0.2)  # the objective's own class
            whole_in = _with_stats(_inputs(logp, old, adv, mask, H), parts)
            whole = top.fn(whole_in, s).loss
            (g_whole,) = torch.autograd.grad(whole, logp)
            stats = whole_in.batch_stats
            split = sum(
                top.fn(_inputs(logp[r], old[r], adv[r], mask[r], H[r], batch_stats=stats), s).loss
                for r in parts
            )
            (g_split,) = torch.autograd.grad(split, logp)
            torch.testing.assert_close(split, whole, atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(g_split, g_whole, atol=1e-7, rtol=1e-6)
            assert (g_whole != 0).sum() < mask.sum()  # something was dropped


def test_histograms_are_the_same_however_the_batch_is_split():
    g = torch.Generator().manual_seed(4)
    mask = torch.rand(6, 5, generator=g) < 0.7
    H = torch.rand(6, 5, generator=g) * 5
    z = torch.zeros(6, 5)
    inputs = _inputs(z, z, torch.zeros(6), mask, H)
    one = _with_stats(inputs).batch_stats
    three = _with_stats(inputs, [slice(0, 1), slice(1, 4), slice(4, 6)]).batch_stats
    assert torch.equal(one[TOKENS], three[TOKENS]) and torch.equal(one[ROWS], three[ROWS])
    assert one[TOKENS].sum() == mask.sum() and one[ROWS].sum() == mask.any(1).sum()


@pytest.mark.parametrize(
    ("algo", "match"),
    [
        (
            {"top_entropy_quantile": 0.0},
            r"^algo\.top_entropy_quantile: got 0\.0, expected in \(0, 1\]",
        ),
        ({"top_entropy_quantile": 1.5}, r"^algo\.top_entropy_quantile: got 1\.5, expected in"),
        (
            {"top_entropy_quantile": 0.2, "loss": "tests/e2e_objectives.py:centred_pg"},
            r"^algo\.top_entropy_quantile: got 0\.2, expected 1 with .*own batch statistics",
        ),
    ],
)
def test_refused_settings_name_the_key(algo, match):
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError

    with pytest.raises(ConfigError, match=match) as e:
        load_config(None, {"preset": "dapo", "algo": algo})
    assert "\n" not in str(e.value)


def test_any_objective_takes_the_option():
    from rlvr.config.algorithm import Algorithm
    from rlvr.config.load import load_config

    for preset in ("dapo", "cispo", "sapo", "gmpo"):
        cfg = load_config(None, {"preset": preset, "algo": {"top_entropy_quantile": 0.2}})
        algo = Algorithm.from_config(cfg)
        assert algo.objective.stats is entropy_stats
