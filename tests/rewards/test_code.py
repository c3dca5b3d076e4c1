"""The code reward: extraction, both test formats, partial credit, and the usual hacks."""

from __future__ import annotations

import json

import pytest

from rlvr.rewards import REWARDS, make_reward
from rlvr.rewards.code_reward import extract_code, run_tests
from rlvr.rewards.sandbox import Limits

ADD = "```python\ndef add(a, b):\n    return a + b\n```"
ASSERTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]


@pytest.mark.parametrize(
    ("completion", "want"),
    [
        (ADD, "def add(a, b):\n    return a + b\n"),
        ("```\nx = 1\n```\ntext\n```python\ny = 2\n```", "y = 2\n"),
        ("```python\na\n```\n```py\nb\n```", "b\n"),
        ("```js\nlet x\n```", "let x\n"),
        ("def f(): pass", None),
    ],
)
def test_extract_code(completion, want):
    assert extract_code(completion) == want


def test_fraction_of_assertions_passed():
    scores = REWARDS["code"](prompts=["q"], completions=[ADD], answer=[""], tests=[ASSERTS])
    assert scores == [pytest.approx(2 / 3)]


def test_stdio_tests_and_answer_as_json():
    prog = "```python\nn = int(input())\nprint(n * 2)\n```"
    tests = {"inputs": ["2\n", "5\n", "7\n"], "outputs": ["4\n", "10", "15\n"]}
    fn = make_reward("code", tests_field="cases")
    assert fn(prompts=["q"], completions=[prog], answer=[""], cases=[tests]) == [
        pytest.approx(2 / 3)
    ]
    # no column: the reference answer holds the tests as JSON
    assert REWARDS["code"](prompts=["q"], completions=[prog], answer=[json.dumps(tests)]) == [
        pytest.approx(2 / 3)
    ]


@pytest.mark.parametrize(
    "hack",
    [
        "import sys\nsys.exit(0)",
        "import os\nos._exit(0)",
        "print('PASS')\nprint('0:0')\nraise SystemExit(0)",
        "import builtins\nbuiltins.AssertionError = None\nadd = lambda a, b: 0",
        "while True: pass",
    ],
)
def test_hacks_do_not_pass(hack):
    passed, total = run_tests(hack, ["assert add(1, 2) == 3"], limits=Limits(timeout_s=0.5))
    assert (passed, total) == (0, 1)


def test_no_code_scores_zero_and_no_tests_none():
    fn = REWARDS["code"]
    assert fn(
        prompts=["q", "q"],
        completions=["no code here", ADD],
        answer=["", ""],
        tests=[ASSERTS, None],
    ) == [0.0, None]
    loose = make_reward("code", require_fence=False)
    raw = "def add(a, b):\n    return a + b\n"
    assert loose(prompts=["q"], completions=[raw], answer=[""], tests=[ASSERTS[:1]]) == [1.0]


def test_batch_runs_in_parallel_with_per_sample_results():
    good, bad = ADD, "```python\ndef add(a, b):\n    return -1\n```"
    fn = make_reward("code", workers=2, timeout_s=3.0)
    tests = [ASSERTS[:2]] * 4
    assert fn(
        prompts=["q"] * 4, completions=[good, bad, good, bad], answer=[""] * 4, tests=tests
    ) == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    ("tests", "message"),
    [
        ({"inputs": ["1\n", "2\n", "3\n"], "outputs": ["7\n"]}, "3 inputs but 1 outputs"),
        ({"inputs": ["1\n"], "outputs": "7\n"}, "must be lists"),
        ([{"input": "1\n", "output": "7\n"}, {"input": "2\n"}], 'needs "input" and "output"'),
    ],
)
def test_unpaired_stdio_cases_are_refused_not_scored_on_the_overlap(tests, message):
    """A constant program would score 1.0 on the one case that has an output."""
    constant = "```python\nprint(7)\n```"
    with pytest.raises(ValueError, match=message):
        REWARDS["code"](prompts=["q"], completions=[constant], answer=[""], tests=[tests])
