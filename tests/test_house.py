"""The package's layout (docs/guides/architecture.md): the top of `src/rlvr` holds packages and
at most three modules beside `__init__.py` and `__main__.py`; the public imports the docs and
examples use keep working; every path and dotted module the project's text names exists."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "rlvr"
PACKAGES = {
    "algos", "api", "cli", "config", "cpu", "data", "environments", "rewards", "rm", "rollout",
    "run", "tasks",
    "tools", "training",
}  # fmt: skip


def test_the_top_holds_packages_and_at_most_three_modules():
    modules = {p.name for p in SRC.glob("*.py")} - {"__init__.py", "__main__.py"}
    assert len(modules) <= 3, sorted(modules)
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    assert packages == PACKAGES


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_package_says_what_it_holds(package):
    doc = importlib.import_module(f"rlvr.{package}").__doc__
    assert doc and len(doc.split()) >= 8, package


def test_the_public_imports_in_a_fresh_interpreter():
    """What README.md, docs/ and examples/ import, from a clean process (import order and
    partial initialisation are what a re-export breaks first)."""
    code = (
        "import inspect, rlvr, rlvr.algos\n"
        "from rlvr import train, Trainer, TrainResult, RESERVED_KWARGS\n"
        "from rlvr.config import Config, ConfigError, TINY_DEFAULTS, load_config, dump_yaml\n"
        "from rlvr.data import DatasetError, load_prompt_dataset, render_prompt\n"
        "from rlvr.api import train as api_train\n"
        "from rlvr.cli import main\n"
        "from rlvr.algos import policy_loss, group_advantages, gae, kl_estimate, aggregate\n"
        "assert train is api_train and inspect.isfunction(train)\n"
        "assert load_config(None, ['--algo.clip_high=0.3']).algo.clip_high == 0.3\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def _text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    keep = (".py", ".md", ".sh", ".yaml", ".yml", ".toml")
    return [ROOT / f for f in out.stdout.split() if f.endswith(keep) and (ROOT / f).is_file()]


PATH = re.compile(r"(?<![\w/.])(?:src/)?rlvr/((?:[a-z_]+/)*[a-z_]+\.py)\b")
DOTTED = re.compile(r"(?<![\w.])rlvr((?:\.[a-z_][a-z0-9_]*)+)")


TOP_NAMES = {"train", "__version__", "__file__"}  # what `rlvr` itself defines
NOT_MODULES = {"egg", "yaml", "jsonl", "json", "log", "toml", "py", "md", "lock"}  # file names


def _missing(parts: list[str]) -> bool:
    """Whether rlvr.<parts> names nothing: the longest prefix that is a module or package must
    exist, and a name after it must at least be written in that module's source."""
    if len(parts) == 1 and parts[0] in TOP_NAMES | NOT_MODULES:
        return False
    here = SRC
    for i, part in enumerate(parts):
        if (here / part / "__init__.py").is_file():
            here = here / part
        elif (here / f"{part}.py").is_file():
            here = here / f"{part}.py"
            rest = parts[i + 1 :]
            return bool(rest) and not re.search(rf"\b{rest[0]}\b", here.read_text())
        else:
            if here == SRC:
                return True
            return not re.search(rf"\b{part}\b", (here / "__init__.py").read_text())
    return False


def test_every_module_the_text_names_exists():
    """`src/rlvr/x/y.py` and `rlvr.x.y` in docs, comments and docstrings name real modules
    (and, after a module, a name its source holds): text left behind by a move is caught."""
    missing = []
    for f in _text_files():
        if f.relative_to(ROOT).parts[0] == "tests" or "bench/results" in str(f):
            continue  # the tests name made-up modules on purpose
        text = f.read_text(errors="replace")
        for m in PATH.finditer(text):
            if not (SRC / m.group(1)).is_file():
                missing.append(f"{f.relative_to(ROOT)}: rlvr/{m.group(1)}")
        for m in DOTTED.finditer(text):
            parts = m.group(1).strip(".").split(".")
            if _missing(parts):
                missing.append(f"{f.relative_to(ROOT)}: rlvr.{'.'.join(parts)}")
    assert not missing, "\n".join(sorted(set(missing)))


SCRIPT_PATH = re.compile(r"(?<![\w/.-])((?:bench|scripts|examples)/[\w./-]*\w)")


def test_every_script_and_example_the_docs_name_exists():
    """A path under bench/, scripts/ or examples/ in README.md or docs/ names a file or folder
    of the repository: a command the reader copies runs what it says."""
    missing = []
    for f in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for m in SCRIPT_PATH.finditer(f.read_text()):
            if not (ROOT / m.group(1)).exists():
                missing.append(f"{f.relative_to(ROOT)}: {m.group(1)}")
    assert not missing, "\n".join(sorted(set(missing)))
