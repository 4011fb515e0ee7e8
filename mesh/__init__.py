"""The simulated Trainium2 machine: chips, torus topology and mesh placement.

Imports nothing from ``lowering`` or ``jax_trn2``.
"""

from mesh.chip import ChipSpec
from mesh.topology import TOPOLOGY_NAMES, Link, Placement, Topology, get_topology, place_mesh

__all__ = [
    "ChipSpec",
    "Link",
    "Placement",
    "TOPOLOGY_NAMES",
    "Topology",
    "place_mesh",
    "get_topology",
]
