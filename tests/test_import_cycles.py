"""No import loop inside the package: every `import` of an rlvr module by another, read from the
sources with `ast`, forms a graph without cycles.

Every import counts: at module level, inside functions, and under `if TYPE_CHECKING:`. A
function-level import that closes a loop (a.py imports b at the top, b imports a inside a
function) is how a loop hides at run time, and an annotation-only import is how it hides from
the reader; either still ties the two modules into one. An import names the most specific rlvr module it loads (`from rlvr.rollout
import base` is rlvr.rollout.base; `from rlvr.rollout import ENGINES` is rlvr.rollout); the
parent packages that Python imports first are not edges (every submodule would otherwise form
a loop with its package's `__init__`)."""

from __future__ import annotations

import ast
from pathlib import Path

import rlvr

SRC = Path(rlvr.__file__).resolve().parent.parent


def package_modules(package: Path = SRC / "rlvr") -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (its file, whether it is a package's __init__)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, mods) -> list:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level - 1 packages
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def _owner(name: str, mods) -> str | None:
    """The module an imported dotted name is, or lives in (None outside the package)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, mods) -> set[str]:
    """The rlvr modules `module` imports, wherever the import statement stands."""
    path, is_package = mods[module]
    out: set[str] = set()

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in _imported_names(node, module, is_package, mods):
                owner = _owner(name, mods) if name.split(".")[0] == "rlvr" else None
                if owner is not None and owner != module:
                    out.add(owner)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as one
    loop through them: the loops an import graph must not have."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_loop(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _loop(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One closed path inside `component` (first module repeated at the end), for the message."""
    start = min(component)
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in component)
        back = [w for w in nxt if w in seen]
        if back:
            return [*path[path.index(back[0]) :], back[0]]
        path.append(nxt[0])
        seen.add(nxt[0])


def test_package_has_no_import_cycle():
    mods = package_modules()
    assert "rlvr.rollout.fast" in mods and "rlvr.training.setup" in mods  # the walk found them
    graph = {m: imports(m, mods) for m in mods}
    loops = cycles(graph)
    assert not loops, "import cycles in src/rlvr: " + "; ".join(" -> ".join(c) for c in loops)


def test_no_cycle_when_a_package_counts_for_the_names_it_gives():
    """The stricter reading: `from rlvr.x import y` is an edge to rlvr.x itself, even where y is
    a submodule, so a package's `__init__` stands for everything imported through it."""
    mods = package_modules()
    graph = {}
    for m, (path, _) in mods.items():
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                owner = _owner(name, mods) if name.split(".")[0] == "rlvr" else None
                if owner is not None and owner != m:
                    out.add(owner)
        graph[m] = out
    loops = cycles(graph)
    assert not loops, "import cycles in src/rlvr: " + "; ".join(" -> ".join(c) for c in loops)


def test_walk_sees_function_level_relative_and_type_checking_imports(tmp_path):
    """The walk on a hand-made package: a.py imports b at the top, b imports a inside a
    function (a loop), c imports a only under TYPE_CHECKING (an edge all the same)."""
    pkg = tmp_path / "rlvr" / "p"
    pkg.mkdir(parents=True)
    (tmp_path / "rlvr" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from rlvr.p.a import X\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\nimport os\n"
    )
    mods = package_modules(tmp_path / "rlvr")
    graph = {m: imports(m, mods) for m in mods}
    assert graph == {
        "rlvr": set(),
        "rlvr.p": set(),
        "rlvr.p.a": {"rlvr.p.b"},
        "rlvr.p.b": {"rlvr.p.a"},
        "rlvr.p.c": {"rlvr.p.a"},
    }
    assert cycles(graph) == [["rlvr.p.a", "rlvr.p.b", "rlvr.p.a"]]


def test_cycles_on_a_hand_made_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
