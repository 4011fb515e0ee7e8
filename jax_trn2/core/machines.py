"""The machine a program runs on: the one asked for, else the one jax_trn2.make_mesh made
its mesh for (the lowered module carries only the mesh's axis names and sizes), else the
default for its size; and where its devices sit on that machine's torus."""

from __future__ import annotations

import math
import warnings
from typing import Sequence

from jax_trn2.core.platform import DEFAULT_TOPOLOGY
from mesh.machine import (TOPOLOGY_NAMES, ULTRACLUSTER_PREFIX, Placement, Topology,
                          get_topology, place_first, place_mesh)

# The mesh of an SPMD module's processes (lowering.replica_groups.ProcessGrid).
PROCESS_GRID_AXES = ("replica", "partition")
ULTRASERVER_CHIPS = 64

# Topology of each mesh shape make_mesh handed out, so that jit can find the machine a
# shard_map's mesh was made for, and the block origin it was placed at (the lowered module
# only carries axis names and sizes).
_MESH_MACHINES: dict[tuple[tuple[int, ...], tuple[str, ...]],
                     tuple[Topology, tuple[int, ...] | None]] = {}


def remember_machine(shapes: tuple[int, ...], names: tuple[str, ...], topo: Topology,
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
