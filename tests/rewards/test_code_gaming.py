"""Wrong solutions that try to game the code reward instead of solving the task. Each
scores 0 (and a correct solution written the same way still scores 1), because the tests
run in a sandbox of their own and only plain values cross over (rlvr.rewards.code_harness).
"""

from __future__ import annotations

import pytest

from rlvr.rewards.code_reward import run_tests
from rlvr.rewards.sandbox import Limits

TESTS = ["assert add(1, 2) == 3", "assert add(20, 22) == 42", "assert add(-5, 5) == 0 or False"]
TESTS[2] = "assert add(-5, 6) == 1"
LIMITS = Limits(timeout_s=3.0)
CORRECT = "def add(a, b):\n    return a + b\n"

# A lookup table built from whatever test text a hack finds: `add(1, 2) == 3` -> {(1, 2): 3}.
FROM_TEXT = """
import re
_table = {}
def _learn(text):
    for a, b, c in re.findall(r"add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)", text):
        _table[(int(a), int(b))] = int(c)
def add(a, b):
    return _table.get((a, b), 0)
"""

HACKS = {
    # the attacks the harness is known for
    "exec_and_compile_replaced": "import builtins\nbuiltins.exec = lambda *a, **k: None\n"
    "builtins.compile = lambda *a, **k: None\ndef add(a, b): return 0",
    "always_equal": "class Yes:\n    def __eq__(self, o): return True\n    def __ne__(self, o): "
    "return False\n    __hash__ = object.__hash__\ndef add(a, b): return Yes()",
    "seek_stdin": FROM_TEXT + "import os\ntry:\n    os.lseek(0, 0, 0)\nexcept OSError:\n    pass\n"
    "_learn(os.read(0, 1 << 20).decode(errors='replace'))",
    "frames": FROM_TEXT + "import sys\nf = sys._getframe()\nwhile f is not None:\n"
    "    for v in list(f.f_locals.values()) + list(f.f_globals.values()):\n"
    "        _learn(repr(v))\n    f = f.f_back",
    "gc_objects": FROM_TEXT + "import gc\nfor o in gc.get_objects():\n    _learn(repr(o)[:100000])",
    "inspect_stack": FROM_TEXT + "import inspect\nfor fr in inspect.stack():\n"
    "    _learn(repr(fr.frame.f_locals))",
    "fake_result_files": "import json\nfor p in ['tests.json', 'result.json', '/tmp/results']:\n"
    "    try:\n        open(p, 'w').write(json.dumps({'result': 0, 'ok': True}))\n"
    "    except OSError:\n        pass\ndef add(a, b): return 0",
    "exit_before_tests": "import os\nos._exit(0)",
    "sys_exit_before_tests": "import sys\nsys.exit(0)",
    "fake_success_marker": "print('PASS')\nprint('{\"result\": 0, \"ok\": true}')\n"
    "print('{\"done\": true}')\nprint('3/3 passed')\ndef add(a, b): return 0",
    # and more
    "forged_replies_on_every_fd": "import os\nfor fd in range(64):\n    try:\n"
    '        os.write(fd, b\'{"result": 0, "ok": true}\\n{"ok": 3}\\n{"done": true}\\n\')\n'
    "    except OSError:\n        pass\ndef add(a, b): return 0",
    "patched_json": "import json\njson.dumps = lambda *a, **k: '{\"ok\": true}'\n"
    "json.loads = lambda *a, **k: {'op': 'names'}\ndef add(a, b): return 0",
    "sys_modules_tampering": "import sys, types\nfake = types.ModuleType('json')\n"
    "fake.dumps = lambda *a, **k: 'x'\nsys.modules['json'] = fake\nsys.modules['builtins'] = fake\n"
    "def add(a, b): return 0",
    "atexit_hook": "import atexit, os\natexit.register(lambda: os.write(1, "
    'b\'{"result": 0, "ok": true}\\n{"done": true}\\n\'))\ndef add(a, b): return 0',
    "signal_handlers": "import signal\nfor s in (signal.SIGTERM, signal.SIGALRM, signal.SIGXCPU, "
    "signal.SIGINT):\n    signal.signal(s, signal.SIG_IGN)\ndef add(a, b):\n    while True: pass",
    "kill_everything": "import os, signal\nfor pid in [-1, 0, 1, os.getppid()]:\n    try:\n"
    "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
    "def add(a, b): return 0",
    "system_exit_in_call": "def add(a, b):\n    raise SystemExit(0)",
    "keyboard_interrupt_in_call": "def add(a, b):\n    raise KeyboardInterrupt",
    "base_exception_in_call": "def add(a, b):\n    raise BaseException('stop')",
    "infinite_recursion": "def add(a, b):\n    return add(a, b)",
    "fork_bomb": "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n"
    "        except OSError:\n            pass",
    "huge_result": "def add(a, b):\n    return 'x' * (64 << 20)",
    "huge_output": 'import sys\nsys.stdout.write(\'{"result": 0, "ok": true}\\n\' * 10**6)\n'
    "def add(a, b): return 0",
    "read_proc_self": FROM_TEXT + "import os\nfor p in ['/proc/self/cmdline', '/proc/1/cmdline',"
    " '/proc/self/fd/0', '/proc/1/environ']:\n    try:\n        _learn(open(p).read())\n"
    "    except OSError:\n        pass",
    "int_subclass_equal": "class I(int):\n    def __eq__(self, o): return True\n"
    "    __hash__ = int.__hash__\ndef add(a, b): return I(0)",
    "forged_reference": "def add(a, b): return {'$': 'ref', 'v': 0}",
    "shadowed_builtins": "def isinstance(*a): return True\ndef abs(x): return 0\n"
    "def add(a, b): return 0.5",
    "forged_sandbox_failure": "import os\nos.write(2, b'rlvr sandbox setup failed: x\\n')\n"
    "os._exit(97)",
    "patched_math_module": "import math\nmath.isclose = lambda *a, **k: True\n"
    "def add(a, b): return 0.5",
}


@pytest.mark.parametrize("name", sorted(HACKS))
def test_gaming_attempt_scores_zero(name):
    tests = TESTS
    if name in ("shadowed_builtins", "patched_math_module"):
        tests = ["assert abs(add(1, 2) - 3) < 1e-9", "assert isinstance(add(1, 2), int)",
                 "import math\nassert math.isclose(add(1, 2), 3)",
                 "assert math.isclose(add(20, 22), 42)"]  # fmt: skip
    assert run_tests(HACKS[name], tests, limits=LIMITS) == (0, len(tests))


@pytest.mark.parametrize(
    "prelude",
    ["", "import builtins\nbuiltins.exec = None\n", "import json\njson.dumps = None\n",
     "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n", "print('noise')\n"],
)  # fmt: skip
def test_correct_solutions_still_pass(prelude):
    assert run_tests(prelude + CORRECT, TESTS, limits=LIMITS) == (3, 3)


def test_values_keep_their_types():
    code = (
        "def f(x):\n    return x\n"
        "def g():\n    return (1, [2.5, None], {'a': {3, 4}}, frozenset([b'x']), 2**80, float('inf'))\n"
        "class Box:\n    def __init__(self, v): self.v = v\n    def get(self): return self.v\n"
        "LIMIT = 7\nimport math\n"
        "def raises():\n    raise ValueError('no')\n"
    )
    tests = [
        "assert g() == (1, [2.5, None], {'a': {3, 4}}, frozenset([b'x']), 2**80, float('inf'))",
        "assert type(f(True)) is bool and type(f((1,))) is tuple and f({1: 2}) == {1: 2}",
        "assert Box(5).get() == 5 and Box([1]).v == [1]",
        "assert LIMIT == 7 and math.sqrt(4) == 2",
        "try:\n    raises()\nexcept ValueError as e:\n    assert str(e) == 'no'\nelse:\n    raise AssertionError",
        "assert f(1) == 2",  # fails: the one wrong test
    ]
    assert run_tests(code, tests, limits=LIMITS) == (5, 6)


def test_stdin_is_a_pipe_with_only_the_input():
    prog = "import os, sys\ntry:\n    os.lseek(0, 0, 0)\n    print('SEEK')\nexcept OSError:\n    pass\n" \
           "print(int(sys.stdin.read()) * 2)"  # fmt: skip
    assert run_tests(prog, {"inputs": ["21\n"], "outputs": ["42\n"]}, limits=LIMITS) == (1, 1)


def test_a_forged_sandbox_failure_is_a_failed_program_not_a_stopped_run():
    """Under the default on_error=raise, a completion that imitates the jail's failure
    scores 0; it raises nothing that could stop training."""
    forged = "import os, sys\nsys.stderr.write('rlvr sandbox setup failed: x\\n')\nos._exit(97)"
    assert run_tests(forged, {"inputs": ["1\n"], "outputs": ["1\n"]}, limits=LIMITS) == (0, 1)


STOP = ["assert all(map(lambda x: inc(x) == x + 1, [1, 2, 3]))", "assert inc(1) == 2",
        "assert list(filter(lambda x: inc(x) != x + 1, [4, 5])) == []"]  # fmt: skip


@pytest.mark.parametrize(
    "solution, passed",
    [
        ("def inc(x):\n    raise StopIteration", 0),  # would end map()/filter() early: 2/3
        ("def inc(x):\n    raise StopIteration('done')", 0),
        ("def inc(x):\n    return x + 2", 0),  # the honest wrong answer
        ("def inc(x):\n    return x + 1", 3),
    ],
)
def test_stop_iteration_does_not_end_the_tests_iteration(solution, passed):
    """A test counts only when it ran to completion: a StopIteration the solution raises
    inside `all(map(...))` or `filter` reaches the tests as RuntimeError (PEP 479's rule for
    generators), not as the end of the iteration."""
    assert run_tests(solution, STOP, limits=LIMITS) == (passed, len(STOP))


def test_the_stop_iteration_control():
    """Why: in plain Python the same test passes with a solution that never returns."""

    def inc(x):
        raise StopIteration

    exec(STOP[0], {"inc": inc})  # no AssertionError: map ended, all() of nothing is True


# A prompt whose code prefix defines a helper the tests call (HumanEval/32's `poly`, /38's
# `encode_cyclic` in miniature) and the function the completion writes.
PREFIX = (
    'def square(x):\n    return x * x\n\n\ndef root(y):\n    """The x >= 0 whose square is y."""\n'
)
HELPER_TESTS = ["for y in (0, 1, 4, 49):\n    assert square(root(y)) == y"]


@pytest.mark.parametrize(
    ("completion", "want"),
    [
        # the right answer, calling the prefix's helper from the solution's own process
        (
            "```python\ndef root(y):\n    return next(x for x in range(y + 1) if square(x) == y)\n```",
            1.0,
        ),
        ("    return round(y ** 0.5)\n", 1.0),  # a continuation of the prefix
        # wrong answers that redefine the helper so the tests' check holds for them
        ("```python\ndef square(x):\n    return x\n\ndef root(y):\n    return y\n```", 0.0),
        ("    return y\nsquare = lambda x: x\n", 0.0),  # rebinds it past the stop sequences
        (
            "```python\nimport builtins\nbuiltins.square = lambda x: x\ndef root(y):\n    return y\n```",
            0.0,
        ),
    ],
)
def test_the_prefix_helpers_the_tests_call_are_the_datasets(completion, want):
    """The tests read the names the prompt's code prefix defines from the prefix itself,
    run in their own sandbox; the solution supplies only the function it completes (and
    helpers of its own), so a wrong answer cannot pass by redefining the helper that checks
    it."""
    from rlvr.rewards.code_reward import make_code_reward

    reward = make_code_reward(timeout_s=3.0, workers=1)
    assert reward([completion], answer=[""], tests=[HELPER_TESTS], code_prefix=[PREFIX]) == [want]
