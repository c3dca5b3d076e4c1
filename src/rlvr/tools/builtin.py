"""The built-in tools: `calc` (one integer operation) and `python` (code in rlvr's sandbox).

Both are plain functions with type hints and a docstring, as any user tool is: the schema a
chat template shows the model comes from them (`transformers.utils.get_json_schema`).
"""

from __future__ import annotations

import re
import signal

from rlvr.rewards.sandbox import Limits, run_python

_OPERATION = re.compile(r"\s*(-?\d{1,12})\s*([-+*])\s*(-?\d{1,12})\s*")


def calc(expression: str) -> str:
    """Compute one operation on two integers: addition, subtraction or multiplication.

    Args:
        expression: one operation such as 347*28, 9716+519 or 80-17
    """
    m = _OPERATION.fullmatch(str(expression))
    if m is None:
        raise ValueError("calc takes one operation such as 12*34")
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return str(a + b if op == "+" else a - b if op == "-" else a * b)


def make_python_tool(isolation: str = "auto", timeout_s: float = 5.0, memory_mb: int = 512):
    """The `python` tool, running code in rlvr's sandbox (`rlvr.rewards.sandbox`) under
    `isolation` with a wall-clock limit of `timeout_s`."""
    limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=1 << 16)

    def python(code: str) -> str:
        """Run a Python program in a sandbox and return what it prints.

        Args:
            code: the program; print the values you need
        """
        result = run_python(str(code), limits=limits, isolation=isolation)
        # The wall clock (timed_out) or RLIMIT_CPU (ceil(timeout_s) CPU seconds, soft = hard:
        # SIGKILL) stops a long program, whichever comes first on a loaded machine.
        if result.timed_out or result.returncode == -signal.SIGKILL:
            raise TimeoutError(f"the program ran past {timeout_s:g} s")
        if result.returncode != 0:
            lines = result.stderr.strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"exit status {result.returncode}")
        return result.stdout

    return python


python = make_python_tool()

BUILTIN_TOOLS = {"calc": calc, "python": python}
