"""GSPMD shardings: XLA's HloSharding text, as in `mhlo.sharding` attributes.

jax without Shardy (jax_use_shardy_partitioner=False) emits a global program whose values
carry HloShardings (`{devices=[4,1,16]<=[4,4,4]T(1,0,2) last_tile_dim_replicate}`) and marks
shard_map bodies with the custom calls SPMDFullToShardShape / SPMDShardToFullShape. Such a
module names no mesh: the mesh is the finest one all its tilings are made of. Each tiling is
an array of device ids over the tile grid; along each tile dim the ids step through one or
more mesh axes (row-major device ids), so a tiling reads as mesh axes per dim, major first,
as sdy shardings and isa.Shard put it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from jaxlib import xla_client

from lowering import mlir
from lowering.errors import unreduced_values
from mesh import isa

# Kinds of the trailing subgroup dims of a tiling (`last_tile_dims={manual, replicated}`).
REPLICATED = "REPLICATED"
MANUAL = "MANUAL"
UNREDUCED = "UNREDUCED"

SHARDING_ATTR = "mhlo.sharding"


@dataclass(frozen=True)
class Tiling:
    """A tiled HloSharding: device ids over the tile grid ([data dims..., subgroup dims...])
    and the kind of each subgroup dim."""

    devices: np.ndarray
    subgroups: tuple[str, ...]

    @property
    def data_rank(self) -> int:
        return self.devices.ndim - len(self.subgroups)


def of_layout(dim_axes: tuple | None, axis_sizes: tuple[int, ...],
              unreduced: tuple[int, ...] = ()) -> xla_client.HloSharding:
    """The HloSharding of a layout (the inverse of `dim_axes`): dim d split over the mesh
    axes dim_axes[d] (major first), the axes `unreduced` holding partial sums, the other
    axes replicated; devices numbered row-major over the mesh (partition order)."""
    if not unreduced and (not dim_axes or not any(dim_axes)):
        return xla_client.HloSharding.replicate()
    if set(unreduced) == set(range(len(axis_sizes))) and not any(dim_axes or ()):
        return xla_client.HloSharding.from_string("{unreduced}")  # (as XLA writes it)
    used = [a for axes in dim_axes or () for a in axes]
    unused = [a for a in range(len(axis_sizes)) if a not in used and a not in unreduced]
    tiles = [_size(axes, axis_sizes) for axes in dim_axes or ()]
    # subgroup dims follow the data dims, in the order of their axes in the permutation
    # (which takes every mesh axis: one of size 1 may stand anywhere); one of a single
    # device is left out, as XLA leaves it
    subgroups = [(kind, _size(axes, axis_sizes)) for kind, axes in
                 [(xla_client.OpSharding.Type.UNREDUCED, unreduced),
                  (xla_client.OpSharding.Type.REPLICATED, unused)]
                 if _size(axes, axis_sizes) > 1]
    return xla_client.HloSharding.iota_tile(
        tiles + [size for _, size in subgroups], list(axis_sizes),
        used + list(unreduced) + unused, [kind for kind, _ in subgroups])


def _size(axes, axis_sizes: tuple[int, ...]) -> int:
    return int(np.prod([axis_sizes[a] for a in axes], dtype=np.int64))


def _from_string(text: str):
    try:
        sharding = xla_client.HloSharding.from_string(text)
    except Exception as e:  # the bindings raise their own error types
        raise ValueError(f"not an HloSharding: {text!r} ({e})") from None
    if sharding.tuple_elements():
        raise NotImplementedError(f"tuple sharding {text} is not supported by jax-trn2")
    return sharding


def elements(text: str, count: int) -> list[str]:
    """The HloShardings of `count` values from one sharding: a tuple sharding's elements,
    or the same sharding for each (a module's `mhlo.spmd_output_sharding`)."""
    try:
        sharding = xla_client.HloSharding.from_string(text)
    except Exception as e:  # the bindings raise their own error types
        raise ValueError(f"not an HloSharding: {text!r} ({e})") from None
    parts = [str(e) for e in sharding.tuple_elements()]
    if not parts:
        return [text] * count
    if count == 0 and len(parts) == 1:  # XLA gives the empty tuple one element: `{{replicated}}`
        return []
    if len(parts) != count:
        raise ValueError(f"tuple sharding {text} has {len(parts)} elements for {count} values")
    return parts


def parse(text: str, unreduced: bool = False) -> Tiling | None:
    """The tiling of an HloSharding, None when it is replicated, manual or maximal (one
    device holds the whole value, the others a copy: replicated in the simulator).
    `unreduced`: whether the caller takes unreduced axes (unreduced_axes), as a partitioned
    program's parameters and results have them; elsewhere they are refused."""
    sharding = _from_string(text)
    if sharding.is_unreduced():  # (no tile assignment: it would read as no devices)
        if unreduced:
            return None
        raise unreduced_values(text)
    if sharding.is_manual() or sharding.is_replicated() or sharding.is_maximal():
        return None
    dims = tuple(sharding.tile_assignment_dimensions())
    devices = np.asarray(sharding.tile_assignment_devices(), np.int64).reshape(dims)
    subgroups = tuple(t.name for t in sharding.subgroup_types())
    if sharding.replicate_on_last_tile_dim():
        subgroups = (REPLICATED,)
    if UNREDUCED in subgroups and not unreduced:
        raise unreduced_values(text)
    unknown = set(subgroups) - {REPLICATED, MANUAL, UNREDUCED}
    if unknown:
        raise NotImplementedError(f"sharding {text}: subgroups {sorted(unknown)} are not "
                                  "supported by jax-trn2")
    return Tiling(devices, subgroups)


def strides(tiling: Tiling) -> list[list[tuple[int, int]]]:
    """For each tile dim, the (size, device-id stride) runs its ids step through, major
    first. ValueError when the ids are not a sum of such runs (not a mesh's tiling)."""
    devices = tiling.devices - tiling.devices.reshape(-1)[0]
    runs = []
    total = np.zeros_like(devices)
    for d in range(devices.ndim):
        line = devices[(0,) * d + (slice(None),) + (0,) * (devices.ndim - d - 1)]
        dim_runs = _runs(line)
        runs.append(dim_runs)
        shape = [1] * devices.ndim
        shape[d] = -1
        total = total + line.reshape(shape)
    if not np.array_equal(total, devices) or tiling.devices.reshape(-1)[0] != 0:
        raise ValueError(f"device order {tiling.devices.reshape(-1).tolist()} is not a "
                         "tiling of a mesh of row-major device ids")
    return runs


def _runs(line: np.ndarray) -> list[tuple[int, int]]:
    """`line[k]` as a mixed-radix number: [(size, stride), ...] major first."""
    runs: list[tuple[int, int]] = []
    block = 1  # elements covered by the runs found so far (minor first)
    while block < len(line):
        stride = int(line[block])
        size = 1
        while block * size < len(line) and np.array_equal(
                line[block * size: block * (size + 1)], line[:block] + stride * size):
            size += 1
        if size == 1 or len(line) % (block * size):
            raise ValueError(f"device ids {line.tolist()} along a tile dim do not step "
                             "through mesh axes")
        runs.append((size, stride))
        block *= size
    return runs[::-1]


def infer_mesh(tilings: Iterable[Tiling], num_devices: int) -> isa.MeshSpec:
    """The coarsest mesh of `num_devices` row-major device ids every tiling is made of:
    its axes are cut where some tiling's runs begin or end."""
    cuts = {1, num_devices}
    for tiling in tilings:
        if tiling.devices.size != num_devices:
            raise ValueError(f"a sharding over {tiling.devices.size} devices in a program "
                             f"over {num_devices}")
        for dim_runs in strides(tiling):
            for size, stride in dim_runs:
                cuts |= {stride, stride * size}
    cuts_sorted = sorted(cuts)
    sizes = []
    for lower, upper in zip(cuts_sorted[:-1], cuts_sorted[1:]):
        if upper % lower:
            raise ValueError(f"the program's shardings cut its {num_devices} devices at "
                             f"strides {cuts_sorted}, which no one mesh has")
        sizes.append(upper // lower)
    sizes = sizes[::-1]  # major first
    return isa.MeshSpec(tuple(f"d{i}" for i in range(len(sizes))), tuple(sizes))


def dim_axes(tiling: Tiling, mesh: isa.MeshSpec) -> tuple[tuple[int, ...], ...]:
    """The mesh axes each data dim of the tiling is split over, major first."""
    axis_stride = {a: int(np.prod(mesh.axis_sizes[a + 1:], dtype=np.int64))
                   for a in range(mesh.rank)}
    result = []
    for dim_runs in strides(tiling)[:tiling.data_rank]:
        axes: list[int] = []
        for size, stride in dim_runs:
            run_axes = [a for a in range(mesh.rank)
                        if stride <= axis_stride[a] < stride * size]
            if int(np.prod([mesh.axis_sizes[a] for a in run_axes], dtype=np.int64)) != size:
                raise ValueError(f"a tile dim steps {size} times by {stride}, which is not "
                                 f"made of axes of the mesh {mesh}")
            axes += run_axes
        result.append(tuple(axes))
    return tuple(result)


def follows_mesh(tiling: Tiling, mesh: isa.MeshSpec) -> bool:
    """Whether the tiling's device ids step through axes of `mesh` (row-major ids), as a
    sharding over the mesh itself does; not one over its devices in another order (a jax
    mesh of the same devices reordered: an sdy.mesh with explicit device ids)."""
    try:
        dim_axes(Tiling(tiling.devices, ()), mesh)
    except ValueError:
        return False
    return True


def manual_axes(text: str, mesh: isa.MeshSpec) -> tuple[int, ...]:
    """The mesh axes along which a value of this sharding is manual (inside a shard_map
    body): every axis for `{manual}`, those of the MANUAL subgroup of a partially manual
    tiling, none otherwise."""
    if _from_string(text).is_manual():
        return tuple(range(mesh.rank))
    tiling = parse(text)
    if tiling is None or MANUAL not in tiling.subgroups:
        return ()
    everything = Tiling(tiling.devices, ())
    return dim_axes(everything, mesh)[tiling.data_rank + tiling.subgroups.index(MANUAL)]


def unreduced_axes(text: str, mesh: isa.MeshSpec) -> tuple[int, ...]:
    """The mesh axes along which a value of this sharding is unreduced (each device holds
    a partial sum of it along them): every axis for `{unreduced}`, those of the UNREDUCED
    subgroup of a tiling, none otherwise."""
    if _from_string(text).is_unreduced():
        return tuple(range(mesh.rank))
    tiling = parse(text, unreduced=True)
    if tiling is None or UNREDUCED not in tiling.subgroups:
        return ()
    everything = Tiling(tiling.devices, ())
    return dim_axes(everything, mesh)[tiling.data_rank + tiling.subgroups.index(UNREDUCED)]


def module_tilings(module) -> list[Tiling]:
    """Every tiled `mhlo.sharding` of a module: on its functions' arguments and results and
    on its ops (custom calls), at any depth (unreduced ones too: their devices tile the
    mesh as any others do)."""
    found: list[Tiling] = []

    def visit(operation) -> None:
        attrs = mlir.Attributes(operation)
        if SHARDING_ATTR in attrs:
            found.extend(t for t in [parse(attrs[SHARDING_ATTR], unreduced=True)]
                         if t is not None)
        for key in ("arg_attrs", "res_attrs"):
            for entry in attrs.get(key, ()):
                if isinstance(entry, dict) and SHARDING_ATTR in entry:
                    found.extend(t for t in [parse(entry[SHARDING_ATTR], unreduced=True)]
                                  if t is not None)
        for region in operation.regions:
            for block in region.blocks:
                for op in block.operations:
                    visit(op.operation)

    for op in module.body.operations:
        visit(op.operation)
    return found


def module_mesh(module) -> isa.MeshSpec | None:
    """The mesh a module's tiled shardings are made of; None when it has none."""
    tilings = module_tilings(module)
    if not tilings:
        return None
    return infer_mesh(tilings, tilings[0].devices.size)
