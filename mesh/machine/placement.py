"""Where the devices of a logical mesh sit on the chips of a topology."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mesh.machine.topology import Topology, as_int


@dataclass(frozen=True)
class Placement:
    """Where each device of a logical mesh sits on the machine (made by ``place_mesh``).

    Logical device ids are row-major over ``axis_sizes``, as in JAX's ``replica_groups``.
    ``device_ids[d]`` is the machine device of logical device d: a chip id on a whole-chip
    machine, else chip * devices_per_chip + the core index on the chip
    (Topology.device_coords). ``topology_shape`` is the machine's device grid (the torus,
    then the cores of a chip: Topology.device_shape) and ``physical_axes[i]`` lists the
    axes of it logical axis ``i`` varies along.
    """

    topology_name: str
    topology_shape: tuple[int, ...]
    axis_sizes: tuple[int, ...]
    axis_names: tuple[str, ...]
    device_ids: tuple[int, ...]  # logical device id -> machine device id
    physical_axes: tuple[tuple[int, ...], ...]  # per logical axis
    devices_per_chip: int = 1

    def __post_init__(self) -> None:
        n, devices = math.prod(self.axis_sizes), math.prod(self.topology_shape)
        if len(self.device_ids) != n or len(set(self.device_ids)) != n or \
                not all(0 <= c < devices for c in self.device_ids):
            raise ValueError(
                f"Placement.device_ids must give each of the {n} devices its own machine "
                f"device in range({devices}), got {self.device_ids}"
            )
        if not len(self.axis_names) == len(self.physical_axes) == len(self.axis_sizes):
            raise ValueError(
                f"Placement needs one name and one physical-axes entry per logical axis "
                f"{self.axis_sizes}, got {self.axis_names} and {self.physical_axes}"
            )

    @property
    def device_to_chip(self) -> tuple[int, ...]:
        """The chip of each logical device (several devices share a chip on a machine of
        logical NeuronCores)."""
        return tuple(d // self.devices_per_chip for d in self.device_ids)

    @property
    def chips(self) -> tuple[int, ...]:
        """The chips the mesh runs on, sorted."""
        return tuple(sorted(set(self.device_to_chip)))

    def chip_of(self, device_id: int) -> int:
        """Chip id of logical device ``device_id``."""
        return self.machine_device(device_id) // self.devices_per_chip

    def machine_device(self, device_id: int) -> int:
        """Machine device id of logical device ``device_id``."""
        if not 0 <= device_id < len(self.device_ids):
            raise ValueError(f"device id {device_id} is out of range [0, {len(self.device_ids)})")
        return self.device_ids[device_id]

    def device_of(self, machine_device: int) -> int:
        """Logical device id placed on machine device ``machine_device`` (a chip id on a
        whole-chip machine)."""
        if machine_device not in self.device_ids:
            what = "chip" if self.devices_per_chip == 1 else "device"
            raise ValueError(f"{what} {machine_device} runs no device of this mesh (it "
                             f"occupies {what}s {chips_text(self.device_ids)})")
        return self.device_ids.index(machine_device)

    def is_torus_ring(self, logical_axis: int) -> bool:
        """True when logical axis ``logical_axis`` is exactly one whole physical torus axis.

        Its consecutive devices, including last -> first, are then torus neighbours.
        """
        axes = self.physical_axes[logical_axis]
        return len(axes) == 1 and axes[0] != self._core_axis and \
            self.topology_shape[axes[0]] == self.axis_sizes[logical_axis]

    @property
    def _core_axis(self) -> int | None:
        return len(self.topology_shape) - 1 if self.devices_per_chip > 1 else None

    def axis_text(self, logical_axis: int, physical_names: Sequence[str]) -> str:
        """How logical axis `logical_axis` lies on the machine: 'ring x', 'segment 2 of y'
        (a line, no wraparound link), 'spans x*y' (routed hop by hop) or '4 cores of a
        chip'. `physical_names` names the torus axes (Topology.axis_names)."""
        axes = self.physical_axes[logical_axis]
        names = tuple(physical_names) + ("core",)
        if not axes:
            return "-"
        if axes == (self._core_axis,):
            return f"{self.axis_sizes[logical_axis]} cores of a chip"
        if len(axes) > 1:
            return "spans " + "*".join(names[p] for p in axes)
        name, size = names[axes[0]], self.axis_sizes[logical_axis]
        return f"ring {name}" if self.is_torus_ring(logical_axis) else \
            f"segment {size} of {name}"


def chips_text(chips: Sequence[int]) -> str:
    """Chip ids as sorted ranges: '0-3, 16-19'."""
    ranges: list[list[int]] = []
    for c in sorted(chips):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in ranges)


def place_mesh(topology: Topology, axis_sizes: Sequence[int], axis_names: Sequence[str],
               origin: Sequence[int] | None = None) -> Placement:
    """Place a logical mesh of ``axis_sizes`` devices on the chips of ``topology``, as a
    topology-aware ``mesh_utils.create_device_mesh`` would: a compact block of chips at the
    torus origin, each logical axis on a physical ring or a contiguous segment of one where
    it can be, so that neighbours are one link apart.

    Rules, with the physical axes from the slowest links to the fastest (slow_axes_first:
    an UltraCluster's EFA, then z across servers, then y and x inside a server), so that
    a mesh's outer axes (data parallelism) lie on the slow links and its inner ones (tensor
    parallelism) on the fast ones:
      1. The innermost logical axis first, each takes the fastest unused physical axes
         whole while its size is a multiple of theirs: one ring (wraparound links), or
         several it spans (traffic routed hop by hop). On trn2-ultra a (4, 4, 4) mesh
         ('dp', 'fsdp', 'tp') has tp on the x ring, dp on the z ring across servers.
      2. What is left of it takes a segment (coordinates 0..n-1) of the next fastest
         unused axis: a line of chips one link apart, the rest of that axis unused.
      3. A mesh that runs out of physical axes that way is laid out row-major over a block
         filled from the fastest axis (each side the largest divisor of what is left that
         fits it), its innermost axes on the fastest links.
      4. A device count that no block of the torus holds (a prime larger than every torus
         axis, say) takes the first chips in chip-id order, as PJRT's default assignment.
    A mesh whose axes are each named after a physical axis of their size ('x', 'y', 'z')
    lies on those axes instead. Size-1 logical axes take no physical axis. `origin` (torus
    coordinates) moves the block there, wrapping around the torus: the way to keep a mesh
    off failed chips.

    On a machine of logical NeuronCores (Topology.lnc) the mesh's innermost axes take the
    cores of a chip first (TP inside the chip, as AWS advises: on a trn2.48xlarge a (16, 4)
    mesh's axis of 4 is one chip, and TP64 is 16 chips of 4 devices); what is left of the
    mesh (one device per chip) is placed on the chips by the rules above. A mesh whose
    chip part no block of chips holds takes the first devices in id order (rule 4).
    """
    sizes, names = _check_mesh(topology, axis_sizes, axis_names)
    inner = _cores_split(sizes, topology.devices_per_chip)
    outer = tuple(s // g for s, g in zip(sizes, inner))
    if math.prod(outer) > topology.num_chips:  # the cores a chip's share leaves unused
        return place_first(topology, sizes, names, origin)
    physical = _moved(topology, _mesh_coordinates(outer, names, topology.shape, topology),
                      origin)
    chips = np.ravel_multi_index(tuple(physical), topology.shape)
    return _on_chips(topology, sizes, names, inner, chips.tolist())


def place_mesh_within(topology: Topology, axis_sizes: Sequence[int],
                      axis_names: Sequence[str], devices: Sequence[int]) -> Placement | None:
    """Place a logical mesh on the given machine devices by place_mesh's rules, or None
    when they are no block of the torus.

    A block is a box of the torus (each side a whole ring or a run of consecutive
    coordinates of one, wrapping around) holding exactly the devices' chips (every device
    of each, on a machine of logical cores). When the block is the one place_mesh picks
    for the mesh (moved to the block's corner), as it is for every chip of the topology,
    the placement is place_mesh's; on another block the mesh is laid out as place_mesh
    lays it out on a torus of the block's shape, from its corner. Devices that form no
    block (scattered, or an L shape) have no such layout: the caller keeps its own order
    of them.
    """
    sizes, names = _check_mesh(topology, axis_sizes, axis_names)
    devices = _check_devices(topology, sizes, devices)
    per_chip = topology.devices_per_chip
    inner = _cores_split(sizes, per_chip)
    chips = sorted({d // per_chip for d in devices})
    if len(chips) * per_chip != len(devices) or math.prod(inner) != per_chip:
        return None  # not whole chips: no block of the torus
    outer = tuple(s // g for s, g in zip(sizes, inner))
    block = _block_of(topology, chips)
    if block is None:
        return None
    corner, sides = block
    placed = _chips_at(topology, _mesh_coordinates(outer, names, topology.shape, topology),
                       corner)
    if set(placed) != set(chips):  # not place_mesh's block: the layout on this one
        placed = _chips_at(topology, _mesh_coordinates(outer, names, sides, topology), corner)
    return _on_chips(topology, sizes, names, inner, placed)


def _cores_split(sizes: tuple[int, ...], per_chip: int) -> tuple[int, ...]:
    """How much of each logical axis lies on the cores of one chip: the innermost axes
    first, each its largest share that still divides what is left of a chip's
    `per_chip` devices (all ones on a whole-chip machine)."""
    inner, left = [1] * len(sizes), per_chip
    for i in reversed(range(len(sizes))):
        inner[i] = math.gcd(sizes[i], left)
        left //= inner[i]
    return tuple(inner)


def _on_chips(topology: Topology, sizes: tuple[int, ...], names: tuple[str, ...],
              inner: tuple[int, ...], chips: Sequence[int]) -> Placement:
    """The placement of a mesh of `sizes` whose axis i is split into `sizes[i] // inner[i]`
    chips (major) by `inner[i]` cores (minor): the chip part's device o on `chips[o]`
    (row-major over the chip part), the core part on the chip's devices in row-major
    order."""
    outer = tuple(s // g for s, g in zip(sizes, inner))
    logical = np.indices(sizes).reshape(len(sizes), -1)
    inner_arr = np.array(inner)[:, None]
    chip = np.asarray(chips, dtype=np.int64)[np.ravel_multi_index(tuple(logical // inner_arr),
                                                                  outer)]
    core = np.ravel_multi_index(tuple(logical % inner_arr), inner)
    return place_on(topology, sizes, names, (chip * topology.devices_per_chip + core).tolist())


def _chips_at(topology: Topology, physical: np.ndarray, corner: Sequence[int]) -> list[int]:
    """The chip ids of torus coordinates [physical axis, device] moved to `corner`."""
    return np.ravel_multi_index(tuple(_moved(topology, physical, corner)),
                                topology.shape).tolist()


def _mesh_coordinates(sizes: tuple[int, ...], names: tuple[str, ...], shape: tuple[int, ...],
                      topology: Topology) -> np.ndarray:
    """Torus coordinates [physical axis, device] of a mesh of `sizes` on a torus (or a
    block of it) of `shape`, from its origin: on the physical axes the mesh's axes are
    named after, or by place_mesh's rules 1-4 with the physical axes slow-first."""
    named = _by_name(sizes, names, shape, topology.axis_names)
    if named is not None:
        return named
    order = slow_axes_first(topology)
    ordered = _ordered_coordinates(sizes, tuple(shape[p] for p in order))
    if ordered is None:  # rule 4: chip-id order
        return np.array(np.unravel_index(np.arange(math.prod(sizes)), shape))
    physical = np.empty((len(shape), math.prod(sizes)), dtype=np.int64)
    physical[list(order)] = ordered
    return physical


def _by_name(sizes: tuple[int, ...], names: tuple[str, ...], shape: tuple[int, ...],
             physical_names: tuple[str, ...]) -> np.ndarray | None:
    """Each logical axis (of more than one device) on the physical axis of its name, when
    every one is named after a distinct physical axis of its size (a (4, 4, 4) mesh
    ('x', 'y', 'z') on trn2-ultra is the identity); else None."""
    axes = {i: physical_names.index(n) for i, n in enumerate(names)
            if sizes[i] > 1 and n in physical_names}
    if len(set(axes.values())) != sum(s > 1 for s in sizes) or \
            any(shape[p] != sizes[i] for i, p in axes.items()):
        return None
    logical = np.indices(sizes).reshape(len(sizes), -1)
    physical = np.zeros((len(shape), logical.shape[1]), dtype=np.int64)
    for i, p in axes.items():
        physical[p] = logical[i]
    return physical


def _ordered_coordinates(sizes: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray | None:
    """Rules 1-3 on a torus whose physical axes are in slow-first order; None when no block
    holds the mesh."""
    physical = _axis_by_axis(sizes, shape)
    return physical if physical is not None else _packed(sizes, shape)


def _block_of(topology: Topology,
              chips: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(corner, sides) of the box of the torus that holds exactly `chips`: per physical
    axis the run of coordinates they use, which may wrap around; None if they fill none."""
    physical = np.array(np.unravel_index(np.array(chips, dtype=np.int64), topology.shape))
    corner, sides = [], []
    for used, size in zip(physical, topology.shape):
        used = set(used.tolist())
        # the run starts where the coordinate before is unused (a whole ring: at 0)
        starts = [c for c in sorted(used) if (c - 1) % size not in used] or [0]
        if len(starts) != 1:
            return None
        corner.append(starts[0])
        sides.append(len(used))
    if math.prod(sides) != len(chips):  # chips in each run, but not every chip of the box
        return None
    return tuple(corner), tuple(sides)


def slow_axes_first(topology: Topology) -> tuple[int, ...]:
    """The physical axes from the slowest links to the fastest (ties: the higher index
    first): an UltraCluster's EFA axis, then z across servers (64 GB/s), then y and x
    inside a server (128 GB/s). Meshes are laid out in this order, their outer axes on the
    slow links and their inner ones (tensor parallelism) on the fast ones."""
    return tuple(sorted(range(topology.ndim), key=lambda p: (topology.link_bandwidth[p], -p)))


def device_order(topology: Topology) -> tuple[int, ...]:
    """The machine device ids with the fastest links innermost: a chip's devices
    (logical cores) consecutive, then chips one link apart on the fastest axis (x, then y:
    NeuronLink inside a server, 128 GB/s per direction), the slower axes outermost (z
    across servers at 64 GB/s, then an UltraCluster's EFA axis). A mesh reshaped from
    devices in this order puts its last axes on the cores of a chip and the fastest links,
    and its first n chips are a block filled x first, then y, then z, as place_mesh fills
    one on an UltraServer."""
    grid = np.arange(topology.num_chips).reshape(topology.shape)
    chips = grid.transpose(slow_axes_first(topology)).reshape(-1)
    return tuple(int(c) * topology.devices_per_chip + k for c in chips
                 for k in range(topology.devices_per_chip))


def place_first(topology: Topology, axis_sizes: Sequence[int], axis_names: Sequence[str],
                origin: Sequence[int] | None = None) -> Placement:
    """Logical device d on machine device d (chip d, or on a machine of logical cores the
    d-th core in id order): PJRT's default device assignment of an SPMD module's processes
    (replica-major), which does not know the torus. `origin` (torus coordinates) moves
    those chips there, wrapping around the torus, as place_mesh's."""
    sizes, names = _check_mesh(topology, axis_sizes, axis_names)
    per_chip = topology.devices_per_chip
    first = np.arange(math.prod(sizes))
    chips = np.array(np.unravel_index(first // per_chip, topology.shape))
    chips = np.ravel_multi_index(tuple(_moved(topology, chips, origin)), topology.shape)
    return place_on(topology, sizes, names, (chips * per_chip + first % per_chip).tolist())


def place_on(topology: Topology, axis_sizes: Sequence[int], axis_names: Sequence[str],
             devices: Sequence[int]) -> Placement:
    """Logical device d (row-major over `axis_sizes`) on machine device `devices[d]` (a
    chip id on a whole-chip machine): a device assignment the caller chose."""
    sizes, names = _check_mesh(topology, axis_sizes, axis_names)
    devices = np.array(_check_devices(topology, sizes, devices), dtype=np.int64)
    physical = np.array(np.unravel_index(devices, topology.device_shape))
    _check_failed_chips(topology, sizes, names, devices // topology.devices_per_chip,
                        physical[:topology.ndim])
    return Placement(topology_name=topology.name, topology_shape=topology.device_shape,
                     axis_sizes=sizes, axis_names=names,
                     device_ids=tuple(int(d) for d in devices),
                     physical_axes=_varying_axes(physical, sizes),
                     devices_per_chip=topology.devices_per_chip)


def _check_devices(topology: Topology, sizes: tuple[int, ...],
                   devices: Sequence[int]) -> list[int]:
    """The machine device ids of a device assignment for a mesh of `sizes`: one distinct
    device of `topology` per logical device, else an error saying what is wrong."""
    devices = [as_int(c, "device assignment") for c in devices]
    n = topology.num_devices
    if len(devices) != math.prod(sizes) or len(set(devices)) != len(devices) or \
            not all(0 <= c < n for c in devices):
        what = "chip ids" if topology.lnc is None else "device ids"
        raise ValueError(f"a device assignment for mesh {sizes} needs {math.prod(sizes)} "
                         f"distinct {what} of '{topology.name}' (0..{n - 1}), got {devices}")
    return devices


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
    if math.prod(sizes) > topo.num_devices:
        what = "chips" if topo.lnc is None else \
            f"devices ({topo.devices_per_chip} {topo.device_kind}s per chip)"
        raise ValueError(
            f"mesh shape {sizes} has {math.prod(sizes)} devices but topology '{topo.name}' has "
            f"only {topo.num_devices} {what} (torus shape {topo.shape}); meshes of up to "
            f"{topo.num_devices} devices fit, e.g. {fitting_shapes(topo, len(sizes))}"
        )
    return sizes, names


def _moved(topology: Topology, physical: np.ndarray,
           origin: Sequence[int] | None) -> np.ndarray:
    """Torus coordinates [physical axis, device] moved by `origin`, wrapping around."""
    if origin is None:
        return physical
    return (physical + _check_origin(topology, origin)[:, None]) % \
        np.array(topology.shape)[:, None]


def _check_origin(topology: Topology, origin: Sequence[int]) -> np.ndarray:
    origin = tuple(as_int(c, "mesh origin") for c in origin)
    if len(origin) != topology.ndim or \
            not all(0 <= c < n for c, n in zip(origin, topology.shape)):
        raise ValueError(f"mesh origin {origin} must be torus coordinates of '{topology.name}' "
                         f"{topology.shape}")
    return np.array(origin, dtype=np.int64)


def _check_failed_chips(topology: Topology, sizes: tuple[int, ...], names: tuple[str, ...],
                        chips: np.ndarray, physical: np.ndarray) -> None:
    """An error naming every failed chip the mesh would run on, what lived there, and the
    origins of placements that avoid the failed chips."""
    failed = [d for d, c in enumerate(chips) if int(c) in topology.failed_chips]
    if not failed:
        return
    lost = "; ".join(
        f"chip {int(chips[d])} at torus {tuple(int(x) for x in physical[:, d])} held device "
        f"{d} (" + ", ".join(f"{n}={i}" for n, i in zip(names, np.unravel_index(d, sizes)))
        + ")" for d in failed)
    base = (physical - physical[:, :1]) % np.array(topology.shape)[:, None]
    shape = np.array(topology.shape)[:, None]
    avoiding = [o for o in np.ndindex(*topology.shape)
                if not topology.failed_chips & set(np.ravel_multi_index(
                    tuple((base + np.array(o)[:, None]) % shape), topology.shape).tolist())]
    offer = (f"placements that avoid the failed chips start at torus origin "
             f"{', '.join(map(str, avoiding[:4]))}{', ...' if len(avoiding) > 4 else ''}: "
             f"make_mesh(..., origin={avoiding[0]}), or from a shell `jax-trn2 inspect "
             f"... --origin {','.join(map(str, avoiding[0]))}`"
             if avoiding else
             f"no placement of {math.prod(sizes)} devices avoids them: use a mesh of at most "
             f"{topology.num_chips - len(topology.failed_chips)} devices")
    raise ValueError(f"mesh {sizes} {names} would run on failed chips: {lost}; {offer}")


def _axis_by_axis(sizes: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray | None:
    """Rules 1-2 on physical axes in slow-first order: the innermost logical axis first,
    each taking the fastest unused physical axes, whole (a ring, or several rings it spans)
    while its size is a multiple of theirs, and a segment of the next one for what is left;
    None when the physical axes run out before the logical ones."""
    free = list(reversed(range(len(shape))))  # fastest first
    logical = np.indices(sizes).reshape(len(sizes), -1)
    physical = np.zeros((len(shape), logical.shape[1]), dtype=np.int64)
    for i in reversed(range(len(sizes))):
        index, left = logical[i], sizes[i]
        while left > 1:
            if not free:
                return None
            p = free.pop(0)
            extent = shape[p] if left % shape[p] == 0 else left
            if extent > shape[p]:  # neither a multiple of the axis nor within it
                return None
            index, physical[p] = np.divmod(index, extent)
            left //= extent
    return physical


def _packed(sizes: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray | None:
    """Rule 3: the mesh row-major over a block filled from the fastest physical axis (each
    side the largest divisor of what is left that fits), so its innermost axes lie on the
    fastest links; None when no block holds it."""
    left = math.prod(sizes)
    block = [1] * len(shape)
    for p in reversed(range(len(shape))):
        block[p] = max(d for d in range(1, shape[p] + 1) if left % d == 0)
        left //= block[p]
    if left != 1:
        return None
    flat = np.arange(math.prod(sizes))
    physical = np.zeros((len(shape), flat.size), dtype=np.int64)
    for p in reversed(range(len(shape))):
        flat, physical[p] = np.divmod(flat, block[p])
    return physical


def fitting_shapes(topology: Topology, rank: int) -> list[tuple[int, ...]]:
    """A few mesh shapes of `rank` axes that use every chip of `topology`."""
    n = topology.num_devices
    shapes = [topology.device_shape] if len(topology.device_shape) == rank else []
    if rank == 1:
        shapes.append((n,))
    elif rank >= 2:
        last = topology.device_shape[-1]
        shapes.append((n // last,) + (1,) * (rank - 2) + (last,))
        shapes.append((1,) * (rank - 1) + (n,))
    return list(dict.fromkeys(shapes))


def _varying_axes(physical: np.ndarray, sizes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """For each logical axis, the physical axes whose coordinate changes along it."""
    grid = physical.reshape((physical.shape[0], *sizes))  # [physical axis, *logical axes]
    return tuple(
        tuple(p for p in range(grid.shape[0]) if np.any(np.diff(grid[p], axis=i) != 0))
        for i in range(len(sizes))
    )
