"""The packages of ``broker`` depend on each other one way: no import cycle between them."""

from __future__ import annotations

import ast
from pathlib import Path

import broker

ROOT = Path(broker.__file__).parent


def _package_imports() -> dict[str, set[str]]:
    """First-level package (or top-level module) -> the others it imports."""
    edges: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        if path.name.endswith("_pb2.py") or path.name.endswith("_pb2_grpc.py"):
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        here = parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                if name.startswith("broker."):
                    there = name.split(".")[1]
                    if there != here:
                        edges.setdefault(here, set()).add(there)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph, or [] (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for after in sorted(edges.get(node, ())):
            if state.get(after) == 1:
                return [*path[path.index(after) :], after]
            if after not in state and (found := visit(after)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_no_package_imports_back_into_one_that_imports_it() -> None:
    edges = _package_imports()
    assert edges["roles"] >= {"runtime", "wire"}  # the map is read, not empty
    assert _cycle(edges) == [], " -> ".join(_cycle(edges))


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) == []
