"""jax-trn2: run and study JAX programs on a simulated AWS Trainium2 mesh.

    jax.devices("trn2")                  # the simulated chips (the plugin: jax_trn2.plugin)
    mesh = jax_trn2.make_mesh()          # 64 chips of a Trn2-Ultra: ('x','y','z') = (4,4,4)
    step = jax_trn2.jit(step)            # jax.jit on them, with the simulator's own options
    out = step(a, b)                     # runs on the simulated mesh

Names are imported when first used: jax imports jax_trn2.plugin whenever it starts its
backends, which must not load the simulator.
"""

from __future__ import annotations

import importlib
import sys
import types
from importlib import metadata as _metadata
from typing import Any

try:
    __version__ = _metadata.version("jax-trn2")  # pyproject.toml's, as installed
except _metadata.PackageNotFoundError:  # a source tree on sys.path that pip never installed
    __version__ = "0+unknown"

_EXPORTS = {
    "Client": "jax_trn2.client", "client": "jax_trn2.client",
    "Buffer": "jax_trn2.device", "Device": "jax_trn2.device",
    "HostMemoryError": "jax_trn2.executable", "LoadedExecutable": "jax_trn2.executable",
    "jit": "jax_trn2.jit", "Compiled": "jax_trn2.jit", "Jitted": "jax_trn2.jit",
    "Lowered": "jax_trn2.jit", "listing": "jax_trn2.plugin.executable",
    "inspect": "jax_trn2.plugin.executable",
    "flash_attention": "jax_trn2.attention",
    "make_mesh": "jax_trn2.mesh",
    "LoweringError": "lowering", "UnsupportedOpError": "lowering",
    "SplitCollectiveError": "mesh.isa.kernels.participation",
    "TOPOLOGY_NAMES": "mesh.machine",
    "MemoryStats": "mesh.memory", "OutOfHBMError": "mesh.memory",
}

# Modules users reach as attributes, `jax_trn2.plan.sweep(...)` after `import jax_trn2`.
_SUBMODULES = {"numerics", "plan", "serving", "training"}

__all__ = sorted(_EXPORTS.keys() | _SUBMODULES)


class _Package(types.ModuleType):
    """This package, whose names `jit` and `client` are functions of submodules of the same
    names: importing such a submodule (`from jax_trn2.jit import Jitted`, first) makes
    Python set the package's attribute of its name to the module, which would then shadow
    the function (`jax_trn2.jit(f)`: "'module' object is not callable")."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")  # which sets the attribute
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'jax_trn2' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
