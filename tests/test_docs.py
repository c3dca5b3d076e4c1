"""The project's text cites only files in the repository, its links to docs/algorithms.md land on
a heading, and no comment, docstring or document narrates the project's history."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALGO_DOC = ROOT / "docs" / "algorithms.md"
TEXT_SUFFIXES = {".py", ".md", ".c", ".h", ".yaml", ".yml", ".toml", ".sh", ".txt", ""}

# Files outside the repository that the project's text must not cite.
OUTSIDE = re.compile(r"ALGORITHM[S]\.md|DESIGN\.md|STYLE\.md|\bshared/seed\b|\.\./shared\b")
# History narration: which session or issue something came from, what was tried before.
HISTORY = re.compile(
    r"\bsession \d|\bsessions? [0-9]+(?:-| to )[0-9]+|\bbefore session\b|\bissue[ -]?#?\d"
    r"|\bwas (?:measured|tried) and dropped\b|\btried (?:this|last) session\b",
    re.IGNORECASE,
)


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the file list comes from git")
    files = []
    for name in out.splitlines():
        path = ROOT / name
        if path.is_file() and path.suffix in TEXT_SUFFIXES and path.stat().st_size < 2_000_000:
            files.append(path)
    return files


def _hits(pattern: re.Pattern[str], files: list[Path]) -> list[str]:
    hits = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return hits


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors() -> set[str]:
    text = ALGO_DOC.read_text(encoding="utf-8")
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


def test_nothing_cites_a_file_outside_the_repository():
    files = [p for p in _tracked_text_files() if p.name != "test_docs.py"]
    assert _hits(OUTSIDE, files) == []


def test_no_text_narrates_history():
    files = [p for p in _tracked_text_files() if p.name != "test_docs.py"]
    assert _hits(HISTORY, files) == []


def test_history_pattern_catches_narration_and_spares_plain_words():
    narrations = [
        "lr 4e-4 (2e-4 before session 4)",
        "on issue 5's model",
        "the issue-5 targets",
        "tried this session and dropped",
        "was measured and dropped",
    ]
    for line in narrations:
        assert HISTORY.search(line), line
    for line in ("start_new_session=True", 'scope="session"', "the surplus is dropped"):
        assert not HISTORY.search(line), line


def test_links_to_the_algorithms_doc_land_on_a_heading():
    anchors = _anchors()
    link = re.compile(r"algorithms\.md#([\w\-]+)")
    missing = []
    for path in _tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        missing += [
            f"{path.relative_to(ROOT)}: #{a}" for a in link.findall(text) if a not in anchors
        ]
    own = re.compile(r"\]\(#([\w\-]+)\)")
    missing += [
        f"docs/algorithms.md: #{a}" for a in own.findall(ALGO_DOC.read_text()) if a not in anchors
    ]
    assert missing == []


def test_slug_follows_github():
    assert _slug("Dr. GRPO") == "dr-grpo"
    assert _slug("GSPO sequence ratio") == "gspo-sequence-ratio"
    assert _slug("Old and reference log-probs") == "old-and-reference-log-probs"
