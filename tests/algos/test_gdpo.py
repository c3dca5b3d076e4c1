"""GDPO (rlvr.algos.gdpo): a hand-computed group beside GRPO's advantage of the same rewards,
a plain loop on ragged lengths, its invariance to each reward's scale and offset, the edge
cases, verl 0.9.1's `gdpo` on the same scores (tests/fixtures/verl_dppo_gdpo.json), and the
config keys."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlvr.algos import ADVANTAGES, AdvantageInputs, group_advantages
from rlvr.algos.advantages import gdpo_advantages, reward_advantages

from .helpers import loop_group_advantages

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "verl_dppo_gdpo.json"
VERL = json.loads(FIXTURE.read_text())["gdpo"]


def test_hand_computed():
    """One group of 4 equal-length responses, accuracy [1, 0, 0, 1] (weight 1) and format
    [0, 0, 1, 0] (weight 0.5), eps 0:
        A_acc = (r - 0.5) / 0.5773503 = +-0.8660254          (unbiased std)
        A_fmt = (r - 0.25) / 0.5       = [-0.5, -0.5, 1.5, -0.5]
        S = A_acc + 0.5 A_fmt = [0.6160254, -1.1160254, -0.1160254, 0.6160254]   (mean 0)
        var(S) = (2 x 0.3794873 + 1.2455127 + 0.0134619) / 3 = 0.6726497, sqrt 0.8201522
        A = S / 0.8201522 = [0.7511110, -1.3607539, -0.1414681, 0.7511110]
    GRPO on the weighted total [1, 0, 0.5, 1] (mean 0.625, std 0.4787136) gives
        [0.7833495, -1.3055824, -0.2611165, 0.7833495]:
    the wrong answer with the right format (the third) is pushed down almost twice as hard."""
    terms = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(4, 1, dtype=torch.bool)
    got = gdpo_advantages(terms, (1.0, 0.5), 4, mask, eps=0.0)
    want = torch.tensor([0.7511110, -1.3607539, -0.1414681, 0.7511110], dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-7, rtol=0)
    total = terms[0] + 0.5 * terms[1]
    grpo = group_advantages(total, 4, eps=0.0)
    torch.testing.assert_close(
        grpo, torch.tensor([0.7833495, -1.3055824, -0.2611165, 0.7833495], dtype=torch.float64),
        atol=1e-7, rtol=0,
    )  # fmt: skip


def _loop(terms, weights, G, lengths, eps=1e-6):
    """Plain floats: each reward's loop GRPO advantage, weighted sum, then the mean and
    unbiased variance over tokens (each response counted once per token)."""
    per = [loop_group_advantages(list(map(float, t)), G, eps=eps) for t in terms]
    s = [sum(w * a[i] for w, a in zip(weights, per)) for i in range(len(lengths))]
    n = sum(lengths)
    mean = sum(x * L for x, L in zip(s, lengths)) / n
    var = sum(L * (x - mean) ** 2 for x, L in zip(s, lengths)) / (n - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in s]


@pytest.mark.parametrize("seed", range(5))
def test_matches_a_plain_loop_on_ragged_lengths(seed):
    g = torch.Generator().manual_seed(seed)
    G, groups, T = 4, 3, 6
    N = G * groups
    terms = torch.stack([torch.randint(0, 2, (N,), generator=g).double(),
                         torch.randint(0, 3, (N,), generator=g).double() / 4])  # fmt: skip
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    got = gdpo_advantages(terms, (1.0, 0.3), G, mask)
    want = _loop(terms.tolist(), (1.0, 0.3), G, lengths.tolist())
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-12, rtol=0)


def test_each_reward_scale_and_offset_change_nothing():
    """r_k -> a_k r_k + b_k (a_k > 0) leaves every A_k, hence A, the same: no reward's scale
    swamps another's. GRPO on the weighted total moves."""
    g = torch.Generator().manual_seed(7)
    terms = torch.stack([torch.randint(0, 2, (16,), generator=g).double(),
                         torch.randint(0, 4, (16,), generator=g).double()])  # fmt: skip
    mask = torch.ones(16, 3, dtype=torch.bool)
    base = gdpo_advantages(terms, (1.0, 1.0), 4, mask, eps=0.0)
    scaled = torch.stack([terms[0] * 10 - 3, terms[1] * 0.01 + 2])
    torch.testing.assert_close(gdpo_advantages(scaled, (1.0, 1.0), 4, mask, eps=0.0), base)
    assert not torch.allclose(group_advantages(terms.sum(0), 4), group_advantages(scaled.sum(0), 4))


def test_edge_cases():
    mask = torch.ones(8, 2, dtype=torch.bool)
    same = torch.ones(2, 8)
    assert (gdpo_advantages(same, (1.0, 1.0), 4, mask) == 0).all()  # no reward varies
    one_token = torch.zeros(8, 2, dtype=torch.bool)
    one_token[0, 0] = True
    terms = torch.tensor([[1.0, 0, 0, 0, 1, 0, 0, 0]])
    assert (gdpo_advantages(terms, (1.0,), 4, one_token) == 0).all()  # < 2 tokens
    with pytest.raises(ValueError, match="2 weights for 1 rewards"):
        gdpo_advantages(terms, (1.0, 2.0), 4, mask)
    per = reward_advantages(torch.tensor([[1.0, 1, 0, 0], [2.0, 2, 2, 2]]), 2)
    assert per[1].abs().sum() == 0 and per[0, 2:].abs().sum() == 0  # equal groups: exactly 0
    with pytest.raises(ValueError, match="advantage 'gdpo' needs reward_terms"):
        ADVANTAGES["gdpo"](AdvantageInputs(rewards=torch.zeros(4), group_size=2,
                                           response_mask=torch.ones(4, 1)))  # fmt: skip


@pytest.mark.parametrize("case", VERL, ids=lambda c: f"seed{c['seed']}")
def test_matches_verl(case):
    """verl computes in float32 (its scores' dtype); the same float32 inputs here, compared
    at 1e-5 absolute: the whitening's sums run in another order (and in float64 here)."""
    keys, weights = case["keys"], case["weights"] or [1.0] * len(case["keys"])
    terms = torch.tensor([case["scores"][k] for k in keys], dtype=torch.float32)
    mask = torch.tensor(case["response_mask"]).bool()
    got = ADVANTAGES["gdpo"](
        AdvantageInputs(
            rewards=terms.sum(0),
            group_size=case["group_size"],
            response_mask=mask,
            reward_terms=terms,
            reward_weights=tuple(weights),
        )
    )
    want = torch.tensor(case["advantages"])  # (N, T), the row's value on its valid tokens
    torch.testing.assert_close(got[:, None].expand_as(want) * mask, want, atol=1e-5, rtol=0)


def test_the_fixture_has_weights_and_an_equal_group():
    assert any(c["weights"] for c in VERL) and any(c["weights"] is None for c in VERL)
    assert all(len(c["keys"]) >= 2 for c in VERL)


def test_config_keys():
    from rlvr.config.algorithm import Algorithm
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError

    def algo(**changes):
        return Algorithm.from_config(load_config(None, changes))

    a = algo(algo={"advantage": "gdpo"}, reward={"format_weight": 0.5})
    assert a.gdpo_terms == (("accuracy", 1.0), ("format", 0.5), ("soft_overlong", 1.0))
    a = algo(algo={"advantage": "gdpo", "gdpo_reward_keys": ["format", "accuracy"]},
             reward={"format_weight": 0.5, "accuracy_weight": 2.0})  # fmt: skip
    assert a.gdpo_terms == (("format", 0.5), ("accuracy", 2.0))
    a = algo(algo={"advantage": "gdpo"}, reward={"extra": ["mod:brevity=0.2"]}, preset="grpo")
    assert a.gdpo_terms == (("accuracy", 1.0), ("brevity", 0.2))
    assert algo().gdpo_terms == ()
    for changes, match in [
        ({"algo": {"gdpo_reward_keys": ["accuracy"]}}, r"^algo\.gdpo_reward_keys: got \['accuracy'\], expected empty unless"),
        ({"algo": {"advantage": "gdpo", "gdpo_reward_keys": ["fmt"]}}, r"^algo\.gdpo_reward_keys: got \['fmt'\], expected names of the run's reward terms \['accuracy', 'soft_overlong'\]$"),
        ({"algo": {"advantage": "gdpo"}, "rollout": {"group_size": 1}}, r"^rollout\.group_size: got 1, expected >= 2"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            algo(**changes)


def test_algorithm_reads_the_terms_by_name():
    from rlvr.config.algorithm import Algorithm
    from rlvr.config.load import load_config

    a = Algorithm.from_config(load_config(None, {"preset": "grpo", "algo": {"advantage": "gdpo"},
                                                 "reward": {"format_weight": 0.5}}))  # fmt: skip
    terms = {"accuracy": torch.tensor([1.0, 0, 0, 1]), "format": torch.tensor([0.0, 0, 1, 0])}
    mask = torch.ones(4, 1, dtype=torch.bool)
    got = a.group_advantages(terms["accuracy"] + 0.5 * terms["format"], 4, terms, mask)
    want = gdpo_advantages(torch.stack([terms["accuracy"], terms["format"]]), (1.0, 0.5), 4, mask)
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match=r"no scores for reward terms \['format'\]"):
        a.group_advantages(terms["accuracy"], 4, {"accuracy": terms["accuracy"]}, mask)
