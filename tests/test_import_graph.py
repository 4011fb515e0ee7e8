"""The package's import graph: imports go one way (jax_trn2 -> lowering -> mesh), and no
module imports itself back through others, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("jax_trn2", "lowering", "mesh")  # each may import the ones after it only


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for layer in LAYERS for p in (REPO / layer).rglob("*.py")}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules `name` imports anywhere in its file (`from a import b` names
    a.b when that is a module, else a)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                      for alias in node.names}
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def test_imports_go_one_way_between_layers():
    upward = [f"{a} imports {b}" for a, targets in graph().items() for b in targets
              if LAYERS.index(b.split(".")[0]) < LAYERS.index(a.split(".")[0])]
    assert not upward


def test_no_import_circles():
    edges = graph()
    circles = []
    for start in sorted(edges):
        path, stack = [], [(start, iter(sorted(edges[start])))]
        seen = {start}
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                continue
            if child == start:
                circles.append(" -> ".join([n for n, _ in stack] + [start]))
                continue
            if child not in seen and child > start:  # each circle once, from its least module
                seen.add(child)
                stack.append((child, iter(sorted(edges[child]))))
    assert not circles, "\n".join(circles)
