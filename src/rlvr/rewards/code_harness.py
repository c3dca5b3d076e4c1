"""Assertion tests for the code reward, run where the solution cannot reach them.

Two sandboxes per sample: the solution runs alone in one (`_code_server`), the test
snippets in the other (`_code_tests`), and this process relays one JSON line at a time
between them. The tests' sandbox first runs the dataset's own code the tests may read (the
helpers of the prompt's code prefix, `given`), then takes each top-level name of the
solution that code does not bind, as either a value rebuilt from plain JSON
(`_code_wire.decode`: exact builtin types, so no object of the solution's, such as one
whose __eq__ is always True, is ever compared) or a proxy whose calls travel to the
solution as values and come back as values. The verdicts come from the
tests' sandbox on a pipe only it holds. So the solution cannot see the tests (not in its
files, memory, frames or stdin, which is a pipe of call requests), cannot replace the
harness's exec, compile, json or comparisons (they live in another process), and cannot
report a pass (its stdout is the reply channel, its prints go to stderr, and exiting early
only fails the tests that still need it).

Limits of the proxy: arguments and results must be plain values (None, bool, int, float,
str, bytes, complex, list, tuple, dict, set, frozenset) or the solution's own objects; a
test that passes a function (a lambda, say) to the solution, or that checks an argument the
solution mutated in place, fails.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import select
import time
from pathlib import Path

from rlvr.rewards.sandbox import Limits, SandboxProcess, resolve_isolation

_HERE = Path(__file__).parent


def _compiled(*names: str) -> bytes:
    """The harness program made of these files, compiled here once, as the bytes of a .pyc:
    the sandbox's interpreter (this one) runs it without compiling it again (1.1 and 1.3 ms a
    program for the two harness programs on the 2-core machine)."""
    source = "\n".join((_HERE / name).read_text() for name in names)
    code = compile(source, "main.py", "exec", dont_inherit=True)
    return importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code)


_SERVER = _compiled("_code_wire.py", "_code_server.py")
_TESTS = _compiled("_code_wire.py", "_code_tests.py")
_DEAD = (json.dumps({"err": ["SolutionError", "the solution is not running"]}) + "\n").encode()


class _Lines:
    """Lines from a pipe, each at most `cap` bytes, read with a deadline."""

    def __init__(self, pipe, cap: int):
        self.fd, self.cap, self.buf, self.eof = pipe.fileno(), cap, b"", False

    def next(self, deadline: float) -> bytes | None:
        """The next line; None at EOF, past the deadline, or when a line is too long."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if self.eof or len(self.buf) > self.cap or left <= 0:
                return None
            if not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            self.eof = not chunk
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line if len(line) <= self.cap else None


def _write(pipe, data: bytes) -> bool:
    try:
        pipe.write(data)
        pipe.flush()
        return True
    except (OSError, ValueError):
        return False


def _forward(solution: SandboxProcess, replies: _Lines, request: bytes, deadline: float):
    """The solution's reply to one request, as a checked JSON line (or a "not running"
    error when it died, hung past the deadline or sent something that is not JSON)."""
    if not _write(solution.stdin, request + b"\n"):
        return _DEAD
    line = replies.next(deadline)
    try:
        return (json.dumps(json.loads(line), allow_nan=False) + "\n").encode()
    except (TypeError, ValueError, RecursionError):  # None, not JSON, nested too deeply
        return _DEAD


class AssertionRun:
    """One sample's assertion tests: both sandboxes launched gated at construction (their
    jails build while the caller finishes something else), run by `run()`, ended by
    `close()`."""

    def __init__(self, code: str, tests: list[str], lim: Limits, mode: str, given: str = ""):
        self.tests, self.lim = tests, lim
        spec = json.dumps({"given": given, "tests": tests})
        self.solution = SandboxProcess({"main.py": _SERVER, "solution.py": code}, ["main.py"],
                                       lim, mode, pipe_stdout=True, gated=True)  # fmt: skip
        self.checker = SandboxProcess({"main.py": _TESTS, "tests.json": spec},
                                      ["main.py"], lim, mode, pipe_stdout=True, gated=True)  # fmt: skip
        try:
            self.solution.launch()
            self.checker.launch()
        except BaseException:
            self.close()
            raise

    def run(self) -> int:
        """How many of the tests pass."""
        solution, checker, lim = self.solution, self.checker, self.lim
        solution.wait_ready()
        checker.wait_ready()
        solution.go()
        checker.go()
        passed: set[int] = set()
        deadline = time.monotonic() + lim.timeout_s
        cap = max(lim.max_output_bytes, 1 << 16)
        reports, replies = _Lines(checker.stdout, cap), _Lines(solution.stdout, cap)
        while (line := reports.next(deadline)) is not None:
            msg = json.loads(line)
            if not isinstance(msg, dict):
                break
            if "op" in msg:
                if not _write(checker.stdin, _forward(solution, replies, line, deadline)):
                    break
            elif "result" in msg:
                if (
                    msg.get("ok") is True
                    and type(msg["result"]) is int
                    and 0 <= msg["result"] < len(self.tests)
                ):
                    passed.add(msg["result"])
            else:
                break  # done
        return len(passed)

    def close(self) -> None:
        self.checker.close()
        self.solution.close()


def run_assertions(code: str, tests: list[str], *, given: str = "", limits: Limits | None = None,
                   isolation: str = "auto") -> int:  # fmt: skip
    """How many of `tests` (Python snippets) pass against `code`, both sandboxed; `given`:
    the dataset's code the tests run first, whose names the solution cannot replace."""
    run = AssertionRun(code, tests, limits or Limits(), resolve_isolation(isolation), given)
    try:
        return run.run()
    finally:
        run.close()
