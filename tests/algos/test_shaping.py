"""DAPO soft overlong punishment (Eq. 13) and overlong filtering."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from rlvr.algos import overlong_filter_mask, soft_overlong_penalty

from .helpers import loop_soft_overlong


def test_three_cases_at_the_boundaries():
    # max_len 20, cache_len 4: free up to 16, linear ramp over 17..20, -1 beyond.
    lengths = torch.tensor([0, 15, 16, 17, 18, 19, 20, 21, 100])
    want = [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]
    assert soft_overlong_penalty(lengths, max_len=20, cache_len=4).tolist() == want


def test_paper_setting():
    # L_max 20480, L_cache 4096: the expected maximum 16384 is free, one token more costs 1/4096.
    lengths = torch.tensor([16384, 16385, 18432, 20480, 20481])
    got = soft_overlong_penalty(lengths, max_len=20480, cache_len=4096)
    assert_close(got, torch.tensor([0.0, -1 / 4096, -0.5, -1.0, -1.0]))


@pytest.mark.parametrize(("max_len", "cache_len"), [(20, 4), (7, 6), (100, 1), (50, 25)])
def test_matches_loop(max_len, cache_len):
    lengths = torch.arange(0, max_len + 5)
    want = [loop_soft_overlong(n, max_len, cache_len) for n in lengths.tolist()]
    got = soft_overlong_penalty(lengths, max_len=max_len, cache_len=cache_len)
    assert got.dtype == torch.get_default_dtype()
    assert_close(got, torch.tensor(want), rtol=0, atol=1e-7)
    # float lengths keep their dtype and any shape is fine
    f = soft_overlong_penalty(lengths.double().view(1, -1), max_len=max_len, cache_len=cache_len)
    assert f.dtype == torch.float64 and f.shape == (1, len(want))
    assert_close(f.flatten(), torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-15)


def test_penalty_errors():
    n = torch.tensor([3])
    with pytest.raises(ValueError, match="need 0 < cache_len < max_len"):
        soft_overlong_penalty(n, max_len=10, cache_len=10)
    with pytest.raises(ValueError, match="need 0 < cache_len < max_len"):
        soft_overlong_penalty(n, max_len=10, cache_len=0)
    with pytest.raises(TypeError, match="max_len must be an int"):
        soft_overlong_penalty(n, max_len=10.0, cache_len=2)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        soft_overlong_penalty(torch.tensor([-1]), max_len=10, cache_len=2)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.long])
def test_overlong_filter_mask(dtype):
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]]).to(dtype)
    truncated = torch.tensor([False, True, False])
    out = overlong_filter_mask(mask, truncated)
    assert out.dtype == dtype
    assert out.tolist() == torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]]).to(dtype).tolist()
    assert mask[1].tolist() == torch.ones(3).to(dtype).tolist()  # input untouched


def test_overlong_filter_mask_errors():
    mask = torch.ones(2, 3)
    with pytest.raises(TypeError, match="truncated must be a bool tensor"):
        overlong_filter_mask(mask, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"truncated has shape \(3,\), expected \(2,\)"):
        overlong_filter_mask(mask, torch.tensor([True, False, True]))
    with pytest.raises(ValueError, match=r"response_mask must be \(B, T\)"):
        overlong_filter_mask(torch.ones(3), torch.tensor([True, False, True]))
