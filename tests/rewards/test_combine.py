"""combine_rewards, the registry and user rewards: real functions, no mocks.

Every reward is called as TRL's GRPOTrainer calls one: keyword arguments only."""

from __future__ import annotations

import math
import textwrap

import pytest

from rlvr.rewards import (
    RESERVED_KWARGS,
    REWARDS,
    RewardError,
    RewardSignatureError,
    combine_rewards,
    load_user_reward,
    make_reward,
)

KW = {
    "prompts": ["q0", "q1", "q2"],
    "completions": ["<think>a</think> \\boxed{4}", "<think>b</think> \\boxed{5}", "no tags"],
    "completion_ids": [[1, 2], [3], [4, 5, 6]],
    "answer": ["4", "4", "4"],
    "group_ids": [0, 0, 0],
    "completion_lengths": [10, 20, 30],
    "truncated": [False, False, True],
    "max_new_tokens": 32,
}
COMPLETIONS = KW["completions"]


def test_weighted_sum_and_metrics():
    specs = [("math", 1.0, REWARDS["math"]), ("format", 0.5, REWARDS["format"])]
    r = combine_rewards(specs, KW)
    assert r.per_reward == {"math": [1.0, 0.0, 0.0], "format": [1.0, 1.0, 0.0]}
    assert r.total == [1.5, 0.5, 0.0]
    assert r.failures == {"math": 0, "format": 0}
    m = r.metrics()
    assert m["reward/math"] == pytest.approx(1 / 3)
    assert m["reward/total"] == pytest.approx(2 / 3)


def test_trl_reward_function_runs_unchanged():
    # as written for TRL: completions + a dataset column by name, **kwargs for the rest
    def accuracy_reward(completions, answer, **kwargs):
        assert kwargs["completion_ids"] == KW["completion_ids"]
        return [1.0 if f"{{{a}}}" in c else 0.0 for c, a in zip(completions, answer)]

    def no_kwargs(completions):  # takes only what it names
        return [float(len(c)) for c in completions]

    r = combine_rewards([("acc", 1.0, accuracy_reward), ("len", 0.0, no_kwargs)], KW)
    assert r.per_reward["acc"] == [1.0, 0.0, 0.0]
    assert r.per_reward["len"] == [float(len(c)) for c in COMPLETIONS]


def test_chat_completions_are_message_lists_and_builtins_read_them():
    chat = dict(KW)
    chat["prompts"] = [[{"role": "user", "content": q}] for q in KW["prompts"]]
    chat["completions"] = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]

    def trl_style(completions, **kwargs):
        return [1.0 if "boxed" in c[0]["content"] else 0.0 for c in completions]

    specs = [("mine", 1.0, trl_style), ("math", 1.0, REWARDS["math"])]
    r = combine_rewards(specs, chat)
    assert r.per_reward == {"mine": [1.0, 1.0, 0.0], "math": [1.0, 0.0, 0.0]}


def test_old_signature_is_named_not_a_bare_type_error():
    def old(prompts, completions, answers, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(RewardSignatureError, match=r"'answers'.*'answer'"):
        combine_rewards([("old", 1.0, old)], KW, on_error="zero")  # never scored 0


def test_none_counts_as_zero_and_is_counted():
    def half(completions, **kwargs):
        return [None if i % 2 else 1.0 for i in range(len(completions))]

    r = combine_rewards([("half", 2.0, half)], KW)
    assert r.total == [2.0, 0.0, 2.0]
    assert r.none_counts == {"half": 1}


def _breaks_on_sample_1(completions, **kwargs):
    # sees per-sample kwargs sliced alongside the completions
    assert len(kwargs["group_ids"]) == len(completions)
    if any("\\boxed{5}" in c for c in completions):
        raise KeyError("boom")
    return [1.0] * len(completions)


def test_error_names_reward_sample_and_input():
    with pytest.raises(RewardError) as e:
        combine_rewards([("fragile", 1.0, _breaks_on_sample_1)], KW)
    msg = str(e.value)
    assert "'fragile'" in msg and "sample 1" in msg and "boxed{5}" in msg and "KeyError" in msg
    assert e.value.index == 1


def test_error_input_is_truncated():
    one = {k: (v[:1] if isinstance(v, list) else v) for k, v in KW.items()}
    one["completions"] = ["x" * 10_000 + "\\boxed{5}"]
    with pytest.raises(RewardError) as e:
        combine_rewards([("fragile", 1.0, _breaks_on_sample_1)], one)
    assert len(str(e.value)) < 400


def test_on_error_zero_scores_only_the_bad_sample():
    r = combine_rewards([("fragile", 1.0, _breaks_on_sample_1)], KW, on_error="zero")
    assert r.per_reward["fragile"] == [1.0, 0.0, 1.0]
    assert r.failures == {"fragile": 1}
    assert "KeyError" in r.errors["fragile"] and "sample 1" in r.errors["fragile"]


@pytest.mark.parametrize(
    "bad_output",
    [[1.0, 2.0], "1.0", [1.0, math.nan, 0.0], [1.0, "x", 0.0], [True, 0.0, 0.0], None],
)
def test_malformed_outputs_are_errors(bad_output):
    def fn(completions, **kwargs):
        return bad_output if len(completions) == 3 else [0.0] * len(completions)

    with pytest.raises(RewardError, match="'bad'"):
        combine_rewards([("bad", 1.0, fn)], KW)


def test_finite_in_float64_but_inf_in_float32_is_refused():
    def huge(completions, **kwargs):  # 1e39 is inf once the rewards become a float32 tensor
        return [1e39 if "5" in c else 1.0 for c in completions]

    with pytest.raises(RewardError, match="not finite in float32"):
        combine_rewards([("huge", 1.0, huge)], KW)
    r = combine_rewards([("huge", 1.0, huge)], KW, on_error="zero")
    assert r.per_reward["huge"] == [1.0, 0.0, 1.0] and r.failures == {"huge": 1}
    ok = combine_rewards([("big", 1.0, lambda completions, **k: [3.4e38] * 3)], KW)
    assert ok.total == [3.4e38] * 3  # the largest float32 values are fine


@pytest.mark.parametrize("exc", [SystemExit(0), SystemExit(3), GeneratorExit()])
def test_a_reward_that_exits_is_a_failure_not_an_exit(exc):
    def exits(completions, **kwargs):
        if any("5" in c for c in completions):
            raise exc
        return [1.0] * len(completions)

    with pytest.raises(RewardError, match=type(exc).__name__):
        combine_rewards([("exits", 1.0, exits)], KW)
    r = combine_rewards([("exits", 1.0, exits)], KW, on_error="zero")
    assert r.per_reward["exits"] == [1.0, 0.0, 1.0] and r.failures == {"exits": 1}


def test_keyboard_interrupt_passes_through():
    def interrupted(completions, **kwargs):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        combine_rewards([("i", 1.0, interrupted)], KW, on_error="zero")


def test_numpy_scores_are_accepted():
    np = pytest.importorskip("numpy")
    r = combine_rewards([("np", 1.0, lambda completions, **k: np.array([0.5, 1.0, 0.0]))], KW)
    assert r.total == [0.5, 1.0, 0.0]


def test_reserved_names_cover_trl_and_the_trainer():
    assert {"prompts", "completions", "completion_ids", "trainer_state"} <= set(RESERVED_KWARGS)
    assert set(KW) - set(RESERVED_KWARGS) == set()
    assert "on_error" in RESERVED_KWARGS


def test_registry_names_and_errors():
    assert {"math", "format", "language", "soft_overlong", "reward_model", "judge", "code"} <= set(
        REWARDS
    )
    with pytest.raises(ValueError, match=r"unknown reward 'maths'.*'math'"):
        make_reward("maths")
    with pytest.raises(ValueError, match=r"no parameter 'sigend'.*'signed'"):
        make_reward("math", sigend=True)
    with pytest.raises(ValueError, match="needs a model"):
        REWARDS["reward_model"](prompts=["q"], completions=["c"], answer=["a"])


def test_functions_ignore_unknown_kwargs():
    for name in ("math", "format", "language", "soft_overlong"):
        out = REWARDS[name](**KW, some_column=[1, 2, 3])
        assert len(out) == 3


USER_FILE = textwrap.dedent(
    """
    def length_bonus(completions, *, scale=1.0, group_ids, **kwargs):
        return [scale * len(c) / 100 for c in completions]

    NOT_CALLABLE = 3
    """
)


def test_user_reward_from_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_FILE)
    fn = load_user_reward(f"{path}:length_bonus")
    assert fn(completions=["abcd"], group_ids=[0]) == [0.04]
    scaled = make_reward(f"{path}:length_bonus", scale=100.0)
    r = combine_rewards([("bonus", 1.0, scaled)], KW)
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
