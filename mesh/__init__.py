"""The simulated Trainium2 machine.

- `mesh.machine`: the hardware description: chip spec, torus topology, mesh placement.
- `mesh.isa`: the Trn2 instruction set that lowering emits, its listing, and its kernels.
- `mesh.executor`: runs a program of that instruction set on all chips at once.
- `mesh.perf`: the performance model: costs, collectives on the torus, schedule, estimate,
  trace.
- `mesh.fusion`, `mesh.fused_kernels`: what the chip keeps out of HBM (fused elementwise
  chains, views) and the composites it runs as one fused kernel: the cost model and
  mesh.memory read both, lowering the kernels' names.
- `mesh.memory`: which buffers a chip holds in HBM, and when.
- `mesh.numerics`, `mesh.dtypes`: the chip's arithmetic and element types.

Imports nothing from ``lowering`` or ``jax_trn2``.
"""

from mesh.machine import (TOPOLOGY_NAMES, ChipSpec, Link, Placement, Topology, get_topology,
                          place_mesh)

__all__ = [
    "ChipSpec",
    "Link",
    "Placement",
    "TOPOLOGY_NAMES",
    "Topology",
    "place_mesh",
    "get_topology",
]
