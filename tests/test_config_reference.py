"""The configuration reference (docs/reference/config.md) lists every key of the schema, with a
description, and is what `scripts/config_reference.py` writes from the code as it is."""

from __future__ import annotations

import re
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path

from rlvr.algos.objectives import builtin_objectives
from rlvr.algos.settings import own_fields
from rlvr.config.reference import reference_markdown
from rlvr.config.schema import SECTIONS, Config

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "config.md"


def _keys(prefix: str, cls: type) -> list[str]:
    """Every key of the schema; `algo.loss_settings` is the built-in objectives' own keys."""
    hints, out = typing.get_type_hints(cls), []
    for f in fields(cls):
        if f"{prefix}.{f.name}" == "algo.loss_settings":
            out += [f"algo.{f.name}" for o in builtin_objectives() for f in own_fields(o.settings)]
        elif is_dataclass(hints[f.name]):
            out += _keys(f"{prefix}.{f.name}", hints[f.name])
        else:
            out.append(f"{prefix}.{f.name}")
    return out


def test_every_key_has_a_row_with_a_description():
    rows = {}
    for line in reference_markdown().splitlines():
        m = re.match(r"\| `([\w.]+)` \| (.*?) \| (.*?) \| (.*?) \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = m.group(5)
    hints = typing.get_type_hints(Config)
    keys = [k for name in SECTIONS for k in _keys(name, hints[name])]
    assert len(keys) > 100
    missing = [k for k in keys if k not in rows]
    undocumented = [k for k in keys if k in rows and not rows[k].strip()]
    assert not missing, missing
    assert not undocumented, undocumented
    assert set(rows) == set(keys)


def test_the_page_is_generated_from_the_code():
    assert PAGE.read_text() == reference_markdown(), (
        "docs/reference/config.md is stale: run python scripts/config_reference.py"
    )
