"""The configuration reference page (`docs/reference/config.md`), generated from the schema.

Every key of every section, its type, the value a run gets when it does not set it (under the
default preset, with your own model), what the built-in model's defaults change for `rlvr train`
with no arguments, what the preset changed from the dataclass default, and the key's
documentation (the `name: text` lines of its section's docstring, `rlvr.config.schema.field_docs`).

    python scripts/config_reference.py          # rewrites docs/reference/config.md

`tests/test_config_reference.py` fails when the page differs from what this module writes.
"""

from __future__ import annotations

import typing
from dataclasses import fields, is_dataclass
from typing import Any

from rlvr.config.load import _type_name, load_config
from rlvr.config.objective import OWN
from rlvr.config.presets import preset_names
from rlvr.config.schema import SECTIONS, Config, field_docs

# a model id that is not the built-in one, so load_config applies no built-in-model defaults;
# nothing is downloaded (a config names its model, it does not load it)
YOUR_MODEL = "your/model"

HEADER = """# Configuration reference

Generated from `rlvr/config/schema.py` (and `rlvr/config/schema_algo.py`, `rlvr/config/schema_rollout.py`) by `python scripts/config_reference.py`; do not edit by hand.
Set a key in a YAML file (`section: {key: value}`) or on the command line
(`--section.key=value`). Precedence: the dataclass defaults, then the preset (`preset`, one of
PRESETS), then the YAML file, then the command line.

**Default** is what a run gets when neither the file nor the command line sets the key, under the
default preset and with your own model. Where `rlvr train` with no arguments (the built-in
model `rlvr-tiny`) runs with another value, the **rlvr-tiny** column says so (its per-task,
per-preset values are in `rlvr/config/presets.py`); where the preset changed the dataclass default, the
description ends with the dataclass's own value.
"""


def _value(v: Any) -> str:
    if isinstance(v, tuple):
        v = list(v)
    return "`" + repr(v).replace("|", "\\|") + "`"


def _rows(where: str, cls: type, mine: Any, tiny: Any, schema: Any) -> list[str]:
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    rows = []
    for f in fields(cls):
        if f"{where}.{f.name}" == f"algo.{OWN}":  # written as keys of their own
            rows += _own_rows()
            continue
        a, b, c = getattr(mine, f.name), getattr(tiny, f.name), getattr(schema, f.name)
        if f"{where}.{f.name}" == "model.name_or_path":  # "your model" is not its default
            a = c
        if is_dataclass(hints[f.name]):
            rows += _rows(f"{where}.{f.name}", hints[f.name], a, b, c)
            continue
        doc = docs.get(f.name, "").replace("|", "\\|")
        if a != c:
            doc += f" (dataclass default {_value(c)})"
        tiny_col = _value(b) if b != a else ""
        kind = _type_name(hints[f.name]).replace("|", "\\|")
        rows.append(f"| `{where}.{f.name}` | {kind} | {_value(a)} | {tiny_col} | {doc} |")
    return rows


def _own_rows() -> list[str]:
    """The built-in objectives' own settings (`rlvr.algos.settings`), each a key of `algo`
    with its declared type, default and documentation, and the loss it belongs to."""
    from rlvr.algos.objectives import builtin_objectives
    from rlvr.algos.settings import default_of, own_fields

    rows, seen = [], set()
    for objective in builtin_objectives():
        cls = objective.settings
        docs, hints = field_docs(cls), typing.get_type_hints(cls)
        for f in own_fields(cls):
            if f.name in seen:
                continue
            seen.add(f.name)
            doc = docs.get(f.name, "").replace("|", "\\|").rstrip(".")
            doc += f"; loss {objective.name} only."
            kind = _type_name(hints[f.name]).replace("|", "\\|")
            rows.append(f"| `algo.{f.name}` | {kind} | {_value(default_of(f))} |  | {doc} |")
    return rows


def reference_markdown() -> str:
    """The whole page."""
    mine = load_config(overrides={"model": {"name_or_path": YOUR_MODEL}})
    tiny, schema = load_config(), Config()
    out = [HEADER.replace("PRESETS", preset_names())]
    out.append(f"`preset`: the algorithm preset, default {_value(mine.preset)}.\n")
    hints = typing.get_type_hints(Config)
    for name in SECTIONS:
        cls = hints[name]
        summary = (cls.__doc__ or "").strip().splitlines()[0]
        out.append(f"## {name}\n\n{summary}\n")
        out.append("| key | type | default | rlvr-tiny | description |")
        out.append("|---|---|---|---|---|")
        out += _rows(name, cls, getattr(mine, name), getattr(tiny, name), getattr(schema, name))
        out.append("")
    return "\n".join(out)
