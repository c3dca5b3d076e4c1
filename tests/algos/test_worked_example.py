"""docs/algorithms.md#worked-example, every number, through the public functions and autograd.

G = 4, R = [1, 0, 0, 1], lengths [3, 5, 2, 4] (14 tokens), logp_old = ln 0.5 everywhere,
logp = logp_old + ln rho, pi_ref = pi_old. Computed in float64 so that the document's
rounded numbers are checked to their last printed digit.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr.algos import group_advantages, kl_estimate, policy_loss

RHO = [
    [1.10, 1.25, 0.70],
    [0.90, 0.75, 1.30, 1.00, 1.05],
    [0.60, 1.10],
    [1.00, 1.35, 0.95, 1.15],
]
B, T = 4, 5
GRPO = {"clip_low": 0.2, "clip_high": 0.2}
DAPO = {"clip_low": 0.2, "clip_high": 0.28}
A_POP = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)


def _pad(rows, fill=0.0):
    return torch.tensor([r + [fill] * (T - len(r)) for r in rows], dtype=torch.float64)


def _close(actual, expected, atol):
    assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=0, atol=atol)


@pytest.fixture
def ex():
    mask = _pad([[1.0] * len(r) for r in RHO]).bool()
    old = torch.full((B, T), math.log(0.5), dtype=torch.float64)
    # Padding holds rho = 1 here; the property tests show garbage there changes nothing.
    logp = (old + _pad(RHO, fill=1.0).log()).requires_grad_()
    return logp, old, mask


def _loss(ex, adv, agg, clip, **kw):
    logp, old, mask = ex
    return policy_loss(logp, old, adv, mask, agg=agg, **clip, **kw)


def test_advantages_population_and_unbiased_std():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    # mean 0.5; population std sqrt(4 * 0.25 / 4) = 0.5 -> A = +-0.5 / 0.5 = +-1 (eps 0)
    _close(group_advantages(r, 4, std="population", eps=0.0), A_POP, 1e-15)
    # unbiased std sqrt(4 * 0.25 / 3) = 0.5773503 -> A = +-0.5 / 0.5773503 = +-0.8660254
    _close(group_advantages(r, 4, eps=0.0), 0.8660254 * A_POP, 5e-8)
    assert_close(r.std(), torch.tensor(0.5773503, dtype=torch.float64), rtol=0, atol=5e-8)


# Table column "GRPO eps 0.2" / "DAPO 0.2/0.28": min(rho A, clip(rho) A) per token.
TERMS_GRPO = [
    [1.10, 1.20, 0.70],
    [-0.90, -0.80, -1.30, -1.00, -1.05],
    [-0.80, -1.10],
    [1.00, 1.20, 0.95, 1.15],
]
TERMS_DAPO = [
    [1.10, 1.25, 0.70],
    [-0.90, -0.80, -1.30, -1.00, -1.05],
    [-0.80, -1.10],
    [1.00, 1.28, 0.95, 1.15],
]
K3 = [
    [0.0044011, 0.0231436, 0.0718965],
    [0.0057506, 0.0456513, 0.0315950, 0.0, 0.0011711],
    [0.1558410, 0.0044011],
    [0.0, 0.0408453, 0.0013383, 0.0093272],
]


@pytest.mark.parametrize(("clip", "terms"), [(GRPO, TERMS_GRPO), (DAPO, TERMS_DAPO)])
def test_per_token_terms(ex, clip, terms):
    # One token at a time: token_sum_norm with norm 1 over 1 sequence is -term of that token.
    logp, old, mask = ex
    for i, row in enumerate(terms):
        for t, term in enumerate(row):
            one = torch.zeros_like(mask)
            one[i, t] = True
            out = policy_loss(
                logp,
                old,
                A_POP,
                one,
                agg="token_sum_norm",
                norm_constant=1.0,
                num_sequences=1,
                **clip,
            )
            _close(out.loss.detach(), -term, 1e-12)


def test_k3_column(ex):
    # k3 = exp(x) - x - 1 with x = ln pi_ref - ln pi = -ln rho: 1/rho + ln rho - 1.
    logp, old, mask = ex
    k3 = kl_estimate(logp.detach(), old, "k3")
    _close(k3[mask], [v for row in K3 for v in row], 5e-8)


def test_per_response_means_and_sums(ex):
    logp, old, mask = ex
    for i, (mean_i, sum_i) in enumerate(
        zip([1.000, -1.010, -0.950, 1.075], [3.05, -5.05, -1.90, 4.38])
    ):
        row = torch.zeros_like(mask)
        row[i] = mask[i]
        # o2 GRPO: (-0.90 - 0.80 - 1.30 - 1.00 - 1.05) / 5 = -1.010
        grpo = policy_loss(logp, old, A_POP, row, agg="sample_mean", num_sequences=1, **GRPO)
        _close(grpo.loss.detach(), -mean_i, 1e-12)
        # o4 DAPO: 1.00 + 1.28 + 0.95 + 1.15 = 4.38
        dapo = policy_loss(
            logp, old, A_POP, row, agg="token_sum_norm", norm_constant=1.0, num_sequences=1, **DAPO
        )
        _close(dapo.loss.detach(), -sum_i, 1e-12)


@pytest.mark.parametrize(
    ("adv", "agg", "clip", "kl_coef", "expected", "atol"),
    [
        # (a) (1.000 - 1.010 - 0.950 + 1.075) / 4 = 0.02875 -> loss -0.02875
        (A_POP, "sample_mean", GRPO, 0.0, -0.02875, 1e-12),
        # (a) + 0.04 * mean_i(mean_t k3) = -0.02875 + 0.04 * 0.0357449 = -0.0273202
        (A_POP, "sample_mean", GRPO, 0.04, -0.0273202, 5e-8),
        # (b) (3.05 - 5.05 - 1.90 + 4.38) / 14 = 0.48 / 14 -> -0.0342857
        (A_POP, "token_mean", DAPO, 0.0, -0.48 / 14, 1e-12),
        # cross: GRPO clip, token-level: (3.00 - 5.05 - 1.90 + 4.30) / 14 = 0.35 / 14 = 0.025
        (A_POP, "token_mean", GRPO, 0.0, -0.025, 1e-12),
        # cross: DAPO clip, sample-level: (3.05/3 - 5.05/5 - 1.90/2 + 4.38/4) / 4 = 0.0379167
        (A_POP, "sample_mean", DAPO, 0.0, -0.0379167, 5e-8),
        # unbiased-std advantages scale A by 0.8660254 (clip decisions unchanged: same signs)
        (0.8660254 * A_POP, "sample_mean", GRPO, 0.0, -0.0248982, 5e-8),
        (0.8660254 * A_POP, "token_mean", DAPO, 0.0, -0.0296923, 5e-8),
        (0.8660254 * A_POP, "sample_mean", GRPO, 0.04, -0.0234684, 5e-8),
    ],
)
def test_losses(ex, adv, agg, clip, kl_coef, expected, atol):
    _, old, _ = ex
    kl = {"kl_coef": kl_coef, "ref_log_probs": old} if kl_coef else {}
    _close(_loss(ex, adv, agg, clip, **kl).loss.detach(), expected, atol)


def test_unbiased_advantages_from_group_advantages(ex):
    # Same as the 0.8660254 rows above, with A straight from group_advantages. eps = 0:
    # the default 1e-6 would move A by 1.7e-6 relative, visible in the 7th printed digit.
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64), 4, eps=0.0)
    _close(_loss(ex, adv, "sample_mean", GRPO).loss.detach(), -0.0248982, 5e-8)
    _close(_loss(ex, adv, "token_mean", DAPO).loss.detach(), -0.0296923, 5e-8)


# d loss / d logp = -w_i A_i rho if unclipped else 0; w = 1/(G |o_i|) (GRPO), 1/14 (DAPO).
GRAD_GRPO = [
    [-0.0916667, 0, -0.0583333],  # -1.10/12, clipped, -0.70/12
    [0.0450, 0, 0.0650, 0.0500, 0.0525],  # +0.90/20, clipped, 1.30/20, ...
    [0, 0.1375],  # clipped, 1.10/8
    [-0.0625, 0, -0.059375, -0.071875],  # -1.00/16, clipped, -0.95/16, -1.15/16
]
GRAD_DAPO = [
    [-0.0785714, -0.0892857, -0.0500000],  # -1.10/14, -1.25/14 (1.25 < 1.28), -0.70/14
    [0.0642857, 0, 0.0928571, 0.0714286, 0.0750],
    [0, 0.0785714],
    [-0.0714286, 0, -0.0678571, -0.0821429],
]


@pytest.mark.parametrize(
    ("agg", "clip", "table", "weights"),
    [
        ("sample_mean", GRPO, GRAD_GRPO, [1 / 12, 1 / 20, 1 / 8, 1 / 16]),
        ("token_mean", DAPO, GRAD_DAPO, [1 / 14] * 4),
    ],
)
@pytest.mark.parametrize("kl_coef", [0.0, 0.04])
def test_gradient_table(ex, agg, clip, table, weights, kl_coef):
    logp, old, mask = ex
    kl = {"kl_coef": kl_coef, "ref_log_probs": old} if kl_coef else {}
    (grad,) = torch.autograd.grad(_loss(ex, A_POP, agg, clip, **kl).loss, logp)
    expected = _pad(table)
    # With KL each valid token adds w_i * beta * (1 - 1/rho), clipped or not.
    rho = _pad(RHO, fill=1.0)
    expected = expected + torch.tensor(weights, dtype=torch.float64)[:, None] * kl_coef * (
        1 - 1 / rho
    )
    _close(grad, torch.where(mask, expected, 0.0), 5e-8)
    assert (grad[~mask] == 0).all()


def test_metrics(ex):
    _, old, _ = ex
    grpo = _loss(ex, A_POP, "sample_mean", GRPO, ref_log_probs=old).metrics
    # lower bound: o2 rho 0.75 and o3 rho 0.60 (A = -1); upper: o1 1.25 and o4 1.35 (A = +1)
    assert grpo["clip_frac_low"] == pytest.approx(2 / 14)
    assert grpo["clip_frac_high"] == pytest.approx(2 / 14)
    assert grpo["num_tokens"] == 14
    # sum of rho over the 14 tokens = 14.2
    assert grpo["ratio_mean"] == pytest.approx(14.2 / 14)
    assert grpo["ratio_max"] == pytest.approx(1.35)
    # kl = sum of the k3 column / 14 = 0.3953620 / 14, logged although kl_coef = 0
    assert grpo["kl"] == pytest.approx(sum(map(sum, K3)) / 14, abs=1e-7)
    dapo = _loss(ex, A_POP, "token_mean", DAPO).metrics
    # with clip_high 0.28 only o4's 1.35 is above 1.28
    assert dapo["clip_frac_high"] == pytest.approx(1 / 14)
    assert "kl" not in dapo
