# ruff: noqa: F821  (encode, decode, dumps, loads, EXCEPTIONS: _code_wire, prepended)
# The solution's side of the code reward (runs in its own sandbox, after _code_wire's
# text): executes solution.py, then answers requests from the tests, one JSON line each
# way: {"op": "names"} -> the solution's top-level names (modules by name); {"op": "call",
# "ref", "args", "kwargs"}; {"op": "getattr", "ref", "name"}. Replies: {"ok": value} or
# {"err": [type, message]}. Nothing here is trusted: the solution can replace any of it, and whatever it
# sends back is only the value a call returned.
import os

_out = os.dup(1)
os.dup2(2, 1)  # the solution's prints go to stderr, not into the replies
_in = os.fdopen(os.dup(0), "rb")
os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
_objects = []


def _ref(x):
    _objects.append(x)
    return len(_objects) - 1


def _reply(obj):
    data = dumps(obj)
    while data:
        data = data[os.write(_out, data) :]


def _answer(req, g):
    op = req["op"]
    if op == "names":  # [name, "module", module name] or [name, "value", encoded value]
        return [[k, "module", v.__name__] if type(v) is type(os) else [k, "value", encode(v, _ref)]
                for k, v in g.items() if not k.startswith("__")]  # fmt: skip
    target = _objects[req["ref"]]
    if op == "getattr":
        return getattr(target, req["name"])
    if op == "call":
        args = decode(req["args"], _objects.__getitem__)
        kwargs = decode(req["kwargs"], _objects.__getitem__)
        return target(*args, **kwargs)
    raise ValueError(f"unknown request {op!r}")


def _serve():
    g = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        with open("solution.py") as f:
            source = f.read()
        exec(compile(source, "<solution>", "exec"), g)
        failed = None
    except BaseException as e:
        failed = [type(e).__name__, str(e)[:500]]
    for line in _in:
        try:
            if failed:
                raise RuntimeError(f"the solution failed: {failed[0]}: {failed[1]}")
            _reply({"ok": encode(_answer(loads(line), g), _ref)})
        except BaseException as e:
            _reply({"err": [type(e).__name__, str(e)[:500]]})


_serve()
