"""jax-trn2: run and study JAX programs on a simulated AWS Trainium2 mesh.

    mesh = jax_trn2.make_mesh()          # 64 chips of a Trn2-Ultra: ('x','y','z') = (4,4,4)
    step = jax_trn2.jit(step)            # a function using jax.shard_map over that mesh
    out = step(a, b)                     # runs on the simulated mesh
"""

from importlib import metadata as _metadata

from jax_trn2 import numerics
from jax_trn2.attention import flash_attention
from jax_trn2.client import Client, client
from jax_trn2.device import Buffer, Device
from jax_trn2.executable import HostMemoryError, LoadedExecutable
from jax_trn2.jit import Compiled, Jitted, Lowered, jit
from jax_trn2.mesh import make_mesh
from lowering import LoweringError, UnsupportedOpError
from mesh.isa.kernels.participation import SplitCollectiveError
from mesh.machine import TOPOLOGY_NAMES
from mesh.memory import MemoryStats, OutOfHBMError

try:
    __version__ = _metadata.version("jax-trn2")  # pyproject.toml's, as installed
except _metadata.PackageNotFoundError:  # a source tree on sys.path that pip never installed
    __version__ = "0+unknown"

__all__ = [
    "Buffer", "Client", "Compiled", "Device", "HostMemoryError", "Jitted", "LoadedExecutable",
    "Lowered",
    "LoweringError", "MemoryStats", "OutOfHBMError", "SplitCollectiveError", "TOPOLOGY_NAMES",
    "UnsupportedOpError",
    "client", "flash_attention", "jit", "make_mesh", "numerics",
]
