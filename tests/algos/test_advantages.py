"""Group advantages: GRPO, Dr. GRPO, RLOO against loops, invariances, edge cases, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from rlvr.algos import (
    ADVANTAGES,
    TOKEN_LEVEL,
    AdvantageInputs,
    dr_grpo_advantages,
    equal_reward_groups,
    gae,
    group_advantages,
    masked_whiten,
    rloo_advantages,
)

from .helpers import PROPS, loop_group_advantages, loop_rloo

# The registry's group estimators of one reward as plain (rewards, group_size) callables
# (gdpo reads each reward term and whitens over the batch: tests/algos/test_gdpo.py).
GROUP = [
    lambda r, G, name=name: ADVANTAGES[name](AdvantageInputs(rewards=r, group_size=G))
    for name in sorted(set(ADVANTAGES) - TOKEN_LEVEL - {"gdpo"})
]


def _rewards(seed, groups, G, *, discrete):
    g = torch.Generator().manual_seed(seed)
    if discrete:  # 0/1 rewards make all-equal groups common
        return torch.randint(0, 2, (groups * G,), generator=g).to(torch.float64)
    return torch.randn(groups * G, generator=g, dtype=torch.float64)


@PROPS
@given(
    seed=st.integers(0, 2**16),
    groups=st.integers(1, 5),
    G=st.integers(2, 8),
    discrete=st.booleans(),
    scale=st.sampled_from(["std", "none"]),
    std=st.sampled_from(["unbiased", "population"]),
    eps=st.sampled_from([0.0, 1e-6, 1e-4]),
)
def test_group_advantages_match_loop(seed, groups, G, discrete, scale, std, eps):
    r = _rewards(seed, groups, G, discrete=discrete)
    got = group_advantages(r, G, scale=scale, std=std, eps=eps)
    want = loop_group_advantages(r.tolist(), G, scale=scale, std=std, eps=eps)
    assert got.shape == (groups * G,)
    assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)


@PROPS
@given(
    seed=st.integers(0, 2**16),
    groups=st.integers(1, 5),
    G=st.integers(2, 8),
    discrete=st.booleans(),
)
def test_rloo_matches_loop(seed, groups, G, discrete):
    r = _rewards(seed, groups, G, discrete=discrete)
    want = torch.tensor(loop_rloo(r.tolist(), G), dtype=torch.float64)
    assert_close(rloo_advantages(r, G), want, rtol=1e-12, atol=1e-12)
    # RLOO = G/(G-1) * (R - mean): a rescaled Dr. GRPO advantage.
    assert_close(
        rloo_advantages(r, G), G / (G - 1) * dr_grpo_advantages(r, G), rtol=1e-12, atol=1e-12
    )


@PROPS
@given(
    seed=st.integers(0, 2**16),
    groups=st.integers(1, 4),
    G=st.integers(2, 8),
    std=st.sampled_from(["unbiased", "population"]),
    shift=st.floats(-100, 100),
    scale_by=st.floats(0.01, 100),
)
def test_grpo_invariant_to_shift_and_positive_scale_per_group(
    seed, groups, G, std, shift, scale_by
):
    # eps = 0: with eps > 0 scaling changes std + eps relative to std, so A changes slightly.
    r = _rewards(seed, groups, G, discrete=False)
    base = group_advantages(r, G, std=std, eps=0.0)
    # Transform only group 0, leave the others: groups are normalised independently.
    r2 = r.clone()
    r2[:G] = r2[:G] * scale_by + shift
    assert_close(group_advantages(r2, G, std=std, eps=0.0), base, rtol=1e-9, atol=1e-9)
    # Shift alone leaves Dr. GRPO and RLOO unchanged too.
    r3 = r.clone()
    r3[:G] += shift
    assert_close(dr_grpo_advantages(r3, G), dr_grpo_advantages(r, G), rtol=0, atol=1e-9)
    assert_close(rloo_advantages(r3, G), rloo_advantages(r, G), rtol=0, atol=1e-9)


@pytest.mark.parametrize("fn", [*GROUP, lambda r, G: group_advantages(r, G, eps=0.0)])
@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, -3.7, 1e8])
def test_all_equal_group_gives_exact_zeros(fn, value):
    # 0.1 * 3 / 3 != 0.1 in floats: the zeros must not depend on the mean rounding back.
    r = torch.tensor([value] * 3 + [0.0, 1.0, 2.0], dtype=torch.float32)
    a = fn(r, 3)
    assert (a[:3] == 0).all()
    assert (a[3:] != 0).any()
    assert torch.isfinite(a).all()


def test_equal_reward_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    assert equal_reward_groups(r, 2).tolist() == [True, False, True]


def test_population_std_and_integer_rewards():
    # G = 1 is fine for population std (and for scale='none'): a lone reward gets 0.
    assert group_advantages(torch.tensor([3.0, 5.0]), 1, std="population").tolist() == [0.0, 0.0]
    # Integer / bool rewards are promoted to float.
    a = group_advantages(torch.tensor([1, 0, 0, 1]), 4, std="population", eps=0.0)
    assert a.dtype == torch.get_default_dtype()
    assert a.tolist() == [1.0, -1.0, -1.0, 1.0]


def test_registry():
    assert set(ADVANTAGES) == {"grpo", "dr_grpo", "rloo", "gae", "reinforce_pp", "gdpo"}
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)

    def call(name, **kw):
        return ADVANTAGES[name](AdvantageInputs(rewards=r, group_size=4, **kw))

    assert_close(call("grpo"), group_advantages(r, 4))
    assert_close(call("grpo", std="population", eps=0.0), torch.tensor([1.0, -1, -1, 1]).double())
    assert_close(call("dr_grpo"), r - 0.5)
    # leave-one-out: 1 - (0 + 0 + 1)/3 = 2/3 and 0 - (1 + 0 + 1)/3 = -2/3
    assert_close(call("rloo"), torch.tensor([2, -2, -2, 2], dtype=torch.float64) / 3)


def test_registry_gae_is_whitened_gae():
    g = torch.Generator().manual_seed(3)
    tr, v = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    x = AdvantageInputs(rewards=torch.zeros(4), token_rewards=tr, values=v, response_mask=mask,
                        gamma=0.9, lam=0.8)  # fmt: skip
    raw, _ = gae(tr, v, mask, gamma=0.9, lam=0.8)
    got = ADVANTAGES["gae"](x)
    assert_close(got, masked_whiten(raw, mask))
    assert abs(float(got[mask.bool()].mean())) < 1e-12
    with pytest.raises(ValueError, match="advantage 'gae' needs values"):
        ADVANTAGES["gae"](AdvantageInputs(rewards=torch.zeros(4), token_rewards=tr,
                                          response_mask=mask))  # fmt: skip
    with pytest.raises(ValueError, match="'reinforce_pp' needs token_rewards, response_mask"):
        ADVANTAGES["reinforce_pp"](AdvantageInputs(rewards=torch.zeros(4)))


@pytest.mark.parametrize("fn", GROUP)
def test_errors(fn):
    with pytest.raises(ValueError, match=r"index 2 \(nan\)"):
        fn(torch.tensor([0.0, 1.0, float("nan"), 1.0]), 2)
    with pytest.raises(ValueError, match=r"index 0 \(inf\), 3 \(-inf\)"):
        fn(torch.tensor([float("inf"), 1.0, 0.0, -float("inf")]), 2)
    with pytest.raises(ValueError, match="not a multiple of group_size=4"):
        fn(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="1-D"):
        fn(torch.zeros(2, 4), 4)
    with pytest.raises(ValueError, match="positive int"):
        fn(torch.zeros(4), 0)


def test_option_errors():
    with pytest.raises(ValueError, match="needs group_size >= 2"):
        group_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="rloo needs group_size >= 2"):
        rloo_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="scale must be"):
        group_advantages(torch.zeros(4), 2, scale="mad")
    with pytest.raises(ValueError, match="std must be"):
        group_advantages(torch.zeros(4), 2, std="biased")
    with pytest.raises(ValueError, match="eps must be >= 0"):
        group_advantages(torch.zeros(4), 2, eps=-1.0)
