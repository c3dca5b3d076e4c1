"""Short signatures in the step, read from the code: no function of
`rlvr.training` takes more than six parameters, and only the modules that build a run from the
config take the whole `Config`; every other function of the step takes the small objects they
build once (the run's `Algorithm`, `UpdateSettings`, the step's `UpdateContext`, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRAINING = Path(__file__).resolve().parents[1] / "src" / "rlvr" / "training"
MOST_PARAMETERS = 6
# where the config becomes objects: the run (setup), the entry (trainer), the models (policy,
# the critic's too), the schedule and the step's settings
BUILDERS = {"setup", "trainer", "policy", "lr_schedule", "settings"}


def _functions():
    for path in sorted(TRAINING.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield path.stem, node


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    """Its named parameters, keyword-only ones included, `self` and `cls` not."""
    a = fn.args
    return [p for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]


def _takes_config(p: ast.arg) -> bool:
    annotation = ast.unparse(p.annotation) if p.annotation is not None else ""
    return p.arg == "cfg" or annotation.split(".")[-1] == "Config"


def test_the_training_modules_are_read():
    names = {module for module, _ in _functions()}
    assert {"micro", "update", "collect", "critic", "setup"} <= names


def test_no_function_of_the_step_takes_more_than_six_parameters():
    long = [
        f"{module}.{fn.name} ({len(_parameters(fn))})"
        for module, fn in _functions()
        if len(_parameters(fn)) > MOST_PARAMETERS
    ]
    assert not long, f"more than {MOST_PARAMETERS} parameters: {long}"


def test_only_the_builders_take_the_config():
    taking = [
        f"{module}.{fn.name}({p.arg})"
        for module, fn in _functions()
        if module not in BUILDERS
        for p in _parameters(fn)
        if _takes_config(p)
    ]
    assert not taking, f"the whole Config below the builders: {taking}"


@pytest.mark.parametrize(
    ("source", "long", "config"),
    [
        ("def f(self, a, b, c, d, e, g): pass", False, False),
        ("def f(a, b, c, d, e, g, *, h=1): pass", True, False),
        ("def f(cfg): pass", False, True),
        ("def f(c: Config): pass", False, True),
        ("def f(c: rlvr.config.schema.Config): pass", False, True),
        ("def f(c: CollectSettings): pass", False, False),
    ],
)
def test_the_checks_see_what_they_look_for(source, long, config):
    fn = ast.parse(source).body[0]
    assert (len(_parameters(fn)) > MOST_PARAMETERS) == long
    assert any(_takes_config(p) for p in _parameters(fn)) == config
