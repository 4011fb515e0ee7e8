"""Logical meshes over a simulated Trainium2 topology, usable with jax.shard_map."""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np
from jax.sharding import AxisType, Mesh

from jax_trn2.plugin.options import DEFAULT_TOPOLOGY
from lowering.host import host_devices
from mesh.machine import (TOPOLOGY_NAMES, ULTRACLUSTER_PREFIX, Placement, Topology,
                          get_topology, place_first, place_mesh)

# The mesh of an SPMD module's processes (lowering.replica_groups.ProcessGrid).
PROCESS_GRID_AXES = ("replica", "partition")
ULTRASERVER_CHIPS = 64
SHORT_AXIS_NAMES = "xyzwuv"

# Topology of each mesh shape make_mesh handed out, so that jit can find the machine a
# shard_map's mesh was made for, and the block origin it was placed at (the lowered module
# only carries axis names and sizes).
_MESH_MACHINES: dict[tuple[tuple[int, ...], tuple[str, ...]],
                     tuple[Topology, tuple[int, ...] | None]] = {}


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
    _remember_machine(shapes, names, topo, None if origin is None else tuple(origin))
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


def _remember_machine(shapes: tuple[int, ...], names: tuple[str, ...], topo: Topology,
                      origin: tuple[int, ...] | None) -> None:
    """Record the machine a mesh was made for. jax makes meshes of the same shape, names
    and devices one object, and the lowered module carries only shape and names, so a
    mesh made again for another machine moves the first one's programs there too: say so."""
    before = _MESH_MACHINES.get((shapes, names))
    if before is not None and before != (topo, origin):
        warnings.warn(
            f"make_mesh: a mesh {shapes} {names} was made before for "
            f"{_machine_text(*before)}; jax treats meshes of the same shape, axis names and "
            f"devices as one mesh, so programs over either traced from now on run on "
            f"{_machine_text(topo, origin)}. To keep both machines, give the meshes "
            "different axis names (or pass topology= to jax_trn2.jit)", stacklevel=3)
    _MESH_MACHINES[(shapes, names)] = (topo, origin)


def _machine_text(topo: Topology, origin: tuple[int, ...] | None) -> str:
    faults = f" ({topo.faults_text()})" if topo.has_faults else ""
    return f"'{topo.name}'{faults}" + (f" at origin {origin}" if origin is not None else "")


def default_axis_names(rank: int) -> tuple[str, ...]:
    """'x', 'y', 'z', 'w', 'u', 'v' for up to six axes; 'axis0', 'axis1', ... beyond."""
    return tuple(SHORT_AXIS_NAMES[:rank]) if rank <= len(SHORT_AXIS_NAMES) else \
        tuple(f"axis{i}" for i in range(rank))


def topology_for(axis_sizes: tuple[int, ...], axis_names: tuple[str, ...],
                 topology: str | Topology | None) -> Topology:
    """The topology a program's mesh runs on: the one asked for, else the one make_mesh
    made that mesh for, else default_topology(axis_sizes)."""
    if topology is None:
        topology = _MESH_MACHINES.get((axis_sizes, axis_names), (None, None))[0]
    if isinstance(topology, Topology):
        return topology
    if topology is None:
        return default_topology(axis_sizes)
    return get_topology(topology)


def default_topology(axis_sizes: tuple[int, ...]) -> Topology:
    """make_mesh's default topology (trn2-ultra, 64 chips) when it holds a mesh of these
    sizes (and for a program without a mesh), else the smallest preset that does
    (trn2-ultra-max: 256 chips, then UltraClusters of as many 64-chip UltraServers as it
    takes): a module's mesh and make_mesh's meet the same machine by default."""
    count = math.prod(axis_sizes)
    holding = [t for t in TOPOLOGY_NAMES if get_topology(t).num_devices >= count]
    if DEFAULT_TOPOLOGY in holding:
        return get_topology(DEFAULT_TOPOLOGY)
    return get_topology(min(holding, key=lambda t: get_topology(t).num_chips) if holding
                        else f"{ULTRACLUSTER_PREFIX}{-(-count // ULTRASERVER_CHIPS)}")


def placement_for(topo: Topology, axis_sizes: tuple[int, ...], axis_names: tuple[str, ...],
                  origin: Sequence[int] | None = None) -> Placement | None:
    """Where each logical device sits; a program without a mesh runs on device 0. An SPMD
    module's processes (mesh ('replica', 'partition')) take the first devices, as PJRT's
    default device assignment; a jax mesh is placed on the torus (place_mesh). `origin`
    (torus coordinates) moves either block there; by default a jax mesh sits where
    make_mesh placed it."""
    if not axis_sizes:
        if origin is not None:
            raise ValueError(f"origin {tuple(origin)} places a mesh, but the program has "
                             "none: it runs on chip 0")
        return None
    if axis_names == PROCESS_GRID_AXES:
        return place_first(topo, axis_sizes, axis_names, origin)
    if origin is None:
        made_on, made_at = _MESH_MACHINES.get((axis_sizes, axis_names), (None, None))
        origin = made_at if made_on == topo else None
    return place_mesh(topo, axis_sizes, axis_names, origin)
