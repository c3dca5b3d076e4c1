"""YAML read within a budget: a config, a run's config.yaml or rm.yaml is at most 1 MiB of text
and at most 10,000 values once its aliases are expanded, so a file of a few hundred bytes of
nested anchors (each `&a` list of nine `*b` aliases multiplies the values by nine: nine levels
give 387 million) is refused at once, before anything walks, copies or prints it. PyYAML
builds an alias as a shared reference, so the load itself is cheap; what explodes is every
later pass over the value (validation, `repr` in an error message, writing config.yaml).

The expanded count is taken on the composed node graph, each node counted once with its
children's totals (linear in the file's size); nesting deeper than the parser's recursion
allows is refused the same way.

A key written twice in one mapping is an error naming the key, both lines and the file:
PyYAML keeps the last value silently, so `clip_high: 0.28` twenty lines above a second
`clip_high: 5.0` would train at 5.0 with nothing said."""

from __future__ import annotations

import reprlib
from typing import Any

import yaml

from rlvr.config.schema import ConfigError

MAX_BYTES = 1 << 20
MAX_VALUES = 10_000


def read_text(path) -> str:
    """A config file's text: ConfigError naming the file when it is larger than the budget,
    not UTF-8, or unreadable (a directory, no permission)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES} bytes; a config is a few kB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {e.start}: {data[e.start : e.start + 1]!r})"
        ) from None


def load_yaml(text: str, source: str) -> Any:
    """`yaml.safe_load(text)` within the budget and with each key once per mapping;
    ConfigError naming `source` otherwise (bad YAML included)."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{source}: {len(text)} characters; a config holds at most {MAX_BYTES}")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        values = _expanded(node, {})
        if values > MAX_VALUES:
            raise ConfigError(
                f"{source}: its aliases expand to more than {MAX_VALUES} values (a YAML alias "
                "bomb?); a config needs far fewer"
            )
        _refuse_duplicate_keys(loader, node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {_first_lines(e)}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply to be a config") from None
    finally:
        loader.dispose()


def _expanded(node: yaml.Node, seen: dict[int, int]) -> int:
    """Values under `node` with every alias expanded (stops counting past the budget)."""
    key = id(node)
    if key in seen:
        return seen[key]
    seen[key] = MAX_VALUES + 1  # a node reached again while being counted: a cycle
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    for child in children:
        total += _expanded(child, seen)
        if total > MAX_VALUES:
            break
    seen[key] = total
    return total


_MERGE = "tag:yaml.org,2002:merge"
_SKIP = object()  # a key `_refuse_duplicate_keys` does not compare


def _refuse_duplicate_keys(loader: yaml.SafeLoader, root: yaml.Node, source: str) -> None:
    """ConfigError naming the key (as a dotted path), its two lines and `source` when a
    mapping under `root` holds one key twice; keys compare as the values they load as
    (`yes` and `true` are one key). Each node is visited once, aliases included."""
    seen: set[int] = set()
    todo: list[tuple[yaml.Node, str]] = [(root, "")]
    while todo:
        node, where = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo += [(child, f"{where}[{i}]") for i, child in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            lines: dict[Any, int] = {}
            for key, value in node.value:
                name = _key(loader, key)
                path = f"{where}.{name}" if where else str(name)
                if name is not _SKIP and name in lines:
                    raise ConfigError(
                        f"{source}: key {show(path)} appears twice, on line {lines[name]} "
                        f"and line {key.start_mark.line + 1}; YAML would keep only the last, "
                        "so write it once"
                    )
                if name is not _SKIP:
                    lines[name] = key.start_mark.line + 1
                todo.append((value, path))


def _key(loader: yaml.SafeLoader, key: yaml.Node) -> Any:
    """A scalar key's value as it loads (`_SKIP` for a merge key `<<` or a non-scalar key,
    which PyYAML itself merges or refuses)."""
    if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE:
        return _SKIP
    value = loader.construct_object(key)
    try:
        hash(value)
    except TypeError:
        return _SKIP
    return value


def _first_lines(e: Exception, limit: int = 400) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80
_repr.maxlist = _repr.maxtuple = _repr.maxdict = 6
_repr.maxlevel = 3


def show(value: Any) -> str:
    """`repr(value)` cut to a few lines' worth: what an error message quotes of a value."""
    return _repr.repr(value)
