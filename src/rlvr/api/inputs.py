"""The Python API's arguments as an ordinary run's inputs: `config` as {section: {key: value}},
reward functions and tools as the names config.yaml records ("module:function" when
importable, so a CLI resume loads them), and in-memory datasets as jsonl rows in the run
directory, checked row by row as the trainer will load them.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import sysconfig
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.config.load import to_dict
from rlvr.config.names import SAME, did_you_mean, nest
from rlvr.config.schema import Config, ConfigError
from rlvr.data.errors import DatasetError
from rlvr.run.private import private_dir, write_private
from rlvr.run.stored_config import absolute_spec


def overrides(config: Config | Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """`config` as nested {section: {key: value}}: dotted keys, nested dicts, or a Config."""
    if config is None:
        return {}
    if isinstance(config, Config):
        return {**to_dict(config), "preset": config.preset}
    if not isinstance(config, Mapping):
        raise ConfigError(f"config: expected a dict or a Config, got {type(config).__name__}")
    return nest(
        config.items(),
        lambda key: (
            f"config: {key!r} is neither 'section.key' nor a section mapping"
            f"{did_you_mean(key, SAME)}"
        ),
    )


def importable(fn: Callable) -> str | None:
    """ "module:qualname" when importing it gives back `fn` (so a CLI resume can load it)."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:
        return None
    try:
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{name}" if obj is fn else None


def import_root(fn: Callable) -> str | None:
    """The sys.path directory `fn`'s module was imported from, when that is not where
    installed packages and the standard library live (a script's own directory, the working
    directory): reward.python_path records it so a CLI resume imports the same module."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    file = getattr(module, "__file__", None)
    if file is None:
        return None
    path = Path(file).resolve()
    depth = module.__name__.count(".") + (path.name == "__init__.py")
    root = path.parents[depth]
    installed = {Path(p).resolve() for k, p in sysconfig.get_paths().items()
                 if k in ("stdlib", "platstdlib", "purelib", "platlib")}  # fmt: skip
    if root in installed or any(parent in installed for parent in root.parents):
        return None
    return str(root)


def python_path(functions: Iterable[Callable]) -> list[str]:
    """The import roots of those of `functions` recorded as "module:function", in order."""
    roots: list[str] = []
    for fn in functions:
        root = import_root(fn) if importable(fn) else None
        if root is not None and root not in roots:
            roots.append(root)
    return roots


def _named(
    items: Sequence[str | Callable], refuse: str, name_of: Callable[[Callable, list[str]], str]
) -> tuple[list[str], dict[str, Callable]]:
    """Each item's name in the config (a string as given, made absolute where it is a path;
    a callable by `name_of(fn, names so far)`) and the callables by those names; a
    non-callable raises ConfigError with `refuse` formatted with it."""
    names: list[str] = []
    functions: dict[str, Callable] = {}
    for fn in items:
        if isinstance(fn, str):
            names.append(absolute_spec(fn))
            continue
        if not callable(fn):
            raise ConfigError(refuse.format(fn=fn))
        name = name_of(fn, names)
        names.append(name)
        functions[name] = fn
    return names, functions


def reward_names(funcs: Sequence[str | Callable]) -> tuple[list[str], dict[str, Callable]]:
    """Each reward's name in the config, and the callables by those names: "module:function"
    when importable, else its own name, numbered past the built-in rewards', the reserved
    ones and earlier ones."""
    from rlvr.rewards import FACTORIES

    def name_of(fn: Callable, names: list[str]) -> str:
        name = importable(fn)
        if name is not None:
            return name
        base = getattr(fn, "__name__", None) or getattr(
            getattr(fn, "func", None), "__name__", type(fn).__name__
        )
        base = re.sub(r"\W", "_", base) or "reward"
        name, n = base, 1
        while name in FACTORIES or name in names or name in ("accuracy", "task", "none"):
            n += 1
            name = f"{base}_{n}"
        return name

    return _named(funcs, "reward_funcs: {fn!r} is neither a reward name nor callable", name_of)


def tool_names(tools: Sequence[str | Callable]) -> tuple[list[str], dict[str, Callable]]:
    """Each tool's name in `rollout.tools` ("module:function" when importable, else its
    own name) and the callables by those names (docs/tools.md)."""

    def name_of(fn: Callable, _names: list[str]) -> str:
        return importable(fn) or getattr(fn, "__name__", None) or type(fn).__name__

    return _named(tools, "tools: {fn!r} is neither a tool name nor a function", name_of)


# Words of a reward's name that say it judges correctness (TRL's accuracy_reward, a script's
# correctness_reward_func or exact_match, rlvr's math and code verifiers).
CORRECTNESS_WORDS = ("accuracy", "accurate", "correct", "correctness", "exact", "verify",
                     "verified", "verifier", "math", "code")  # fmt: skip


def says_correct(name: str) -> bool:
    """Whether a reward's name (a function's, or "module:function"'s last part) says it
    judges correctness: one of its words is a CORRECTNESS_WORDS word."""
    words = re.split(r"[^a-z0-9]+", name.rsplit(":", 1)[-1].lower())
    return any(w in CORRECTNESS_WORDS for w in words)


def pick_accuracy(names: list[str], chosen: str | None) -> tuple[int | None, str | None]:
    """Which reward is the accuracy reward (dynamic sampling's filter, the accuracy metric):
    the one `chosen` names (reward.accuracy given with the rewards: a name as recorded or its
    function's name; "none": no reward; "task", the default, is no choice), else the first whose name says correctness, else
    none. Returns its index (None: the run has no notion of correctness) and the note to
    print when the run picked it."""
    short = [n.rsplit(":", 1)[-1] for n in names]
    if chosen not in (None, "task"):  # "task": the default, which reward_funcs replace
        if chosen == "none":
            return None, None
        for i, (name, bare) in enumerate(zip(names, short)):
            if chosen in (name, bare):
                return i, None
        raise ConfigError(
            f"reward.accuracy: {chosen!r} is none of reward_funcs ({', '.join(short)}); name "
            "one of them, or 'none' for a run with no notion of correctness"
        )
    hits = [i for i, bare in enumerate(short) if says_correct(bare)]
    how = "reward.accuracy=NAME picks another, 'none' none"
    if not hits:
        return None, (
            f"note: reward.accuracy: none of {', '.join(short)} is named for correctness "
            f"({', '.join(CORRECTNESS_WORDS)}): no accuracy metric, and dynamic sampling keeps "
            "the groups whose rewards differ; reward.accuracy=NAME names one"
        )
    of = f" (the first of {', '.join(short[i] for i in hits)})" if len(hits) > 1 else ""
    return hits[0], (
        f"note: reward.accuracy: {short[hits[0]]!r}{of}, by its name: dynamic sampling and the "
        f"accuracy metric read it; {how}"
    )


def reward_changes(
    funcs: Sequence[str | Callable] | str | Callable,
    weights: Sequence[float] | None,
    chosen: str | None = None,
) -> tuple[dict[str, Any], dict[str, Callable], str | None]:
    """The reward section of the config for `funcs` and `weights`, the callables by name, and
    the note on which of them is the accuracy reward (`pick_accuracy`)."""
    funcs = [funcs] if isinstance(funcs, str) or callable(funcs) else list(funcs)
    if not funcs:
        raise ConfigError("reward_funcs: empty; give at least one reward function or name")
    weights = [1.0] * len(funcs) if weights is None else list(weights)
    if len(weights) != len(funcs):
        raise ConfigError(f"reward_weights: {len(weights)} weights for {len(funcs)} reward_funcs")
    names, functions = reward_names(funcs)
    index, note = pick_accuracy(names, chosen)
    extra = [f"{n}={float(w)!r}" for i, (n, w) in enumerate(zip(names, weights)) if i != index]
    if index is None:
        changes = {"accuracy": "none", "extra": extra}
    else:
        changes = {"accuracy": names[index], "accuracy_weight": float(weights[index]),
                   "extra": extra}  # fmt: skip
    return changes, functions, note


def jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays, tensors
        return value.tolist()
    raise TypeError(f"a {type(value).__name__} value cannot be stored as JSON")


def rows_text(rows: Iterable, name: str) -> str:
    """The dataset as jsonl text; a row that is not a dict of JSON values names its index."""
    if hasattr(rows, "to_list") and callable(rows.to_list):  # a datasets.Dataset
        rows = rows.to_list()
    lines = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DatasetError(f"{name}[{i}]", None, f"expected a dict, got {type(row).__name__}")
        try:
            lines.append(json.dumps(dict(row), default=jsonable, ensure_ascii=False))
        except (TypeError, ValueError) as e:
            raise DatasetError(f"{name}[{i}]", None, f"{e} (rows must hold JSON values)") from None
    if not lines:
        raise DatasetError(name, None, "no rows")
    return "".join(line + "\n" for line in lines)


def dataset_path(data: Any, run_dir: Path, stem: str, resume: bool) -> str:
    """A path for `data`: a file or directory as given, else jsonl written to the run dir."""
    if isinstance(data, (str, Path)):
        path = Path(data).expanduser()
        if not path.exists():
            raise ConfigError(f"{stem}_dataset: {data} does not exist")
        return str(path.resolve())
    text = rows_text(data, f"{stem}_dataset")
    path = run_dir / "data" / f"{stem}.jsonl"
    if resume and path.exists():
        if path.read_text(encoding="utf-8") != text:
            raise ConfigError(
                f"{stem}_dataset: differs from the rows the run in {run_dir} started with "
                f"({path}); a resumed run trains on the same data"
            )
        return str(path)
    private_dir(path.parent)  # the run directory too, when nothing has made it yet
    write_private(path, text.encode("utf-8"))
    return str(path)


def check_rows(cfg: Config, stem: str) -> None:
    """Load a written dataset as the trainer will, naming a bad row by its index."""
    from rlvr.data.dataset import load_prompt_dataset
    from rlvr.data.prompts import check_columns

    path = cfg.data.path if stem == "train" else cfg.data.eval_path
    d = cfg.data
    try:
        for ex in load_prompt_dataset(
            path, format=d.format, prompt_field=d.prompt_field, answer_field=d.answer_field
        ):
            check_columns(ex)
    except DatasetError as e:
        prefix = f"{e.where}, field {e.field!r}" if e.field else e.where
        line = int(e.where.rsplit(":", 1)[1]) if ":" in e.where else 1
        where = f"{stem}_dataset[{line - 1}]"
        raise DatasetError(where, e.field, str(e)[len(prefix) + 2 :]) from None
