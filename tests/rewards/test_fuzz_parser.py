"""Fuzzing the answer parsers with random strings: nothing escapes but a typed result."""

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlvr.rewards import extract_answer, math_equal
from rlvr.tasks import TASKS

# Text made of the characters answers are parsed from, so the parsers' branches are reached.
_alphabet = st.sampled_from(
    [
        *"0123456789+-*/^.,{}()[]\\ $%#:\nAnswerboxdfrac<>/=",
        *["\\boxed{", "<answer>", "</answer>", "Answer:", "####", "\\frac"],
    ]
)
texts = st.one_of(st.text(max_size=300), st.lists(_alphabet, max_size=120).map("".join))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts)
def test_extract_answer_returns_a_string_or_none(text):
    out = extract_answer(text)
    assert out is None or isinstance(out, str)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts, st.sampled_from(["42", "\\frac{1}{2}", "0.5", "[1, 2]", "x+1", "10\\%"]))
def test_math_equal_returns_a_bool_quickly(prediction, reference):
    start = time.perf_counter()
    assert math_equal(prediction, reference) in (True, False)
    assert time.perf_counter() - start < 5.0  # includes a possible worker restart


@settings(max_examples=300, deadline=None)
@given(texts)
def test_task_verifiers_return_bools(text):
    for task in TASKS.values():
        ex = task.make_examples("test", 1, 0)[0]
        assert task.verify(text, ex) in (True, False)
