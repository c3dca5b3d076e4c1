"""The `module:function` loader: a user's reward, loss, tool or agent named in a config as
"module:function" (importable, after `reward.python_path`) or "path/to/file.py:function"."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path


def extend_sys_path(paths) -> None:
    """Put `paths` (reward.python_path) first on sys.path, in order, each once."""
    for path in reversed(tuple(paths)):
        if path not in sys.path:
            sys.path.insert(0, path)


def load_callable(spec: str, kind: str):
    """The callable "module:function" or "path/to/file.py:function" names; `kind` (what it
    is for, e.g. "user reward", "algo.loss") starts every error's message."""
    fn = load_object(spec, kind)
    if not callable(fn):
        attr = spec.rpartition(":")[2]
        raise ValueError(f"{kind} {spec!r}: {attr!r} is a {type(fn).__name__}, not callable")
    return fn


def load_object(spec: str, kind: str):
    """The object "module:name" or "path/to/file.py:name" names, callable or not (an app, an
    environment); ValueError starting with `kind` when it cannot be had."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(
            f"{kind} {spec!r}: expected 'module:function' or 'path/to/file.py:function'"
        )
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ValueError(f"{kind} {spec!r}: empty module or function name")
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target).expanduser()
        if not path.is_file():
            raise ValueError(f"{kind} {spec!r}: no file {str(path.resolve())!r}")
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        mod_name = f"rlvr_user_reward_{path.stem}_{digest}"
        module = sys.modules.get(mod_name)
        if module is None:
            load = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(load)
            try:
                load.loader.exec_module(module)
            except Exception as e:
                raise ValueError(
                    f"{kind} {spec!r}: importing {str(path)!r} failed: {type(e).__name__}: {e}"
                ) from e
            sys.modules[mod_name] = module
    else:
        try:
            module = importlib.import_module(target)
        except Exception as e:
            raise ValueError(
                f"{kind} {spec!r}: cannot import module {target!r}: {type(e).__name__}: {e}"
            ) from e
    fn = getattr(module, attr, None)
    if fn is None:
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ValueError(f"{kind} {spec!r}: {target!r} has no {attr!r}; callables: {public}")
    return fn
