"""jax-trn2: run and study JAX programs on a simulated AWS Trainium2 mesh.

    jax.devices("trn2")                  # the simulated chips (the plugin: jax_trn2.plugin)
    mesh = jax_trn2.make_mesh()          # 64 chips of a Trn2-Ultra: ('x','y','z') = (4,4,4)
    step = jax_trn2.jit(step)            # jax.jit on them, with the simulator's own options
    out = step(a, b)                     # runs on the simulated mesh

The package's rooms: `core` (the compile core both front doors call), `plugin` (the PJRT
plugin: jax.jit on jax.devices("trn2")), `frontend` (jax_trn2.jit, meshes, attention),
`planner` (layouts, sweeps, training and serving figures), `reports` (numerics
comparison, plots), `cli` (the command line). Names are imported when first used: jax
imports jax_trn2.plugin whenever it starts its backends, which must not load the simulator.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from importlib import metadata as _metadata
from typing import Any

try:
    __version__ = _metadata.version("jax-trn2")  # pyproject.toml's, as installed
except _metadata.PackageNotFoundError:  # a source tree on sys.path that pip never installed
    __version__ = "0+unknown"

_EXPORTS = {
    "Client": "jax_trn2.core.client", "client": "jax_trn2.core.client",
    "Buffer": "jax_trn2.core.device", "Device": "jax_trn2.core.device",
    "HostMemoryError": "jax_trn2.core.executable", "LoadedExecutable": "jax_trn2.core.executable",
    "ProcessLostError": "jax_trn2.core.processes",
    "jit": "jax_trn2.frontend.jit", "Compiled": "jax_trn2.frontend.jit",
    "Jitted": "jax_trn2.frontend.jit", "Lowered": "jax_trn2.frontend.jit",
    "listing": "jax_trn2.reports.inspection", "inspect": "jax_trn2.reports.inspection",
    "flash_attention": "jax_trn2.frontend.attention",
    "make_mesh": "jax_trn2.frontend.meshes",
    "LoweringError": "lowering", "UnsupportedOpError": "lowering",
    "SplitCollectiveError": "mesh.isa.kernels.participation",
    "TOPOLOGY_NAMES": "mesh.machine",
    "MemoryStats": "mesh.memory", "OutOfHBMError": "mesh.memory",
}

# Modules users reach as `jax_trn2.<name>` (`jax_trn2.plan.sweep(...)`, `from jax_trn2
# import plan`, `import jax_trn2.plan`), by the module that holds them.
_PUBLIC_MODULES = {
    "numerics": "jax_trn2.reports.numerics", "plan": "jax_trn2.planner.api",
    "serving": "jax_trn2.planner.serving", "training": "jax_trn2.planner.training",
    "layout": "jax_trn2.planner.layout",
}

__all__ = sorted(_EXPORTS.keys() | _PUBLIC_MODULES.keys())


def __getattr__(name: str) -> Any:
    if name in _PUBLIC_MODULES:
        value = importlib.import_module(_PUBLIC_MODULES[name])
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'jax_trn2' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _PublicModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import jax_trn2.plan` (and `from jax_trn2.plan import sweep`): the module that
    holds it, under the public name too."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in _PUBLIC_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(_PUBLIC_MODULES[spec.name.rpartition(".")[2]])

    def exec_module(self, module) -> None:
        pass  # the module that holds the public name ran when it was imported


sys.meta_path.append(_PublicModuleFinder())
