"""The package's layering, read from its source: no import cycles, and no layer imports upward.

Every module under ``jupyter_pause/`` is parsed with ``ast``; every ``import`` and ``from ...
import`` counts, at module level or inside a function (a lazy import is an edge all the same:
it only moves the cycle to run time). The graph has one node per module of the package; an
import of ``pkg.mod.name`` is an edge to ``pkg.mod`` when ``name`` is not a module of its own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "jupyter_pause"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

#: Where a part runs, and what it must never import (prefixes of module names).
FORBIDDEN = {
    "jupyter_pause.kernel": (
        "jupyter_pause.server",
        "jupyter_pause.cli",
        "jupyter_server",
        "tornado",
    ),
    "jupyter_pause.backends": ("jupyter_pause.server", "jupyter_pause.cli"),
    "jupyter_pause.usage": ("jupyter_pause.cli",),
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package, by dotted name (the labextension's build output aside)."""
    return {
        module_name(path, root): path
        for path in sorted(root.rglob("*.py"))
        if "labextension" not in path.relative_to(root).parts
    }


def imported_names(name: str, path: Path) -> Iterable[tuple[str, str, int]]:
    """(dotted name, the module it is in, line) of everything ``path`` imports, relative
    imports made absolute: ``from m import x`` gives ``("m.x", "m", line)``, ``import m.x``
    gives ``("m.x", "m.x", line)``.

    The parent packages that any import initialises first are not edges: a package's
    ``__init__`` is imported by every import of one of its submodules."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                yield f"{source}.{alias.name}", source, node.lineno


def resolve(target: str, source: str, known: dict[str, Path]) -> str | None:
    """The package module an import names: the submodule ``target``, or else the module
    ``source`` it is imported from; None outside the package (or a module the build writes,
    such as ``_version``)."""
    for candidate in (target, source):
        if candidate in known:
            return candidate
    return None


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}, within the package."""
    known = modules(root)
    graph: dict[str, dict[str, int]] = {name: {} for name in known}
    for name, path in known.items():
        for target, source, line in imported_names(name, path):
            found = resolve(target, source, known)
            if found and found != name:
                graph[name].setdefault(found, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one
    cycle's path through it, e.g. ``[a, b, c, a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [cycle_path(graph, component) for component in components]


def cycle_path(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, for the failure message."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt == start:
                    return [*paths[node], start]
                if nxt in component and nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    return sorted(component)  # unreachable for a strongly connected component


def describe(graph: dict[str, dict[str, int]], path: list[str]) -> str:
    return " -> ".join(
        f"{a} (line {graph[a][b]})" if b else a for a, b in zip(path, [*path[1:], ""], strict=True)
    )


def test_the_package_has_no_import_cycles() -> None:
    # Given the import graph of every module of the package
    graph = import_graph()

    # When its cycles are found
    found = cycles(graph)

    # Then there are none
    assert not found, "import cycles:\n" + "\n".join(describe(graph, path) for path in found)


def upward_imports(root: Path = ROOT) -> list[str]:
    """``file:line imports name`` for each import that a layer of FORBIDDEN must not make."""
    wrong = set()
    for name, path in modules(root).items():
        for layer, forbidden in FORBIDDEN.items():
            if name != layer and not name.startswith(layer + "."):
                continue
            for target, _source, line in imported_names(name, path):
                if any(target == p or target.startswith(p + ".") for p in forbidden):
                    wrong.add(f"{path.relative_to(root.parent)}:{line} imports {target}")
    return sorted(wrong)


def test_no_layer_imports_upward() -> None:
    # Given every import of every module, as written (outside names too: jupyter_server...)
    wrong = upward_imports()

    # Then the kernel side, the backends and the usage report never import a layer above them
    assert not wrong, "imports across layers:\n" + "\n".join(wrong)


def test_the_check_finds_a_planted_cycle(tmp_path: Path) -> None:
    # Given a package in which a imports b at module level and b imports a in a function
    package = tmp_path / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from . import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from .a import g\n")
    (package / "c.py").write_text("import jupyter_pause.sub.b\n")
    (package / "kernel").mkdir()
    (package / "kernel" / "__init__.py").write_text("")
    (package / "kernel" / "k.py").write_text("def f():\n    from tornado import web\n")

    # When the check reads it
    graph = import_graph(package)

    # Then it finds the cycle, with its path, and nothing else
    assert cycles(graph) == [["jupyter_pause.sub.a", "jupyter_pause.sub.b", "jupyter_pause.sub.a"]]
    assert "jupyter_pause.sub.a (line 1) -> jupyter_pause.sub.b (line 2)" in describe(
        graph, cycles(graph)[0]
    )
    # And the kernel side's lazy import of tornado
    assert upward_imports(package) == ["jupyter_pause/kernel/k.py:2 imports tornado.web"]
