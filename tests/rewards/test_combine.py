"""combine_rewards, the registry and user rewards: real functions, no mocks."""

from __future__ import annotations

import math
import textwrap

import pytest

from rlvr.rewards import (
    REWARDS,
    RewardError,
    combine_rewards,
    load_user_reward,
    make_reward,
)

PROMPTS = ["q0", "q1", "q2"]
COMPLETIONS = ["<think>a</think> \\boxed{4}", "<think>b</think> \\boxed{5}", "no tags"]
ANSWERS = ["4", "4", "4"]
KW = {
    "group_ids": [0, 0, 0],
    "completion_lengths": [10, 20, 30],
    "truncated": [False, False, True],
    "max_new_tokens": 32,
}


def test_weighted_sum_and_metrics():
    specs = [("math", 1.0, REWARDS["math"]), ("format", 0.5, REWARDS["format"])]
    r = combine_rewards(specs, PROMPTS, COMPLETIONS, ANSWERS, **KW)
    assert r.per_reward == {"math": [1.0, 0.0, 0.0], "format": [1.0, 1.0, 0.0]}
    assert r.total == [1.5, 0.5, 0.0]
    assert r.failures == {"math": 0, "format": 0}
    m = r.metrics()
    assert m["reward/math"] == pytest.approx(1 / 3)
    assert m["reward/total"] == pytest.approx(2 / 3)


def test_none_counts_as_zero_and_is_counted():
    def half(prompts, completions, answers, **kwargs):
        return [None if i % 2 else 1.0 for i in range(len(completions))]

    r = combine_rewards([("half", 2.0, half)], PROMPTS, COMPLETIONS, ANSWERS, **KW)
    assert r.total == [2.0, 0.0, 2.0]
    assert r.none_counts == {"half": 1}


def _breaks_on_sample_1(prompts, completions, answers, **kwargs):
    # sees per-sample kwargs sliced alongside the completions
    assert len(kwargs["group_ids"]) == len(completions)
    if any("\\boxed{5}" in c for c in completions):
        raise KeyError("boom")
    return [1.0] * len(completions)


def test_error_names_reward_sample_and_input():
    with pytest.raises(RewardError) as e:
        combine_rewards(
            [("fragile", 1.0, _breaks_on_sample_1)], PROMPTS, COMPLETIONS, ANSWERS, **KW
        )
    msg = str(e.value)
    assert "'fragile'" in msg and "sample 1" in msg and "boxed{5}" in msg and "KeyError" in msg
    assert e.value.index == 1


def test_error_input_is_truncated():
    long = ["x" * 10_000 + "\\boxed{5}"]
    with pytest.raises(RewardError) as e:
        combine_rewards([("fragile", 1.0, _breaks_on_sample_1)], ["q"], long, ["4"], **{
            k: (v[:1] if isinstance(v, list) else v) for k, v in KW.items()
        })  # fmt: skip
    assert len(str(e.value)) < 400


def test_on_error_zero_scores_only_the_bad_sample():
    r = combine_rewards(
        [("fragile", 1.0, _breaks_on_sample_1)],
        PROMPTS,
        COMPLETIONS,
        ANSWERS,
        on_error="zero",
        **KW,
    )
    assert r.per_reward["fragile"] == [1.0, 0.0, 1.0]
    assert r.failures == {"fragile": 1}


@pytest.mark.parametrize(
    "bad_output",
    [[1.0, 2.0], "1.0", [1.0, math.nan, 0.0], [1.0, "x", 0.0], [True, 0.0, 0.0]],
)
def test_malformed_outputs_are_errors(bad_output):
    def fn(prompts, completions, answers, **kwargs):
        return bad_output if len(completions) == 3 else [0.0] * len(completions)

    with pytest.raises(RewardError, match="'bad'"):
        combine_rewards([("bad", 1.0, fn)], PROMPTS, COMPLETIONS, ANSWERS, **KW)


def test_registry_names_and_errors():
    assert {"math", "format", "language", "soft_overlong", "reward_model", "judge", "code"} <= set(
        REWARDS
    )
    with pytest.raises(ValueError, match=r"unknown reward 'maths'.*'math'"):
        make_reward("maths")
    with pytest.raises(ValueError, match=r"no parameter 'sigend'.*'signed'"):
        make_reward("math", sigend=True)
    with pytest.raises(ValueError, match="needs a model"):
        REWARDS["reward_model"](["q"], ["c"], ["a"])


def test_functions_ignore_unknown_kwargs():
    for name in ("math", "format", "language", "soft_overlong"):
        out = REWARDS[name](PROMPTS, COMPLETIONS, ANSWERS, some_column=[1, 2, 3], **KW)
        assert len(out) == 3


USER_FILE = textwrap.dedent(
    """
    def length_bonus(prompts, completions, answers, *, scale=1.0, group_ids, **kwargs):
        return [scale * len(c) / 100 for c in completions]

    NOT_CALLABLE = 3
    """
)


def test_user_reward_from_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_FILE)
    fn = load_user_reward(f"{path}:length_bonus")
    assert fn(["q"], ["abcd"], ["a"], group_ids=[0]) == [0.04]
    scaled = make_reward(f"{path}:length_bonus", scale=100.0)
    r = combine_rewards([("bonus", 1.0, scaled)], PROMPTS, COMPLETIONS, ANSWERS, **KW)
    assert r.total == [float(len(c)) for c in COMPLETIONS]


def test_user_reward_from_module():
    fn = load_user_reward("rlvr.rewards.math:extract_answer")
    assert fn("\\boxed{3}") == "3"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("no_colon", "expected 'module:function'"),
        ("missing/file.py:fn", "no file"),
        ("rlvr.no_such_module:fn", "cannot import module"),
        ("rlvr.rewards.math:nope", "has no 'nope'"),
        ("{file}:NOT_CALLABLE", "not callable"),
        ("{broken}:fn", "importing .* failed: ZeroDivisionError"),
    ],
)
def test_user_reward_errors(tmp_path, spec, match):
    (tmp_path / "ok.py").write_text(USER_FILE)
    (tmp_path / "broken.py").write_text("1 / 0\n")
    spec = spec.format(file=tmp_path / "ok.py", broken=tmp_path / "broken.py")
    with pytest.raises(ValueError, match=match):
        load_user_reward(spec)
