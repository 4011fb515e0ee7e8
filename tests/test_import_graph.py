"""The package's import graph: imports go one way (jax_trn2 -> lowering -> mesh), the rooms
of jax_trn2 import only the rooms below them (the compile core neither front door; the
plugin and jax_trn2.jit not each other), and no module imports itself back through others,
at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("jax_trn2", "lowering", "mesh")  # each may import the ones after it only
# jax_trn2's rooms, and the rooms each may import besides itself ("" is the package's
# __init__, which exports names lazily)
ROOMS = {
    "core": set(),
    "plugin": {"core"},
    "frontend": {"core"},
    "planner": {"core", "frontend"},
    "reports": {"core", "frontend", "plugin"},
    "cli": {"core", "frontend", "plugin", "planner", "reports"},
}


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


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "jax_trn2" and len(parts) > 2 else None


def test_rooms_import_only_the_rooms_below_them():
    found = modules()
    loose = sorted(name for name in found if name.count(".") == 1 and name != "jax_trn2"
                   and found[name].parent.name == "jax_trn2" and name.split(".")[1] not in ROOMS)
    assert loose == ["jax_trn2.__main__"], "a module outside the rooms"
    crossing = [f"{a} imports {b}" for a, targets in graph().items() for b in targets
                if room(a) in ROOMS and room(b) in ROOMS and room(b) != room(a)
                and room(b) not in ROOMS[room(a)]]
    assert not crossing


def test_no_import_circles():
    edges = graph()
    circles = []
    for start in sorted(edges):
        stack = [(start, iter(sorted(edges[start])))]
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
