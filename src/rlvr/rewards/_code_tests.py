# ruff: noqa: F821  (encode, decode, dumps, loads, EXCEPTIONS: _code_wire, prepended)
# The tests' side of the code reward (runs in its own sandbox, after _code_wire's text):
# runs the dataset's code of tests.json ("given": the code prefix's helpers, imports and
# constants) in the tests' namespace, adds each top-level name of the solution it does not
# bind (see _names: values rebuilt here by _code_wire.decode, or a `Remote` that forwards
# calls to the solution's sandbox), then runs each snippet of "tests" there. So a helper the
# prompt defines and the tests call is the dataset's, whatever the solution redefines. A
# test passes only when it runs to completion; a StopIteration the solution raises reaches
# the tests as RuntimeError, so it cannot end an iteration the tests drive and skip their
# checks. Reports {"result": i, "ok": bool} per test, then {"done": true}. The solution
# never runs in this process, so it cannot reach the tests, their frames, the comparisons
# or this report.
import builtins
import contextlib
import importlib
import os

_out = os.dup(1)
os.dup2(2, 1)  # the tests' prints go to stderr, not into the report
_in = os.fdopen(os.dup(0), "rb")
os.dup2(os.open("/dev/null", os.O_RDONLY), 0)


class SolutionError(Exception):
    """The solution raised an exception of no builtin type, or died."""


def _send(obj):
    data = dumps(obj)
    while data:
        data = data[os.write(_out, data) :]


def _request(obj):
    _send(obj)
    line = _in.readline()
    if not line:
        raise SolutionError("no reply")
    reply = loads(line)
    if type(reply) is dict and set(reply) == {"ok"}:
        return decode(reply["ok"], Remote)
    err = reply.get("err") if type(reply) is dict else None
    if type(err) is list and len(err) == 2 and all(type(x) is str for x in err):
        if err[0] == "StopIteration":  # as PEP 479 does for generators: not the end of an
            # iteration the tests run (`all(map(f, xs))` would end early and pass)
            raise RuntimeError(f"the solution raised StopIteration: {err[1]}")
        raise EXCEPTIONS.get(err[0], SolutionError)(err[1])
    raise SolutionError("malformed reply")


def _ref_of(x):
    if type(x) is Remote:
        return object.__getattribute__(x, "_id")
    raise TypeError(f"a {type(x).__name__} cannot be passed to the solution")


class Remote:
    """An object of the solution's (a function, a class, an instance): calls and attribute
    reads go to the solution's process; arguments and results travel as values."""

    __slots__ = ("_id",)

    def __init__(self, ref):
        object.__setattr__(self, "_id", ref)

    def __call__(self, *args, **kwargs):
        return _request({"op": "call", "ref": _ref_of(self), "args": encode(list(args), _ref_of),
                         "kwargs": encode(kwargs, _ref_of)})  # fmt: skip

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _request({"op": "getattr", "ref": _ref_of(self), "name": name})

    def __repr__(self):
        return f"<solution object {_ref_of(self)}>"


def _names():
    """The solution's top-level names as the tests see them: its values rebuilt here, its
    objects as Remotes, and the modules it imported imported afresh here (so a module it
    patched stays patched only in its own process). Names that would shadow a builtin the
    tests might use (`abs`, `len`, `isinstance`, ...) are left out."""
    names = {}
    for entry in _request({"op": "names"}):
        if type(entry) is not list or len(entry) != 3 or type(entry[0]) is not str:
            raise SolutionError("malformed names")
        name, kind, value = entry
        if hasattr(builtins, name):
            continue
        if kind == "module" and type(value) is str:
            with contextlib.suppress(BaseException):  # not here: the tests cannot rely on it
                names[name] = importlib.import_module(value)
        elif kind == "value":
            names[name] = decode(value, Remote)
    return names


def _main():
    with open("tests.json") as f:
        spec = loads(f.read())
    tests = spec["tests"]
    g = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(spec["given"], "<prefix>", "exec"), g)
        names = {k: v for k, v in _names().items() if k not in g}
    except BaseException:
        names = None
    g.update(names or {})
    for i, test in enumerate(tests):  # one namespace: a test may define what later ones use
        ok = False
        if names is not None:
            try:
                exec(compile(test, f"<test {i}>", "exec"), g)
                ok = True
            except BaseException:
                pass
        _send({"result": i, "ok": ok})
    _send({"done": True})


_main()
