"""The import graph of the `warren` package and its loops (strongly connected components).

    python tests/import_graph.py [--runtime] [--edges]

Every import of a `warren` module by another counts, wherever it is written: at the top,
inside a function (a lazy import), or under ``if TYPE_CHECKING:`` (an annotation's import,
which mypy and mypyc follow as they follow the others). ``--runtime`` leaves out the
``TYPE_CHECKING`` ones. Prints each component of more than one module, largest first, with
its size and members; ``--edges`` also prints the imports inside each, marked ``T`` for
``TYPE_CHECKING`` and ``L`` for lazy. An import names the module it reaches (``from
warren.broker.engine import queue`` reaches ``warren.broker.engine.queue``), not the packages
Python also runs on the way. tests/test_import_graph.py keeps the largest component's size.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "warren"
PACKAGE = "warren"


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    line: int
    type_checking: bool
    lazy: bool


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (warren/'s links are followed)."""
    found: dict[str, Path] = {}
    paths = [
        Path(folder, file)
        for folder, _, files in os.walk(ROOT, followlinks=True)
        for file in files
        if file.endswith(".py")
    ]
    for path in sorted(paths):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([PACKAGE, *parts])] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _reached(
    node: ast.Import | ast.ImportFrom, name: str, is_package: bool, known: dict[str, Path]
) -> set[str]:
    """The package's modules an import statement in module ``name`` reaches."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = node.module or ""
    if node.level:
        parts = name.split(".")
        if not is_package:
            parts.pop()
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, base] if base else parts)
    # `from a.b import c` reaches the module a.b.c if there is one, else a.b (c is in it)
    reached = set()
    for alias in node.names:
        target = f"{base}.{alias.name}"
        reached.add(target if target in known else base)
    return reached & known.keys()


def _visit(
    node: ast.AST,
    name: str,
    is_package: bool,
    known: dict[str, Path],
    found: list[Edge],
    type_checking: bool = False,
    lazy: bool = False,
) -> None:
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        for stmt in node.body:
            _visit(stmt, name, is_package, known, found, True, lazy)
        for stmt in node.orelse:
            _visit(stmt, name, is_package, known, found, type_checking, lazy)
        return
    if isinstance(node, ast.Import | ast.ImportFrom):
        for target in sorted(_reached(node, name, is_package, known) - {name}):
            found.append(Edge(name, target, node.lineno, type_checking, lazy))
        return
    lazy = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    for child in ast.iter_child_nodes(node):
        _visit(child, name, is_package, known, found, type_checking, lazy)


def edges(known: dict[str, Path]) -> list[Edge]:
    """Every import of one of the package's modules by another, in module order."""
    found: list[Edge] = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        _visit(tree, name, path.name == "__init__.py", known, found)
    return found


def components(nodes: list[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                member = None
                scc = []
                while member != node:
                    member = stack.pop()
                    on_stack.discard(member)
                    scc.append(member)
                result.append(sorted(scc))
    return result


def loops(runtime_only: bool = False) -> tuple[list[list[str]], list[Edge]]:
    """The components of more than one module, largest first, and the edges counted."""
    known = modules()
    counted = [e for e in edges(known) if not (runtime_only and e.type_checking)]
    graph: dict[str, set[str]] = {}
    for edge in counted:
        graph.setdefault(edge.importer, set()).add(edge.imported)
    found = [c for c in components(sorted(known), graph) if len(c) > 1]
    found.sort(key=lambda c: (-len(c), c))
    return found, counted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", action="store_true", help="leave out TYPE_CHECKING imports")
    parser.add_argument("--edges", action="store_true", help="print the imports inside each")
    args = parser.parse_args(argv)
    found, counted = loops(args.runtime)
    print(f"{len(modules())} modules, {len(counted)} imports; loops: {len(found)}")
    for scc in found:
        print(f"\n{len(scc)} modules:")
        members = set(scc)
        for module in scc:
            print(f"  {module}")
            if args.edges:
                for e in counted:
                    if e.importer == module and e.imported in members:
                        mark = ("T" if e.type_checking else " ") + ("L" if e.lazy else " ")
                        print(f"      {mark} -> {e.imported} (line {e.line})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
