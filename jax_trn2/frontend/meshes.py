"""jax_trn2.make_mesh: logical meshes placed on a simulated Trainium2 topology, usable with
jax.shard_map and NamedShardings (the machine each was made for: jax_trn2.core.machines)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from jax.sharding import AxisType, Mesh

from jax_trn2.core.machines import remember_machine
from jax_trn2.core.platform import DEFAULT_TOPOLOGY
from lowering.host import host_devices
from mesh.machine import Topology, get_topology, place_mesh

SHORT_AXIS_NAMES = "xyzwuv"



def make_mesh(axis_shapes: Sequence[int] | None = None,
              axis_names: Sequence[str] | None = None,
              axis_types: Sequence[AxisType] | None = None, *,
              topology: str | Topology = DEFAULT_TOPOLOGY,
              origin: Sequence[int] | None = None) -> Mesh:
    """A mesh of the devices of `topology`, for `jax.shard_map`, `NamedSharding`s and
    `jax.set_mesh`, as jax.make_mesh's.

    A device is a chip on the presets trn2, trn2-ultra, trn2-ultra-max and
    trn2-ultracluster-N, and a logical NeuronCore on the machines as AWS rents them
    (trn2.3xlarge, trn2.48xlarge, trn2u.48xlarge, trn2-ultraserver,
    trn2-ultraserver-cluster-N: 4 per chip at LNC=2, 8 with
    get_topology(name, lnc=1)), as JAX sees a real instance: a program written for a
    trn2.48xlarge's 64 devices runs on make_mesh((16, 4), ("fsdp", "tp"),
    topology="trn2.48xlarge"), its axis of 4 on the cores of each chip.

    Defaults to the torus itself: ('x','y','z') = (4,4,4) on trn2-ultra (with a 'core'
    axis last on a machine of logical cores). Any logical shape of at most the device
    count works: (2, 4), (8,) and (16, 4) on trn2-ultra, (4,) on trn2.
    Its devices are placed on a compact block of the torus, a logical axis as long as a
    torus axis on a physical ring and a shorter one on a segment of one, so that
    neighbours are one link apart (mesh.machine.placement.place_mesh); the chips outside
    the block do nothing. `origin` (torus coordinates) moves the block, e.g. off a failed
    chip: `topology` may be a Topology with faults (mesh.machine.get_topology(name,
    failed_links=..., degraded_links=..., failed_chips=...)).
    `axis_types` as in jax.make_mesh, positional there too (default: every axis Auto,
    unlike jax.make_mesh's Explicit; AxisType.Explicit puts shardings in types). The mesh's
    devices are host CPU devices standing in for the chips (device i is logical device i,
    row-major), so plain jax.jit also runs a program over it, on the CPU: no XLA_FLAGS are
    needed.
    """
    topo = topology if isinstance(topology, Topology) else get_topology(topology)
    shapes = topo.device_shape if axis_shapes is None else _axis_sizes(axis_shapes)
    names = _axis_names(axis_names) if axis_names is not None \
        else topo.device_axis_names if axis_shapes is None else default_axis_names(len(shapes))
    if len(names) != len(shapes):
        raise ValueError(f"axis_names {names} and axis_shapes {shapes} differ in length")
    place_mesh(topo, shapes, names, origin)  # the mesh fits the topology, or an error says so
    remember_machine(shapes, names, topo, None if origin is None else tuple(origin))
    types = tuple(axis_types) if axis_types is not None else (AxisType.Auto,) * len(shapes)
    devices = np.array(host_devices(topo.num_devices)[:math.prod(shapes)],
                       dtype=object).reshape(shapes)
    return Mesh(devices, names, axis_types=types)


def _axis_sizes(axis_shapes: Sequence[int]) -> tuple[int, ...]:
    """The mesh's axis sizes: positive ints (a bool is no size), else an error naming the
    entry."""
    try:
        sizes = tuple(axis_shapes)
    except TypeError:
        raise ValueError(f"make_mesh: axis_shapes must be a sequence of positive ints, got "
                         f"{axis_shapes!r}") from None
    for i, size in enumerate(sizes):
        if isinstance(size, (bool, np.bool_)) or not isinstance(size, (int, np.integer)) \
                or size < 1:
            raise ValueError(f"make_mesh: axis sizes must be positive ints, got {size!r} at "
                             f"position {i} of axis_shapes {sizes}")
    return tuple(int(size) for size in sizes)


def _axis_names(axis_names: str | Sequence[str]) -> tuple[str, ...]:
    """The mesh's axis names: strings, as jax names mesh axes (one string is one name, as
    in jax.sharding.Mesh), else an error naming the entry."""
    names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise ValueError(f"make_mesh: axis names must be strings, got {name!r} "
                             f"({type(name).__name__}) at position {i} of axis_names {names}")
    return names


def default_axis_names(rank: int) -> tuple[str, ...]:
    """'x', 'y', 'z', 'w', 'u', 'v' for up to six axes; 'axis0', 'axis1', ... beyond."""
    return tuple(SHORT_AXIS_NAMES[:rank]) if rank <= len(SHORT_AXIS_NAMES) else \
        tuple(f"axis{i}" for i in range(rank))
