"""No import circle inside a package: the graph of which module imports which (read from the source with ast, any
import at any depth, ``if TYPE_CHECKING:`` ones too: a type-only import is still a dependency) is acyclic."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str, root: Path = REPO) -> dict[str, set[str]]:
    """Each module of ``package`` (a dotted name, under ``root``) -> the modules of the same package it imports. A
    name that is not a module (``from a.b import C``) counts as the module it comes from; the parent packages that
    importing a submodule runs are not counted."""
    files = sorted((root / package.replace(".", "/")).rglob("*.py"))
    modules = {module_name(root, f): f for f in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package, up level - 1
                    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            for n in names:
                while n and n not in modules:
                    n = n.rpartition(".")[0]
                if n and n != name:
                    targets.add(n)
                    break
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle of each strongly connected group of more than one module (Tarjan's), as a path that returns to its
    first module; [] when the graph is acyclic."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_path_around(graph, group) for group in groups]


def _path_around(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    first = min(group)
    path, seen = [first], {first}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in group)
        back = [w for w in nxt if w == first]
        if back or not nxt:
            return path + back
        step = next((w for w in nxt if w not in seen), nxt[0])
        if step in seen:
            return path[path.index(step):] + [step]
        path.append(step)
        seen.add(step)


def test_the_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_reads_type_only_relative_and_nested_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text("def f():\n    from .a import x\n")
    graph = import_graph("pkg", tmp_path)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_governor_policy_has_no_import_circle():
    assert circles(import_graph("governor.policy")) == []


def test_governor_daemon_has_no_import_circle():
    assert circles(import_graph("governor.daemon")) == []
