"""Format, language and soft-overlong rewards: tables of good, malformed and near-miss cases."""

from __future__ import annotations

import pytest

from rlvr.rewards import REWARDS, make_reward

FORMAT = [
    # (prompt, completion, strict, lenient)
    ("q", "<think>a</think> 5", 1.0, 1.0),
    ("q", "<think>\nstep\n</think>\n\\boxed{5}", 1.0, 1.0),
    ("q", "  <think>a</think>5  ", 1.0, 1.0),
    ("q", "<think></think> 5", 0.0, 1.0),  # empty reasoning
    ("q", "<think>a</think>", 0.0, 0.0),  # no answer
    ("q", "<think>a</think>   \n", 0.0, 0.0),
    ("q", "pre <think>a</think> 5", 0.0, 1.0),  # text before <think>
    ("q", "<think>a</think> 5 <think>b</think> 6", 0.0, 1.0),  # two blocks
    ("q", "<think>a 5", 0.0, 0.0),  # never closed
    ("q", "a</think> 5", 0.0, 0.0),  # never opened
    ("q", "5", 0.0, 0.0),
    ("q", "", 0.0, 0.0),
    ("assistant\n<think>", "reasoning</think> 5", 1.0, 1.0),  # prompt opened the tag
]


@pytest.mark.parametrize(("prompt", "completion", "strict", "lenient"), FORMAT)
def test_format(prompt, completion, strict, lenient):
    assert REWARDS["format"](prompts=[prompt], completions=[completion], answer=["5"]) == [strict]
    assert make_reward("format", mode="lenient")(
        prompts=[prompt], completions=[completion], answer=["5"]
    ) == [lenient]


@pytest.mark.parametrize(
    ("completion", "want"),
    [
        ("<think>a</think>\n<answer>5</answer>", 1.0),
        ("<think>a</think><answer>5</answer> trailing", 0.0),
        ("<think>a</think><answer> </answer>", 0.0),
        ("<think>a</think> 5", 0.0),
    ],
)
def test_format_with_answer_tag(completion, want):
    fn = make_reward("format", answer_tag=True)
    assert fn(prompts=["q"], completions=[completion], answer=["5"]) == [want]


def test_format_rejects_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        make_reward("format", mode="loose")


LANGUAGE = [
    # (completion, target, want)
    ("<think>all english words here</think> 5", "en", 1.0),
    ("<think>half 中文</think> 5", "en", 1 / 3),  # each CJK character is a word
    ("<think>x = 2 + 3 = 5</think>", "en", 1.0),  # digits ignored, "x" is a word
    ("<think>中文推理</think> answer", "zh", 1.0),
    ("<think>中文 reasoning</think>", "zh", 2 / 3),
    ("<think>über straße</think>", "en", 0.0),
    ("<think>1 + 1 = 2</think> two", "en", None),  # no words in the reasoning
    ("no tags, plain english", "en", 1.0),
    ("opened by the prompt</think> answer 中", "en", 1.0),
]


@pytest.mark.parametrize(("completion", "target", "want"), LANGUAGE)
def test_language(completion, target, want):
    got = make_reward("language", target=target)(
        prompts=["q"], completions=[completion], answer=["5"]
    )[0]
    assert got == (pytest.approx(want) if want is not None else None)


def test_language_unknown_target():
    with pytest.raises(ValueError, match="target"):
        make_reward("language", target="xx")


def test_soft_overlong_follows_dapo_eq13():
    fn = make_reward("soft_overlong", cache_len=4)
    lengths = [0, 6, 7, 8, 10, 11]
    # max_len 10, cache 4: free up to 6, then (6 - |y|) / 4, -1 past 10
    got = fn(
        prompts=["q"] * 6,
        completions=["c"] * 6,
        answer=["a"] * 6,
        completion_lengths=lengths,
        max_new_tokens=10,
    )
    assert got == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])


def test_soft_overlong_default_cache_is_a_fifth():
    got = REWARDS["soft_overlong"](
        prompts=["q"] * 2,
        completions=["c"] * 2,
        answer=["a"] * 2,
        completion_lengths=[80, 90],
        max_new_tokens=100,
    )
    assert got == pytest.approx([0.0, -0.5])


def test_soft_overlong_needs_lengths():
    with pytest.raises(ValueError, match="completion_lengths"):
        REWARDS["soft_overlong"](prompts=["q"], completions=["c"], answer=["a"], max_new_tokens=10)
