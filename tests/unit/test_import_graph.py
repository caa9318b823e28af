"""No import circle inside ``lbs``: the module-level imports between lbs's modules form no cycle.

The graph is read from the source (ast over src/lbs/**/*.py, relative imports resolved); imports
under ``if TYPE_CHECKING:`` and inside functions are left out (they run after every module has
loaded). ``from package import name`` counts as an import of ``package.name`` when that is a
module, else of ``package``. That Python runs a package's ``__init__`` before its modules is no
edge: only what a module names is.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "lbs").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: not in functions or classes' methods, not under
    ``if TYPE_CHECKING:`` (its ``else`` counts)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _type_checking(node.test):
                yield from _top_level_imports(node.body)
            yield from _top_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _top_level_imports(block)
            for handler in node.handlers:
                yield from _top_level_imports(handler.body)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _top_level_imports(node.body)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph[name]
        for node in _top_level_imports(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                targets = [
                    f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin
                    for alias in node.names
                ]
            edges.update(t for t in targets if t in modules and t != name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle (its modules in import order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_checker_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_reads_lbs() -> None:
    graph = _graph()
    assert "lbs._redis.wire" in graph["lbs._redis.connection"]
    assert "lbs.exceptions" in graph["lbs._redis.connection"]


def test_no_import_circle_inside_lbs() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or ())
