"""Code reward: run the completion's Python against test cases in the sandbox.

The program is the last ```python fenced block of the completion (or the last ``` block);
with `require_fence=False` a completion without one is run whole. A row with a `code_prefix`
column (HumanEval's prompt: the function the completion continues) runs the prefix, then the
fenced block, or, without a fence, the completion cut at the first stop sequence
(`rlvr.data.code.STOP`), so a base model's continuation and a chat model's restated function
both score. Reward = passed / total;
no code scores 0; a sample without tests gets None.

Tests come from the dataset column `tests_field` (default "tests"), or, when that column is
absent, from the reference `answer` parsed as JSON. Two formats:
  - assertions: a list of Python snippets (MBPP, HumanEval "check(...)"), or one snippet;
    one passes when it raises nothing. The snippets see the prefix's own names, run in
    their sandbox, then those of the solution's top-level names the prefix does not bind
    (`rlvr.data.code.prefix_parts`): the helpers a prompt defines and its tests call (HumanEval/32's
    `poly`, /38's `encode_cyclic`) are the dataset's, so a wrong answer cannot pass by
    redefining the helper that checks it;
  - stdin/stdout: {"inputs": [...], "outputs": [...]} (APPS, CodeContests) or a list of
    {"input": ..., "output": ...}; each case is its own sandboxed run, and passes when the
    output equals the expected one up to trailing whitespace on each line and at the end.

Anti-hacking: in assertion mode the solution and the tests run in two sandboxes and only
values pass between them (`rlvr.rewards.code_harness` lists what that defeats); in stdin/stdout
mode stdin is a pipe holding only the case's input, and this process compares the output.
"""

from __future__ import annotations

import json
import os
import re
from functools import partial

from rlvr.rewards.code_harness import AssertionRun
from rlvr.rewards.combine import completion_text
from rlvr.rewards.sandbox import Limits, PythonRun, resolve_isolation, run_pipelined
from rlvr.rewards.sandbox.budget import sandbox_bytes

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str, *, require_fence: bool = True) -> str | None:
    """The last ```python block (else the last ``` block) of `completion`, or None."""
    blocks = _FENCE.findall(completion)
    for lang, body in reversed(blocks):
        if lang.lower() in ("python", "py", "python3"):
            return body
    if blocks:
        return blocks[-1][1]
    return None if require_fence else completion


def extract_program(completion: str, prefix: str | None = None, *,
                    require_fence: bool = True) -> str | None:  # fmt: skip
    """The program a completion stands for (see the module docstring), or None."""
    if prefix is None:
        return extract_code(completion, require_fence=require_fence)
    block = extract_code(completion)
    if block is not None:
        return prefix + "\n" + block
    from rlvr.data.code import STOP

    cut = min((i for i in (completion.find(s) for s in STOP) if i >= 0), default=len(completion))
    body = completion[:cut]
    return prefix + body if body.strip() else None


def _given(prefix: str | None) -> str:
    """The dataset's part of a code prefix: its code before the function the completion
    writes (`rlvr.data.code.prefix_parts`)."""
    from rlvr.data.code import prefix_parts

    return prefix_parts(prefix)[0] if prefix else ""


def _parse_tests(tests):
    """("asserts", [snippets]) or ("stdio", [(input, output)]) or None."""
    if tests is None:
        return None
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError:
            return ("asserts", [tests]) if tests.strip() else None
        if isinstance(tests, str):
            return ("asserts", [tests])
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        inputs, outputs = tests["inputs"], tests["outputs"]
        if not (isinstance(inputs, list) and isinstance(outputs, list)):
            raise ValueError('code reward: tests {"inputs": ..., "outputs": ...} must be lists')
        if len(inputs) != len(outputs):
            raise ValueError(f"code reward: tests hold {len(inputs)} inputs but {len(outputs)} "
                             "outputs; each input needs its expected output")  # fmt: skip
        return ("stdio", [(str(i), str(o)) for i, o in zip(inputs, outputs, strict=True)])
    if isinstance(tests, list) and tests and all(isinstance(t, dict) for t in tests):
        if not all("input" in t and "output" in t for t in tests):
            raise ValueError('code reward: each stdin/stdout case needs "input" and "output"')
        return ("stdio", [(str(t["input"]), str(t["output"])) for t in tests])
    if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
        return ("asserts", list(tests)) if tests else None
    raise ValueError(f"code reward: cannot read tests of type {type(tests).__name__}")


def _same_output(got: str, want: str) -> bool:
    def norm(s: str) -> list[str]:
        return [line.rstrip() for line in s.rstrip().splitlines()]

    return norm(got) == norm(want)


class _StdioCase:
    """One stdin/stdout case as a job (`run()`: 1 when it passes, else 0)."""

    def __init__(self, code: str, stdin: str, want: str, lim: Limits, mode: str):
        self.want = want
        self.program = PythonRun({"main.py": code}, ["main.py"], stdin, lim, mode)

    def run(self) -> int:
        r = self.program.run()
        return int(r.returncode == 0 and not r.timed_out and _same_output(r.stdout, self.want))

    def close(self) -> None:
        self.program.close()


def _jobs(code: str, parsed, lim: Limits, mode: str, given: str = "") -> list:
    """The sandboxed jobs that score `code` (each job's `run()`: how many tests it passed);
    `given`: the dataset's code the assertions run before taking the solution's names."""
    kind, cases = parsed
    if kind == "stdio":
        return [partial(_StdioCase, code, stdin, want, lim, mode) for stdin, want in cases]
    return [partial(AssertionRun, code, cases, lim, mode, given)]


def run_tests(code: str, tests, *, prefix: str | None = None, limits: Limits | None = None,
              isolation: str = "auto"):  # fmt: skip
    """(passed, total) for the program `code` against `tests` (either format above);
    `prefix`: the code prefix `code` begins with, whose helpers the assertions take from
    the dataset."""
    parsed = _parse_tests(tests)
    if parsed is None:
        return 0, 0
    mode = resolve_isolation(isolation)
    jobs = _jobs(code, parsed, limits or Limits(), mode, _given(prefix))
    return sum(run_pipelined(jobs, 1)), len(parsed[1])


def make_code_reward(
    *,
    tests_field: str = "tests",
    prefix_field: str = "code_prefix",
    require_fence: bool = True,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_procs: int = 32,
    workers: int | None = None,
    isolation: str = "auto",
):
    """Code reward (see the module docstring); `prefix_field` names the column of the code
    a completion continues; `workers` jobs (a sample's assertions, or one stdin/stdout case)
    run at once, each worker building its next job's jails while one runs
    (`rlvr.rewards.sandbox.pipeline`; default min(4, CPUs)); limits apply to each sandboxed
    run. `isolation`: "auto" or "namespaces"
    (refuse to run where Linux namespaces fail) or "none" (the explicit opt-out); the trainer
    sets it from `reward.sandbox_isolation`."""
    limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb, max_procs=max_procs)
    n_workers = workers or min(4, os.cpu_count() or 1)

    def code(completions, answer=None, **kwargs) -> list[float | None]:
        tests = kwargs.get(tests_field, answer)
        if tests is None:
            raise ValueError(f"code needs the column {tests_field!r} or the reference 'answer'")
        completions = [completion_text(c) for c in completions]
        prefixes = kwargs.get(prefix_field) or [None] * len(completions)

        mode = resolve_isolation(isolation)
        parsed = [_parse_tests(t) for t in tests[: len(completions)]]
        owners, jobs, passed = [], [], [0] * len(completions)
        for i, c in enumerate(completions):
            program = extract_program(c, prefixes[i], require_fence=require_fence)
            if parsed[i] is not None and program is not None and program.strip():
                for job in _jobs(program, parsed[i], limits, mode, _given(prefixes[i])):
                    owners.append(i)
                    jobs.append(job)
        for i, n in zip(owners, run_pipelined(jobs, n_workers), strict=True):
            passed[i] += n
        # a sample without tests: None; without code: 0
        return [None if p is None else passed[i] / max(1, len(p[1])) for i, p in enumerate(parsed)]

    # what its sandboxes may hold at once, for the memory guard (rlvr.run.memory)
    code.sandbox_bytes = n_workers * sandbox_bytes(limits)
    return code
