"""Write docs/reference/config.md from the schema (`rlvr.config.reference`)."""

from __future__ import annotations

import sys
from pathlib import Path

from rlvr.config.reference import reference_markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "config.md"

if __name__ == "__main__":
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(reference_markdown())
    print(f"wrote {PAGE}")
    sys.exit(0)
