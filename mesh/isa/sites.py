"""Where an instruction comes from, as the listing, the estimate's tables and the trace show
it: the user's name scopes (a Flax module path), the user's source line, and the library
line that made the op (isa.Instruction's `scope`, `loc` and `via`).

Paths are shown short, never as an absolute site-packages path: relative to the working
directory when under it, the path inside its installed package (`flax/linen/linear.py`),
else the file's name.
"""

from __future__ import annotations

import functools
import os

from mesh import isa

# Directories pip installs packages into: a file under one is shown by its package path.
_PACKAGE_DIRS = ("site-packages", "dist-packages")


def short_path(path: str) -> str:
    """A source file's path as shown to users (see the module's docstring)."""
    return _short_path(path, os.getcwd())


@functools.lru_cache(maxsize=4096)
def _short_path(path: str, cwd: str) -> str:
    if not os.path.isabs(path):  # `<module>`: the module text's own lines
        return path
    parts = path.split(os.sep)
    for package_dir in _PACKAGE_DIRS:
        if package_dir in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(package_dir):])
    if path.startswith(os.path.join(cwd, "")):
        return os.path.relpath(path, cwd)
    return os.path.basename(path)


def line_text(loc: str) -> str:
    """`model.py:41` from a `path:line:col` location (its short path and line); the text
    itself when it is not one; '' for ''."""
    parts = loc.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return f"{short_path(parts[0])}:{parts[1]}"
    return loc


def site_text(instr: isa.Instruction) -> str:
    """`Model/attn/q model.py:41 (via flax/linen/linear.py:287)`: the instruction's scope,
    source line and library line, those it has; '' when it has none."""
    via = f"(via {line_text(instr.via)})" if instr.via else ""
    return " ".join(part for part in (instr.scope, line_text(instr.loc), via) if part)
