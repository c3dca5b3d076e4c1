"""Rollout correction's weights and metrics: hand-computed cases per mode, the vectorised code
against a plain loop, exact combination over micro-batches, and verl 0.9.1's helpers."""

import json
import math
from pathlib import Path

import pytest
import torch

from rlvr.algos.rollout_correction import (
    SUM_KEYS,
    CorrectionSettings,
    correction_metrics,
    rollout_weights,
)

FIXTURE = Path(__file__).parent.parent / "fixtures" / "verl_rollout_corr.json"
LN2 = math.log(2.0)


def _weights(old, behaviour, mask, **kw):
    w, sums = rollout_weights(
        torch.tensor(old), torch.tensor(behaviour), torch.tensor(mask), CorrectionSettings(**kw)
    )
    return w, correction_metrics({k: sums[k] for k in SUM_KEYS}, sums["is/weight_max"])


def test_token_truncation_by_hand():
    # w = 1, 2, 4, 1/2 on the valid tokens; C = 3 truncates the 4
    old = [[0.0, LN2, 2 * LN2], [-LN2, 7.0, 0.0]]
    w, m = _weights(old, [[0.0] * 3] * 2, [[1, 1, 1], [1, 0, 0]], cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.0, 0.0]]))
    assert m["rollout/is_weight_mean"] == pytest.approx(6.5 / 4)
    assert m["rollout/is_weight_max"] == pytest.approx(4.0)  # before truncation
    assert m["rollout/is_ess"] == pytest.approx(6.5**2 / (4 * (1 + 4 + 9 + 0.25)))
    assert m["rollout/is_truncated_frac"] == pytest.approx(0.25)
    assert m["rollout/is_masked_frac"] == 0.0


def test_sequence_weight_is_the_product_by_hand():
    # row 0: 2 * 2 * 1/2 = 2 on each of its 3 tokens; row 1: 4 on its one token, cut to 3
    old = [[LN2, LN2, -LN2], [2 * LN2, 5.0, 5.0]]
    w, m = _weights(old, [[0.0] * 3] * 2, [[1, 1, 1], [1, 0, 0]], level="sequence", cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0, 2.0], [3.0, 0.0, 0.0]]))
    assert m["rollout/is_weight_mean"] == pytest.approx(9.0 / 4)  # over tokens
    assert m["rollout/is_truncated_frac"] == pytest.approx(0.25)


def test_token_masking_by_hand():
    # band [0.6, 1.5]: w = 2 and 1/2 are zeroed, 1 and 1.2 kept; no truncation
    old = [[0.0, LN2, -LN2, math.log(1.2)]]
    w, m = _weights(old, [[0.0] * 4], [[1, 1, 1, 1]], cap=None, mask_low=0.6, mask_high=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 0.0, 1.2]]))
    assert m["rollout/is_masked_frac"] == pytest.approx(0.5)
    assert m["rollout/is_truncated_frac"] == 0.0


def test_sequence_masking_by_hand():
    # rows' products 4 and 1: the band [0.5, 2] zeroes all of row 0, keeps row 1
    old = [[LN2, LN2], [LN2, -LN2]]
    w, m = _weights(old, [[0.0] * 2] * 2, [[1, 1], [1, 1]], level="sequence", mask_high=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    assert m["rollout/is_masked_frac"] == pytest.approx(0.5)
    assert m["rollout/is_ess"] == pytest.approx(2.0**2 / (4 * 2.0))


def test_identical_policies_give_weight_one_and_garbage_padding_is_ignored():
    old = torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    behaviour = torch.where(mask.bool(), old, torch.tensor(float("nan")))
    for level in ("token", "sequence"):
        w, sums = rollout_weights(old, behaviour, mask, CorrectionSettings(level=level))
        assert torch.equal(w, mask.float())
        assert sums["is/weight_max"] == 1.0


def _loop(old, behaviour, mask, s: CorrectionSettings):
    """The formula written out, one token at a time."""
    B, T = len(old), len(old[0])
    out = [[0.0] * T for _ in range(B)]
    for i in range(B):
        seq = sum(old[i][t] - behaviour[i][t] for t in range(T) if mask[i][t])
        for t in range(T):
            if not mask[i][t]:
                continue
            lr = seq if s.level == "sequence" else old[i][t] - behaviour[i][t]
            w = math.exp(min(max(lr, -20.0), 20.0))
            if (s.mask_low is not None and w < s.mask_low) or (
                s.mask_high is not None and w > s.mask_high
            ):
                w = 0.0
            out[i][t] = min(w, s.cap) if s.cap is not None else w
    return out


SETTINGS = [
    CorrectionSettings("token", cap=2.0),
    CorrectionSettings("sequence", cap=2.0),
    CorrectionSettings("token", cap=None, mask_low=0.5, mask_high=2.0),
    CorrectionSettings("sequence", cap=None, mask_low=0.5, mask_high=2.0),
    CorrectionSettings("token", cap=1.5, mask_low=0.8),
    CorrectionSettings("sequence", cap=None),
]


@pytest.mark.parametrize("s", SETTINGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_vectorised_equals_the_loop_on_ragged_inputs(s, seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 9
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    behaviour = old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    w, _ = rollout_weights(old, behaviour, mask, s)
    want = torch.tensor(_loop(old.tolist(), behaviour.tolist(), mask.tolist(), s), dtype=w.dtype)
    torch.testing.assert_close(w, want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("s", SETTINGS)
def test_metrics_combine_exactly_over_micro_batches(s):
    g = torch.Generator().manual_seed(3)
    B, T = 8, 7
    old = -torch.rand(B, T, generator=g, dtype=torch.float64)
    behaviour = old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.arange(T)[None] < torch.randint(1, T + 1, (B,), generator=g)[:, None]

    def metrics(parts):
        total, top = dict.fromkeys(SUM_KEYS, 0.0), -math.inf
        for rows in parts:
            _, sums = rollout_weights(old[rows], behaviour[rows], mask[rows], s)
            for k in SUM_KEYS:
                total[k] += sums[k]
            top = max(top, sums["is/weight_max"])
        return correction_metrics(total, top)

    whole = metrics([list(range(B))])
    split = metrics([[0, 5], [1], [2, 3, 4], [6, 7]])
    assert whole == pytest.approx(split, rel=1e-12)


def test_settings_out_of_range_name_the_field():
    with pytest.raises(ValueError, match=r"^cap: got 0.0, expected none or > 0$"):
        CorrectionSettings(cap=0.0)
    with pytest.raises(ValueError, match=r"^mask_high: got 0.5"):
        CorrectionSettings(mask_low=1.0, mask_high=0.5)


def _fixture():
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("case", _fixture()["cases"], ids=lambda c: c["name"])
def test_agrees_with_verl_0_9_1(case):
    """Weights and metrics against verl's `compute_rollout_correction_weights` (and its
    rejection mask for the masking modes) on the same ragged inputs
    (tests/fixtures/make_verl_rollout_corr.py)."""
    data = _fixture()["inputs"]
    old, behaviour = torch.tensor(data["old"]), torch.tensor(data["rollout"])
    mask = torch.tensor(data["mask"])
    s = CorrectionSettings(**case["rlvr"])
    w, sums = rollout_weights(old, behaviour, mask, s)
    m = correction_metrics({k: sums[k] for k in SUM_KEYS}, sums["is/weight_max"])
    if "weights" in case:
        torch.testing.assert_close(w, torch.tensor(case["weights"]), rtol=1e-6, atol=1e-7)
    if "keep" in case:  # verl's rejection mask: kept tokens are those with a nonzero weight
        assert torch.equal((w > 0) | ~mask.bool(), torch.tensor(case["keep"]).bool() | ~mask.bool())
    for ours, theirs in case.get("metrics", {}).items():
        assert m[ours] == pytest.approx(theirs, rel=1e-5), ours
