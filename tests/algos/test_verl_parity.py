"""rlvr's objectives against verl 0.9.1's registered policy losses on the same random ragged
inputs (tests/fixtures/verl_objectives.json, written by tests/fixtures/make_verl_objectives.py
in verl's own environment): loss, gradient with respect to the log-probs, and the metrics
whose definitions agree.

Normalisers: verl's `token-mean` divides by the micro-batch's valid tokens and its
`seq-mean-token-mean` by the responses with any (rlvr's num_tokens / num_sequences of the
step); `geo_mean` takes torch.mean over every row, the empty one included, so rlvr gets
num_sequences = B there. `clip_cov` and `kl_cov` centre their covariance on one call's
tokens in verl, on the mini-batch's in rlvr: one call here, so the same means; their cases
are ones where verl's random choice is not random (tests/fixtures/make_verl_objectives.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlvr.algos.cov import ClipCovSettings, KLCovSettings
from rlvr.algos.objectives import OBJECTIVES, LossInputs, LossSettings
from rlvr.algos.sapo import SapoSettings

from .helpers import stage_totals

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "verl_objectives.json"
CASES = json.loads(FIXTURE.read_text())["cases"]
NAMES = {"cispo": "cispo", "sapo": "sapo", "geo_mean": "gmpo", "clip_cov": "clip_cov",
         "kl_cov": "kl_cov"}  # fmt: skip
AGG = {"token-mean": "token_mean", "seq-mean-token-mean": "sample_mean"}


def _settings(case) -> LossSettings:
    c = case["config"]
    pl = c.get("policy_loss", {})
    if case["loss_mode"] == "clip_cov":
        return ClipCovSettings(
            clip_low=c["clip_ratio_low"], clip_high=c["clip_ratio_high"],
            clip_cov_ratio=pl["clip_cov_ratio"], clip_cov_lb=pl["clip_cov_lb"],
            clip_cov_ub=pl["clip_cov_ub"],
        )  # fmt: skip
    if case["loss_mode"] == "kl_cov":
        return KLCovSettings(kl_cov_ratio=pl["kl_cov_ratio"], kl_cov_coef=pl["ppo_kl_coef"])
    if case["loss_mode"] == "sapo":
        return SapoSettings(agg="sample_mean", tau_pos=c["tau_pos"], tau_neg=c["tau_neg"])
    agg = "sample_mean" if case["loss_mode"] == "geo_mean" else AGG[case["loss_agg_mode"]]
    return LossSettings(clip_low=c["clip_ratio_low"], clip_high=c["clip_ratio_high"], agg=agg)


def _run(case):
    t = {k: torch.tensor(case[k], dtype=torch.float64) for k in
         ("log_probs", "old_log_probs", "advantages", "response_mask")}  # fmt: skip
    mask = t["response_mask"].bool()
    rows = float(mask.shape[0]) if case["loss_mode"] == "geo_mean" else float(mask.any(1).sum())
    logp = t["log_probs"].requires_grad_(True)
    inputs = LossInputs(
        log_probs=logp, old_log_probs=t["old_log_probs"], advantages=t["advantages"],
        response_mask=mask, num_tokens=float(mask.sum()), num_sequences=rows,
        row_ids=torch.arange(mask.shape[0]), draw_seed=0,
    )  # fmt: skip
    objective = OBJECTIVES[NAMES[case["loss_mode"]]]
    if objective.stages is not None:
        totals = stage_totals(objective, _settings(case), [inputs], draw_seed=0)
        inputs = replace(inputs, batch_stats=totals)
    out = objective.fn(inputs, _settings(case))
    (grad,) = torch.autograd.grad(out.loss, logp)
    return out, grad, t, mask


def _id(case) -> str:
    return f"{case['loss_mode']}-{case['seed']}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_loss_and_gradient_match_verl(case):
    out, grad, _, _ = _run(case)
    # verl's seq means divide by (count + 1e-8): agreement to ~1e-8 relative, not bits
    assert out.loss.item() == pytest.approx(case["loss"], rel=1e-7, abs=1e-10)
    torch.testing.assert_close(
        grad, torch.tensor(case["grad"], dtype=torch.float64), rtol=1e-7, atol=1e-10
    )


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_metrics_match_verl_where_defined_alike(case):
    """cispo: verl's pg_clipfrac is any bound cutting the weight, rlvr's low + high. sapo: no
    clip in either. geo_mean: verl counts every token whose log-ratio the clamp changed, by
    the advantage's sign; rlvr only those the bound on the advantage's side took out of the
    gradient (A > 0 above clip_high, A < 0 below -clip_low), a subset."""
    out, _, t, mask = _run(case)
    m, v = out.metrics, case["metrics"]
    high, low = v.get("actor/pg_clipfrac", 0.0), v.get("actor/pg_clipfrac_lower", 0.0)
    if case["loss_mode"] == "cispo":
        assert m["clip_frac_low"] + m["clip_frac_high"] == pytest.approx(high, rel=1e-7)
    elif case["loss_mode"] == "sapo":
        assert m["clip_frac_low"] == m["clip_frac_high"] == high == low == 0.0
    elif case["loss_mode"] == "clip_cov":  # verl's pg_clipfrac: the share Clip-Cov cut
        assert m["cov_frac"] == pytest.approx(high, rel=1e-7, abs=1e-9)
    elif case["loss_mode"] == "kl_cov":  # verl's ppo_kl: the mean |log rho|
        x = (t["log_probs"] - t["old_log_probs"]).abs()[mask].mean().item()
        assert x == pytest.approx(v["actor/ppo_kl"], rel=1e-7)
    else:
        assert m["clip_frac_high"] <= high + 1e-9 and m["clip_frac_low"] <= low + 1e-9
        x = t["log_probs"] - t["old_log_probs"]
        c = case["config"]
        adv = t["advantages"]
        n = float(mask.sum())
        side_low = (mask & (adv < 0) & (x < -c["clip_ratio_low"])).sum().item() / n
        any_low = mask & (adv < 0) & ((x < -c["clip_ratio_low"]) | (x > c["clip_ratio_high"]))
        assert m["clip_frac_low"] == pytest.approx(side_low)
        assert any_low.sum().item() / n == pytest.approx(low, rel=1e-7)


def test_the_fixture_covers_every_objective_verl_shares():
    assert {c["loss_mode"] for c in CASES} == set(NAMES)
    assert FIXTURE.stat().st_size < 300_000
