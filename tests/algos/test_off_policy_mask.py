"""Off-policy sequence masking (rlvr.algos.off_policy_mask): a hand-computed case, TRL 1.16's
`get_off_policy_mask` on the same inputs (tests/fixtures/trl_off_policy_mask.json), the loss it
gives under two objectives against a plain loop, micro-batch splits, garbage at masked
positions, rollout correction's weights beside it, and its sums."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlvr.algos.objectives import OBJECTIVES, LossInputs, LossSettings
from rlvr.algos.off_policy_mask import (
    off_policy_keep,
    sequence_kl,
    sequence_mask_metrics,
    with_sequence_mask,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trl_off_policy_mask.json"
TRL = json.loads(FIXTURE.read_text())["cases"]


def _inputs(logp, old, adv, mask, behaviour=None, **kw):
    return LossInputs(
        log_probs=logp, old_log_probs=old, advantages=adv, response_mask=mask,
        behaviour_log_probs=behaviour, **kw,
    )  # fmt: skip


def test_hand_computed():
    """Rows of 2 valid tokens, log mu - log pi = (0.4, 0.2) -> kl 0.3 and (0.05, 0.05) -> 0.05;
    a third row like the first with A > 0; a fourth with no valid token. Threshold 0.1, A =
    -1, -1, +1, -1: the first row (kl 0.3 > 0.1, A < 0) is dropped; the second (0.05) kept; the
    third kept for its positive advantage; the empty one kept (kl 0)."""
    logp = torch.full((4, 3), -1.0)
    mu = logp + torch.tensor([[0.4, 0.2, 9.0], [0.05, 0.05, 9.0], [0.4, 0.2, 9.0], [9.0] * 3])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    kl = sequence_kl(mu, logp, mask)
    torch.testing.assert_close(kl, torch.tensor([0.3, 0.05, 0.3, 0.0]))
    keep = off_policy_keep(torch.tensor([-1.0, -1.0, 1.0, -1.0]), kl, mask, 0.1)
    assert keep.any(1).tolist() == [False, True, True, False]
    assert (keep == (mask & torch.tensor([False, True, True, False])[:, None])).all()
    inputs, sums = with_sequence_mask(
        _inputs(logp, logp, torch.tensor([-1.0, -1.0, 1.0, -1.0]), mask, mu), 0.1
    )
    assert sums == {"opsm/sequences": 3.0, "opsm/masked": 1.0, "opsm/kl_sum": pytest.approx(0.65)}
    m = sequence_mask_metrics(sums)
    assert m["rollout/off_policy_masked_frac"] == pytest.approx(1 / 3)
    assert m["rollout/off_policy_seq_kl"] == pytest.approx(0.65 / 3)
    assert inputs.rollout_weights.tolist()[0] == [0.0, 0.0, 0.0]


def _trl(case):
    def t(key):
        rows = [[math.nan if x is None else x for x in r] for r in case[key]]
        return torch.tensor(rows, dtype=torch.float64)

    adv = torch.tensor(case["advantages"], dtype=torch.float64)
    return adv, t("log_probs"), t("sampling_log_probs"), t("response_mask").bool()


@pytest.mark.parametrize("case", TRL, ids=lambda c: f"seed{c['seed']}-{c['threshold']}")
def test_matches_trl(case):
    """The same keep decision per response, exactly (a comparison of the same float64 sums)."""
    adv, logp, mu, mask = _trl(case)
    keep = off_policy_keep(adv, sequence_kl(mu, logp, mask), mask, case["threshold"])
    want = torch.tensor(case["keep"]).bool()
    rows = mask.any(1)
    assert (keep.any(1)[rows] == want[rows]).all()
    assert want[~rows].all() and not keep[~rows].any()  # an empty row: kept by TRL, no tokens


def test_the_fixture_masks_and_keeps():
    assert any(0.0 in c["keep"] for c in TRL) and any(all(c["keep"]) for c in TRL)


def _loop_loss(logp, old, mu, adv, mask, threshold, lo, hi):
    """Plain floats: DAPO's clipped surrogate, each token times its response's keep, summed
    over valid tokens / their count (TRL's `dapo` loss with `off_policy_mask_threshold`)."""
    total, n = 0.0, 0
    for i in range(logp.shape[0]):
        valid = [t for t in range(logp.shape[1]) if mask[i, t]]
        kl = sum(0.0 if math.isnan(d) else d for d in
                 (float(mu[i, t]) - float(logp[i, t]) for t in valid)) / max(len(valid), 1)  # fmt: skip
        a = float(adv[i])
        keep = a >= 0 or kl <= threshold
        for t in valid:
            rho = math.exp(float(logp[i, t]) - float(old[i, t]))
            term = -min(rho * a, min(max(rho, 1 - lo), 1 + hi) * a)
            total += term if keep else 0.0
            n += 1
    return total / max(n, 1)


@pytest.mark.parametrize("case", TRL, ids=lambda c: f"seed{c['seed']}-{c['threshold']}")
def test_loss_matches_a_plain_loop(case):
    adv, logp, mu, mask = _trl(case)
    old = logp + 0.1
    s = LossSettings(clip_low=0.2, clip_high=0.28, agg="token_mean")
    inputs, _ = with_sequence_mask(_inputs(logp, old, adv, mask, mu), case["threshold"])
    out = OBJECTIVES["clip"].fn(inputs, s)
    want = _loop_loss(logp, old, mu, adv, mask, case["threshold"], 0.2, 0.28)
    assert out.loss.item() == pytest.approx(want, rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("name", ["clip", "cispo", "sapo", "dppo_tv"])
def test_split_and_garbage_change_nothing(name):
    """Any objective: the masked loss summed over micro-batches is the whole batch's, and NaN
    or inf at masked positions of every input changes neither loss nor gradient."""
    adv, logp0, mu, mask = _trl(TRL[2])
    logp0 = logp0.clamp(max=-0.05)
    logp = logp0.clone().requires_grad_(True)
    old = logp0 + 0.02
    objective = OBJECTIVES[name]
    s = objective.settings()
    counts = dict(num_tokens=float(mask.sum()), num_sequences=float(mask.any(1).sum()))

    def loss(lp, o, m, a, b):
        inputs, _ = with_sequence_mask(_inputs(lp, o, a, m, b, **counts), 0.0)
        return objective.fn(inputs, s).loss

    whole = loss(logp, old, mask, adv, mu)
    (g_whole,) = torch.autograd.grad(whole, logp)
    parts = sum(loss(logp[r], old[r], mask[r], adv[r], mu[r]) for r in (slice(0, 3), slice(3, 8)))
    (g_parts,) = torch.autograd.grad(parts, logp)
    torch.testing.assert_close(parts, whole, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(g_parts, g_whole, atol=1e-12, rtol=1e-12)
    junk = torch.full_like(old, float("nan"))
    again = loss(logp, torch.where(mask, old, junk), mask, adv, torch.where(mask, mu, junk))
    (g_again,) = torch.autograd.grad(again, logp)
    assert again.item() == whole.item()
    torch.testing.assert_close(g_again, g_whole, atol=0, rtol=0)


def test_rollout_weights_and_the_mask_multiply():
    adv, logp, mu, mask = _trl(TRL[1])
    w = torch.rand(logp.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    inputs, _ = with_sequence_mask(_inputs(logp, logp, adv, mask, mu, rollout_weights=w), 0.05)
    keep = off_policy_keep(adv, sequence_kl(mu, logp, mask), mask, 0.05)
    torch.testing.assert_close(inputs.rollout_weights, w * keep)


def test_without_engine_log_probs_it_measures_from_pi_old():
    logp = torch.full((2, 2), -1.0)
    old = logp + torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    inputs, sums = with_sequence_mask(_inputs(logp, old, torch.tensor([-1.0, -1.0]), mask), 0.5)
    assert inputs.rollout_weights.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert sums["opsm/masked"] == 1.0


def test_off_is_unchanged():
    inputs = _inputs(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2))
    assert with_sequence_mask(inputs, None) == (inputs, None)
    assert sequence_mask_metrics({})["rollout/off_policy_masked_frac"] == 0.0


def test_config_key():
    from rlvr.config.algorithm import Algorithm
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError

    cfg = load_config(None, {"algo": {"off_policy_mask_threshold": 0.5}})
    assert Algorithm.from_config(cfg).sequence_mask == 0.5
    assert Algorithm.from_config(load_config(None, {})).sequence_mask is None
    with pytest.raises(ConfigError, match=r"^algo\.off_policy_mask_threshold: got -0\.1, expected"):
        Algorithm.from_config(load_config(None, {"algo": {"off_policy_mask_threshold": -0.1}}))


def test_trls_name_is_an_alias():
    from rlvr.api.trl import trl_changes

    got = trl_changes({"off_policy_mask_threshold": 0.5}).changes
    assert got == {"algo": {"off_policy_mask_threshold": 0.5}}
