"""Math accuracy: tables of extraction and equivalence cases, hostile strings included.

Every case must finish within 1 s (the per-call math-verify limit is 0.5 s; a case that times
out also pays for the replacement worker's start). Model output never reaches eval/exec:
the hostile-code cases would print or fail loudly if it did.
"""

from __future__ import annotations

import time

import pytest

from rlvr.rewards import REWARDS, extract_answer, make_reward, math_equal
from rlvr.rewards.math import start_verifier

NESTED = "\\boxed{" + "{" * 10_000 + "7" + "}" * 10_000 + "}"
HUGE = "blah " * 200_000 + "so the answer is \\boxed{42}."  # ~1 MB

EXTRACT = [
    # (completion, number_fallback, expected)
    ("The answer is \\boxed{5}.", False, "5"),
    ("\\boxed{\\frac{1}{2}}", False, "\\frac{1}{2}"),
    ("first \\boxed{1} then \\boxed{2}", False, "2"),
    ("\\boxed{\\{1, 2\\}}", False, "\\{1, 2\\}"),
    ("\\boxed{f(x)=\\sqrt{x^{2}+1}}", False, "f(x)=\\sqrt{x^{2}+1}"),
    ("\\fbox{12}", False, "12"),
    ("so \\boxed 7 is it", False, "7"),
    ("\\boxed{$3$}", False, "3"),
    ("\\boxed{}", False, None),
    ("\\boxed{3", False, None),  # unclosed
    ("\\boxed{3 \\boxed{4}", False, "4"),
    ("<think>hmm</think><answer>17</answer>", False, "17"),
    ("<answer> 2.5 </answer>", False, "2.5"),
    ("<answer>so \\boxed{9}</answer>", False, "9"),
    ("<answer></answer>", False, None),
    ("Reasoning...\nAnswer: 34", False, "34"),
    ("Reasoning...\nanswer: $\\frac{3}{4}$", False, "\\frac{3}{4}"),
    ("Answer: 1\nmore text\nAnswer: 2.", False, "2"),
    ("**Answer:** 8", False, "8"),
    ("The final answer: no line start 5", False, None),
    ("work\n#### 72", False, "72"),
    ("no answer at all", False, None),
    ("it costs 3 dollars then 4,000 more", True, "4,000"),
    ("it costs 3 dollars then 4,000 more", False, None),
    ("x = -2.5.", True, "-2.5"),
    ("", True, None),
    (NESTED, False, "{" * 10_000 + "7" + "}" * 10_000),
    (HUGE, False, "42"),
    ("Answer:" + " " * 1_000_000 + "x", False, "x"),
    ("\\boxed{" * 100_000, False, None),
    ("{" * 1_000_000, True, None),
    ("__import__('os').system('touch /tmp/pwned')", True, None),
]


@pytest.mark.parametrize(("text", "fallback", "want"), EXTRACT, ids=range(len(EXTRACT)))
def test_extract_answer(text, fallback, want):
    t0 = time.perf_counter()
    assert extract_answer(text, number_fallback=fallback) == want
    assert time.perf_counter() - t0 < 2.0  # bounded (a hang would be minutes), with CI slack


EQUAL = [
    # equivalent forms
    ("5", "5", True),
    ("5.0", "5", True),
    ("1,000", "1000", True),
    ("\\$18", "18", True),
    ("0.5", "\\frac{1}{2}", True),
    ("1/2", "0.5", True),
    ("\\dfrac{3}{4}", "0.75", True),
    ("50\\%", "0.5", True),
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2", True),
    ("(1,2]", "(1, 2]", True),
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("x=3", "3", True),
    ("2\\pi", "\\pi \\cdot 2", True),
    ("10^{3}", "1000", True),
    ("-3", "-3.00", True),
    # near misses
    ("5", "6", False),
    ("0.51", "\\frac{1}{2}", False),
    ("[1,2]", "(1,2]", False),
    ("\\{1,2,3\\}", "\\{1,2\\}", False),
    ("1000", "100", False),
    ("-3", "3", False),
    ("\\sqrt{3}", "\\sqrt{2}", False),
    # malformed / missing
    ("", "5", False),
    ("5", "", False),
    ("\\frac{1}{", "0.5", False),
    ("}{", "1", False),
    # hostile
    ("__import__('os').system('touch /tmp/pwned')", "0", False),
    ("10**10**10", "5", False),
    ("10^{10^{10}}", "5", False),
    ("9^{9^{9}}", "9", False),
    ("{" * 10_000 + "7" + "}" * 10_000, "7", False),
    ("1" * 1_000_000, "1", False),
]


@pytest.mark.parametrize(("pred", "ref", "want"), EQUAL, ids=range(len(EQUAL)))
def test_math_equal(pred, ref, want):
    start_verifier()  # the worker's start-up (after a kill, too) is not the call's time
    t0 = time.perf_counter()
    assert math_equal(pred, ref) is want
    # 0.5 s deadline, then kill and answer: bounded, with slack for a loaded CI machine
    assert time.perf_counter() - t0 < 2.0


def test_hostile_code_is_never_run(tmp_path):
    marker = tmp_path / "pwned"
    hostile = f"\\boxed{{__import__('os').system('touch {marker}')}}"
    assert REWARDS["math"](prompts=["q"], completions=[hostile], answer=["0"]) == [0.0]
    assert not marker.exists()


def test_math_reward_scores_and_modes():
    comps = ["\\boxed{4}", "\\boxed{5}", "no answer", "Answer: 4"]
    assert REWARDS["math"](prompts=["q"] * 4, completions=comps, answer=["4"] * 4) == [
        1.0,
        0.0,
        0.0,
        1.0,
    ]
    dapo = make_reward("math", signed=True)
    assert dapo(prompts=["q"] * 4, completions=comps, answer=["4"] * 4) == [1.0, -1.0, -1.0, 1.0]
    fallback = make_reward("math", number_fallback=True)
    assert fallback(prompts=["q"], completions=["it is 4"], answer=["4"]) == [1.0]
    # an empty reference cannot be scored
    assert REWARDS["math"](prompts=["q"], completions=["\\boxed{4}"], answer=[""]) == [None]
    by_column = make_reward("math", answer_field="gold")
    assert by_column(prompts=["q"], completions=["\\boxed{4}"], answer=["ignored"], gold=["4"]) == [
        1.0
    ]


def test_math_equal_from_a_thread():
    # math-verify's SIGALRM timeout refuses non-main threads; ours must not care
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda ab: math_equal(*ab), [("1/2", "0.5"), ("10^{10^{10}}", "1")]))
    assert got == [True, False]
