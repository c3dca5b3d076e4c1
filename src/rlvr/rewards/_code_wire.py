"""Values that cross between the solution's sandbox and the tests' sandbox: JSON of plain
types, tagged where JSON has no type of its own. Stdlib only: this text is copied into
both sandboxed programs.

`decode` (the receiving side) accepts exactly these shapes and rebuilds exact builtin types,
so nothing of the sender's (an object whose __eq__ is always True, a str subclass, a
patched json module) reaches the other side: the tests compare values they built
themselves. `encode` on the solution's side is lenient (a subclass of a builtin is sent as
that builtin); the solution controls it anyway, and what it sends is only ever a value.
"""

import json
import math

MAX_DEPTH = 200
_BIG = 1 << 62
_EXC = (ArithmeticError, AssertionError, AttributeError, EOFError, ImportError, IndexError,
        KeyError, LookupError, MemoryError, NameError, NotImplementedError, OSError,
        OverflowError, RecursionError, RuntimeError, StopIteration, TypeError,
        UnicodeError, ValueError, ZeroDivisionError)  # fmt: skip
EXCEPTIONS = {e.__name__: e for e in _EXC}


def encode(x, ref=None, depth=0):
    """`x` as plain JSON types; an object of no plain type becomes {"$": "ref", "v":
    ref(x)} when `ref` is given, else TypeError."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t, d = type(x), depth + 1
    if x is None or t is bool or t is str:
        return x
    if t is int:
        return x if -_BIG < x < _BIG else {"$": "int", "v": hex(x)}
    if t is float:
        return x if math.isfinite(x) else {"$": "float", "v": repr(x)}
    if t is list:
        return [encode(v, ref, d) for v in x]
    if t is dict:
        return {"$": "dict", "v": [[encode(k, ref, d), encode(v, ref, d)] for k, v in x.items()]}
    if t in (tuple, set, frozenset):
        return {"$": t.__name__, "v": [encode(v, ref, d) for v in x]}
    if t is bytes:
        return {"$": "bytes", "v": x.hex()}
    if t is complex:
        return {"$": "complex", "v": [encode(x.real), encode(x.imag)]}
    for base in (bool, int, float, str, bytes, complex, list, dict, tuple, set, frozenset):
        if isinstance(x, base) and ref is not None:  # a subclass: send the builtin value
            return encode(base(x), ref, d)
    if ref is not None:
        return {"$": "ref", "v": ref(x)}
    raise TypeError(f"a {t.__name__} cannot be passed to the solution")


def decode(j, ref=None, depth=0):
    """Exact builtin values from what `encode` produced; ValueError on anything else.
    `ref(id)` rebuilds a reference (refused when None)."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t, d = type(j), depth + 1
    if j is None or t in (bool, int, float, str):
        return j
    if t is list:
        return [decode(v, ref, d) for v in j]
    if t is not dict or set(j) != {"$", "v"}:
        raise ValueError("malformed value")
    tag, v = j["$"], j["v"]
    if tag in ("tuple", "set", "frozenset") and type(v) is list:
        items = [decode(x, ref, d) for x in v]
        return tuple(items) if tag == "tuple" else set(items) if tag == "set" else frozenset(items)
    if tag == "dict" and type(v) is list:
        if not all(type(p) is list and len(p) == 2 for p in v):
            raise ValueError("malformed dict")
        return {decode(k, ref, d): decode(x, ref, d) for k, x in v}
    if tag == "int" and type(v) is str:
        return int(v, 16)
    if tag == "float" and v in ("nan", "inf", "-inf"):
        return float(v)
    if tag == "bytes" and type(v) is str:
        return bytes.fromhex(v)
    if tag == "complex" and type(v) is list and len(v) == 2:
        return complex(decode(v[0], None, d), decode(v[1], None, d))
    if tag == "ref" and type(v) is int and ref is not None:
        return ref(v)
    raise ValueError(f"malformed value tagged {tag!r}")


_json_dumps, _json_loads = json.dumps, json.loads  # bound before any solution code runs


def dumps(obj):
    return (_json_dumps(obj, allow_nan=False) + "\n").encode()


def loads(line):
    return _json_loads(line)
