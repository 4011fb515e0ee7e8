"""Where the devices of a logical mesh sit on the chips of a topology."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mesh.machine.topology import Topology, as_int


@dataclass(frozen=True)
class Placement:
    """Where each device of a logical mesh sits on the torus (made by ``place_mesh``).

    Logical device ids are row-major over ``axis_sizes``, as in JAX's ``replica_groups``.
    ``physical_axes[i]`` lists the physical torus axes logical axis ``i`` varies along.
    """

    topology_name: str
    topology_shape: tuple[int, ...]
    axis_sizes: tuple[int, ...]
    axis_names: tuple[str, ...]
    device_to_chip: tuple[int, ...]  # logical device id -> chip id
    physical_axes: tuple[tuple[int, ...], ...]  # per logical axis

    def __post_init__(self) -> None:
        n = math.prod(self.axis_sizes)
        if sorted(self.device_to_chip) != list(range(n)):
            raise ValueError(
                f"Placement.device_to_chip must be a permutation of range({n}), "
                f"got {self.device_to_chip}"
            )
        if not len(self.axis_names) == len(self.physical_axes) == len(self.axis_sizes):
            raise ValueError(
                f"Placement needs one name and one physical-axes entry per logical axis "
                f"{self.axis_sizes}, got {self.axis_names} and {self.physical_axes}"
            )

    def chip_of(self, device_id: int) -> int:
        """Chip id of logical device ``device_id``."""
        if not 0 <= device_id < len(self.device_to_chip):
            raise ValueError(f"device id {device_id} is out of range [0, {len(self.device_to_chip)})")
        return self.device_to_chip[device_id]

    def device_of(self, chip_id: int) -> int:
        """Logical device id placed on chip ``chip_id``."""
        if not 0 <= chip_id < len(self.device_to_chip):
            raise ValueError(f"chip id {chip_id} is out of range [0, {len(self.device_to_chip)})")
        return self.device_to_chip.index(chip_id)

    def is_torus_ring(self, logical_axis: int) -> bool:
        """True when logical axis ``logical_axis`` is exactly one whole physical axis.

        Its consecutive devices, including last -> first, are then torus neighbours.
        """
        axes = self.physical_axes[logical_axis]
        return len(axes) == 1 and self.topology_shape[axes[0]] == self.axis_sizes[logical_axis]


def place_mesh(topology: Topology, axis_sizes: Sequence[int], axis_names: Sequence[str]) -> Placement:
    """Place a logical mesh of ``axis_sizes`` devices on the chips of ``topology``.

    Rule:
      1. Each logical axis (in logical order) whose size equals the size of a still-unused
         physical axis takes that whole physical axis, the lowest-index one if several
         match. On trn2-ultra a (4, 4, 4) mesh is the identity: logical axis i is physical
         axis i, and each is a physical ring with wraparound links.
      2. The other logical axes are laid out row-major, in logical order, over the
         remaining physical axes flattened row-major, in physical order. Such an axis
         (e.g. 8 or 64 chips on trn2-ultra) spans several physical axes: its neighbours
         are not all torus neighbours, and traffic along it is routed hop by hop.
    Size-1 logical axes take no physical axis.
    """
    sizes, names = _check_mesh(topology, axis_sizes, axis_names)
    whole = _match_whole_axes(sizes, topology.shape)
    rest_logical = [i for i in range(len(sizes)) if i not in whole]
    rest_physical = [p for p in range(topology.ndim) if p not in whole.values()]

    logical = np.indices(sizes).reshape(len(sizes), -1)  # [logical axis, device]
    physical = np.zeros((topology.ndim, logical.shape[1]), dtype=np.int64)  # [physical axis, device]
    for i, p in whole.items():
        physical[p] = logical[i]
    flat = np.zeros(logical.shape[1], dtype=np.int64)
    for i in rest_logical:
        flat = flat * sizes[i] + logical[i]
    for p in reversed(rest_physical):
        flat, physical[p] = np.divmod(flat, topology.shape[p])

    chips = np.zeros(logical.shape[1], dtype=np.int64)
    for p, size in enumerate(topology.shape):
        chips = chips * size + physical[p]
    return Placement(
        topology_name=topology.name,
        topology_shape=topology.shape,
        axis_sizes=sizes,
        axis_names=names,
        device_to_chip=tuple(int(c) for c in chips),
        physical_axes=_varying_axes(physical, sizes),
    )


def _check_mesh(
    topo: Topology, axis_sizes: Sequence[int], axis_names: Sequence[str]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    sizes = tuple(as_int(s, "mesh axis_sizes") for s in axis_sizes)
    names = tuple(axis_names)
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"mesh shape must be a non-empty tuple of sizes >= 1, got {sizes}")
    if len(names) != len(sizes) or len(set(names)) != len(names):
        raise ValueError(
            f"mesh axis names {names} must be {len(sizes)} distinct names for shape {sizes}"
        )
    if math.prod(sizes) != topo.num_chips:
        raise ValueError(
            f"mesh shape {sizes} has {math.prod(sizes)} devices but topology '{topo.name}' has "
            f"{topo.num_chips} chips (torus shape {topo.shape})"
        )
    return sizes, names


def _match_whole_axes(sizes: tuple[int, ...], shape: tuple[int, ...]) -> dict[int, int]:
    """Logical axis -> physical axis for logical axes that take a whole physical axis."""
    unused = list(range(len(shape)))
    whole = {}
    for i, size in enumerate(sizes):
        match = next((p for p in unused if shape[p] == size), None) if size > 1 else None
        if match is not None:
            whole[i] = match
            unused.remove(match)
    return whole


def _varying_axes(physical: np.ndarray, sizes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """For each logical axis, the physical axes whose coordinate changes along it."""
    grid = physical.reshape((physical.shape[0], *sizes))  # [physical axis, *logical axes]
    return tuple(
        tuple(p for p in range(grid.shape[0]) if np.any(np.diff(grid[p], axis=i) != 0))
        for i in range(len(sizes))
    )
