"""A data file's text, each failure a DatasetError naming the file and line: its bytes as UTF-8
(a byte-order mark accepted, UTF-16/32 refused by name, .gz decompressed), a JSON value with
NaN and Infinity refused, and JSON Lines split at "\n" only. `rlvr.data.dataset` reads
dataset files through it, `rlvr eval --samples` its completions files."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlvr.data.errors import DatasetError


def json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSON Lines file (gzipped when its
    name ends in .gz): UTF-8, a byte-order mark accepted, NaN and Infinity refused; a bad line
    raises DatasetError naming the file and line."""
    return json_lines_of(utf8_bytes(path), path.name)


def json_lines_of(data: bytes, name: str) -> Iterator[tuple[int, Any]]:
    """`json_lines` of a file's bytes already read (`name`: the file's, for errors)."""
    # JSON Lines end lines with "\n" only: str.splitlines would also split inside a string
    # holding U+2028 or U+0085, which JSON allows unescaped
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        line = decode_line(raw, name, lineno)
        if line.strip():
            yield lineno, parse_json(line, name, lineno)


def parse_json(text: str, name: str, lineno: int | None):
    """`json.loads(text)` of line `lineno` (None: the whole file) with NaN/Infinity refused
    (not JSON, and a NaN answer would be scored as the string "nan") and nesting too deep for
    the parser named; DatasetError otherwise."""

    def constant(word: str):
        raise DatasetError(f"{name}:{lineno or 1}", None, f"{word} is not a JSON value")

    try:
        return json.loads(text, parse_constant=constant)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{name}:{lineno or e.lineno}", None, f"bad JSON: {e.msg}") from None
    except RecursionError:
        where = f"{name}:{lineno}" if lineno else name
        raise DatasetError(where, None, "JSON nested too deeply to be a dataset row") from None


def one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def utf8_bytes(path: Path) -> bytes:
    """The file's bytes without a UTF-8 byte-order mark (Windows editors write one: accepted);
    UTF-16/32 (their BOMs) is refused by name."""
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        import gzip

        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise DatasetError(
                path.name, None, f"not a readable gzip file ({one_line(e)})"
            ) from None
    if data.startswith(codecs.BOM_UTF8):
        return data[len(codecs.BOM_UTF8) :]
    for bom, encoding in (
        (codecs.BOM_UTF32_LE, "UTF-32"),
        (codecs.BOM_UTF16_LE, "UTF-16"),
        (codecs.BOM_UTF16_BE, "UTF-16"),
        (codecs.BOM_UTF32_BE, "UTF-32"),
    ):
        if data.startswith(bom):
            raise DatasetError(f"{path.name}:1", None, f"the file is {encoding}; save it as UTF-8")
    return data


def decode_line(raw: bytes, name: str, lineno: int) -> str:
    """`raw` as UTF-8, or DatasetError naming the line (0: a whole .json file) and column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad, column = raw[e.start], e.start + 1
        if lineno == 0:  # a whole file: find the line
            lineno = raw.count(b"\n", 0, e.start) + 1
            column = e.start - raw.rfind(b"\n", 0, e.start)
        raise DatasetError(
            f"{name}:{lineno}",
            None,
            f"not valid UTF-8 (byte 0x{bad:02x} at column {column}); save the file as UTF-8",
        ) from None
