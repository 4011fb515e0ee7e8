"""Users' scripts as the command line names them: `script.py:function`, and the example
arguments a script defines for its function (`example_args()` by default)."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from pathlib import Path
from typing import Callable


def load_target(target: str) -> tuple[types.ModuleType, Callable]:
    """The module of a `script.py:function` target, imported from its file (its folder put
    first on sys.path for its own imports), and the function; errors naming what is
    missing."""
    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"expected script.py:function, got {target!r}")
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.resolve().parent))  # the script's own imports
    if spec.name not in sys.modules:  # importable by name: `plan`'s worker processes
        sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, name, None)):
        raise ValueError(f"{path} has no function {name!r}")
    return module, getattr(module, name)


def example_arguments(module: types.ModuleType, fun: Callable, args_function: str,
                      target: str) -> tuple[tuple, dict]:
    """(args, kwargs) from the script's `args_function`, or none for a function that takes
    no arguments."""
    builder = getattr(module, args_function, None)
    if builder is None:
        if required_parameters(fun):
            raise ValueError(f"{target} takes arguments: define {args_function}() in the "
                             "script, returning them (a tuple, or (args, kwargs)), or name "
                             "another function with --args")
        return (), {}
    if not callable(builder):
        raise ValueError(f"{args_function} in {module.__file__} is a "
                         f"{type(builder).__name__}, not a function: define "
                         f"{args_function}() returning the arguments (a tuple, or "
                         "(args, kwargs))")
    made = builder()
    is_args_and_kwargs = (isinstance(made, tuple) and len(made) == 2
                          and isinstance(made[0], (tuple, list)) and isinstance(made[1], dict))
    if is_args_and_kwargs:
        return tuple(made[0]), made[1]
    return (tuple(made) if isinstance(made, (tuple, list)) else (made,)), {}


def required_parameters(fun: Callable) -> int:
    """How many positional parameters `fun` has without a default (0 if it has no
    signature Python can read)."""
    try:
        params = inspect.signature(fun).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               for p in params)
