"""The helper that compares two runs of the same math by other arithmetic (tests/same_run.py):
discrete outcomes exactly, floats within their stated tolerance, timings never."""

import math

import pytest
import torch

from same_run import (
    DISCRETE,
    ENGINE_GAP,
    FP32_SUMS,
    Tolerance,
    assert_same_run,
    assert_same_weights,
    run_differences,
    tolerance,
)

ROW = {
    "step": 1,
    "accuracy": 0.40625,
    "reward/mean": -0.642578125,
    "groups/kept": 16,
    "generated_tokens": 3239.0,
    "loss": -0.6308132112026215,
    "grad_norm": 0.37995412945747375,
    "rollout/logprob_diff_mean": 3.8078e-07,
    "rollout/mismatch_kl_k3": 1.2e-12,
    "time/step": 2.75,
}


def test_every_tolerance_says_why():
    for tol in (FP32_SUMS, ENGINE_GAP):
        assert tol.why and tol.rel >= 0 and tol.abs >= 0


def test_keys_are_classified_by_their_longest_pattern():
    assert tolerance("accuracy", {}, FP32_SUMS) is None
    assert tolerance("reward/std", {}, FP32_SUMS) is None  # a statistic of sampled text
    assert tolerance("loss", {}, FP32_SUMS) is FP32_SUMS
    assert tolerance("rollout/mismatch_kl_k3", {"rollout/mismatch_kl": ENGINE_GAP}, FP32_SUMS) is (
        ENGINE_GAP
    )
    own = Tolerance(rel=0.0, abs=0.5, why="test")
    assert tolerance("lr", {"lr": own}, FP32_SUMS) is own  # a caller may loosen a discrete key
    assert "step" in DISCRETE


def test_the_rounding_of_another_batch_shape_is_the_same_run():
    # An AVX-512/AMX host's figures for a batch generated in parts against whole: the
    # engine-trainer gap changes by 0.5% of itself, the loss in its 7th digit.
    other = dict(ROW, **{"rollout/logprob_diff_mean": 3.8269e-07, "loss": -0.6308133})
    other["time/step"] = 9.0
    assert run_differences([ROW], [other]) == []
    assert_same_run([ROW], [other])


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("accuracy", 0.40625 + 1 / 128),  # one response scored otherwise
        ("groups/kept", 15),
        ("generated_tokens", 3240.0),
        ("loss", -0.6308132112026215 * (1 + 3e-4)),  # 3x the tolerance's 1e-4
        ("rollout/logprob_diff_mean", 2e-5),  # a real gap between engine and trainer
    ],
)
def test_a_real_difference_is_named(key, value):
    diffs = run_differences([ROW], [dict(ROW, **{key: value})])
    assert len(diffs) == 1 and diffs[0].startswith(f"row 0 (step 1): {key} ")
    with pytest.raises(AssertionError, match=key):
        assert_same_run([ROW], [dict(ROW, **{key: value})])


def test_rows_and_keys_must_match():
    assert run_differences([ROW], [ROW, ROW]) == ["1 rows against 2"]
    fewer = {k: v for k, v in ROW.items() if k != "loss"}
    assert run_differences([ROW], [fewer]) == ["row 0 (step 1): keys differ: ['loss']"]
    no_timing = {k: v for k, v in ROW.items() if k != "time/step"}
    assert run_differences([ROW], [no_timing]) == []


def test_nan_equals_nan_and_nothing_else():
    a = dict(ROW, loss=math.nan)
    assert run_differences([a], [dict(a)]) == []
    assert len(run_differences([a], [ROW])) == 1
    assert len(run_differences([ROW], [a])) == 1


def test_weights_within_the_tolerance():
    w = {"a": torch.ones(3), "b": torch.zeros(2)}
    assert_same_weights(w, {"a": torch.ones(3) + 5e-6, "b": torch.zeros(2)})
    with pytest.raises(AssertionError):
        assert_same_weights(w, {"a": torch.ones(3) + 5e-5, "b": torch.zeros(2)})
    with pytest.raises(AssertionError, match="missing"):
        assert_same_weights(w, {"a": torch.ones(3)})
    assert_same_weights({"a": torch.ones(3)}, w)  # b may name more (a tied head)


def test_keys_limit_the_comparison():
    other = dict(ROW, grad_norm=1.0)
    assert run_differences([ROW], [other], keys=["loss", "accuracy"]) == []
    assert len(run_differences([ROW], [other], keys=["grad_norm"])) == 1
    fewer = {k: v for k, v in ROW.items() if k != "loss"}
    assert "'<missing>'" in run_differences([ROW], [fewer], keys=["loss"])[0]
