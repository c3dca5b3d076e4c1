"""`DatasetError`, the one error a malformed dataset row raises (`rlvr.data` and the code
formats of `rlvr.data.code` both raise it, so it lives apart from either)."""

from __future__ import annotations


class DatasetError(ValueError):
    """A malformed dataset row: `where` is "file:line" or "file[row]", `field` the column."""

    def __init__(self, where: str, field: str | None, message: str):
        at = f"{where}, field {field!r}" if field else where
        super().__init__(f"{at}: {message}")
        self.where, self.field = where, field
