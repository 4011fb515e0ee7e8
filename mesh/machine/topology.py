"""The chip-to-chip torus of a Trainium2 machine: chips, links, routes and presets.

Presets and their numbers come from mesh/machine/trn2_facts.md ("Topologies"). Chips are
numbered row-major over the torus coordinates; links are per direction, so a chip with
6 neighbours can send 6 x link_bandwidth and receive as much at the same time.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


from mesh.machine.chip import ChipSpec
from mesh.machine.runtime import RuntimeSpec

# Seconds per hop; trn2_facts: "about 1-2 us per hop inside a server" (AWS Neuron runtime
# docs). The facts give no separate figure for the z ring between servers, so it uses the same.
DEFAULT_HOP_LATENCY_S = 1.5e-6
# Bytes/s per direction per neighbour link (seed 001).
IN_SERVER_LINK_BANDWIDTH = 128e9  # x, y: inside a 16-chip server
ACROSS_SERVER_LINK_BANDWIDTH = 64e9  # z: the ring across the 4 servers of an UltraServer
# EFA between UltraServers: a switched fabric (trn2_facts, "How Trn2 is rented and
# programmed": no hop distance between instances; Neuron runtime "Inter-node collectives"
# page). Each trn2.48xlarge / trn2u.48xlarge has 3,200 Gbit/s of EFAv3 for its 16 chips
# (Neuron "Amazon EC2 Trn2 Architecture" page; 12.8 Tb/s per UltraServer of 4, seed 002):
# 200 Gbit/s = 25 GB/s per chip each way (seed 001 gives the same per chip). A chip's share
# is its NIC port: everything it sends to other servers leaves through it and everything
# it receives from them arrives through it, whichever server is at the other end. A
# minimal packet takes 15 us from the HBM of one server to the HBM of another (ib_write_lat;
# the same page gives ~15 us per inter-node hop): the latency of every transfer over EFA,
# one hop through the switch. The axis of an UltraCluster's Topology whose index is in
# Topology.efa_axes numbers the servers; its link_bandwidth is this per-chip NIC share and
# its link_latency this hop (mesh.perf.collectives.network routes over it as a switch).
EFA_BYTES_PER_INSTANCE = 3200e9 / 8
CHIPS_PER_INSTANCE = 16
EFA_BYTES_PER_CHIP = EFA_BYTES_PER_INSTANCE / CHIPS_PER_INSTANCE
EFA_LATENCY_S = 15e-6
ULTRACLUSTER_PREFIX = "trn2-ultracluster-"


@dataclass(frozen=True)
class Link:
    """One direction of the cable between two neighbouring chips."""

    src: int  # chip id
    dst: int  # chip id
    axis: int  # physical torus axis index
    direction: int  # +1 or -1 along `axis`
    bandwidth: float  # bytes/s in this direction
    latency: float  # seconds per hop

    def __post_init__(self) -> None:
        if self.direction not in (1, -1):
            raise ValueError(f"Link.direction must be +1 or -1, got {self.direction}")
        if not self.bandwidth > 0:
            raise ValueError(f"Link.bandwidth must be positive bytes/s, got {self.bandwidth}")
        if not self.latency >= 0:
            raise ValueError(f"Link.latency must be >= 0 seconds, got {self.latency}")


@dataclass(frozen=True)
class Topology:
    """A torus of Trainium2 chips.

    ``shape[i]`` chips lie on a ring along physical axis ``i``; each chip links to the next
    and previous chip of every ring (wrapping around). Link bandwidth (bytes/s per direction
    per neighbour link) and latency (seconds per hop) are set per axis. Sequences passed for
    tuple fields are converted to tuples. A latency of 0 is allowed (bandwidth-only models).
    """

    name: str
    shape: tuple[int, ...]  # chips per torus axis
    axis_names: tuple[str, ...]  # physical axis names, e.g. ('x', 'y', 'z')
    link_bandwidth: tuple[float, ...]  # bytes/s per direction per neighbour link, per axis
    link_latency: tuple[float, ...]  # seconds per hop, per axis
    chip: ChipSpec = field(default_factory=ChipSpec)
    # The measured costs of the runtime and engines: the expected estimate's constants
    # (the ideal estimate leaves them out).
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
    # Axes that number servers joined by EFA, a switched fabric (the others are NeuronLink
    # torus rings): any chip reaches a chip of any other server in one hop of the axis'
    # latency, through its own NIC and the other chip's, each of the axis' link bandwidth
    # per direction (mesh.perf.collectives.network routes so; neighbours, ring and route keep
    # the axis' coordinates as a ring).
    efa_axes: frozenset[int] = frozenset()
    # What a device is (mesh.machine: one place says it). None: the whole chip, one device
    # per chip (the chip-per-device presets). An int: Neuron's logical-core setting LNC,
    # each chip exposing neuron_cores // lnc devices (4 at LNC=2, Trn2's default; 8 at
    # LNC=1), numbered consecutively on a chip: device d is core d % devices_per_chip of
    # chip d // devices_per_chip. A device is what JAX sees and a collective's rank is.
    lnc: int | None = None
    # Faults. A failed link carries nothing: routes go around it the way the torus allows.
    # A degraded link runs at `factor` (0 < factor < 1) of its axis' bandwidth. A failed
    # chip runs no device of a mesh and forwards no traffic. Links are (src, dst) chip
    # pairs of neighbours, one direction each (a cable is both: see with_failed_cable).
    failed_links: frozenset[tuple[int, int]] = frozenset()
    degraded_links: tuple[tuple[int, int, float], ...] = ()
    failed_chips: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        shape = _per_axis(self.shape, "shape", operator.index)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "axis_names", _per_axis(self.axis_names, "axis_names", str))
        object.__setattr__(self, "link_bandwidth",
                           _per_axis(self.link_bandwidth, "link_bandwidth", as_float))
        object.__setattr__(self, "link_latency",
                           _per_axis(self.link_latency, "link_latency", as_float))
        if not shape or any(s < 1 for s in shape):
            raise ValueError(f"Topology.shape must be a non-empty tuple of sizes >= 1, got {shape}")
        for name in ("axis_names", "link_bandwidth", "link_latency"):
            values = getattr(self, name)
            if len(values) != len(shape):
                raise ValueError(
                    f"Topology.{name} has {len(values)} entries {values} but shape {shape} has "
                    f"{len(shape)} axes"
                )
        if len(set(self.axis_names)) != len(self.axis_names):
            raise ValueError(f"Topology.axis_names must be distinct, got {self.axis_names}")
        if not all(b > 0 for b in self.link_bandwidth):
            raise ValueError(
                f"Topology.link_bandwidth must be positive bytes/s, got {self.link_bandwidth}"
            )
        if not all(t >= 0 for t in self.link_latency):
            raise ValueError(f"Topology.link_latency must be >= 0 seconds, got {self.link_latency}")
        if not isinstance(self.chip, ChipSpec):
            raise ValueError(f"Topology.chip must be a ChipSpec, got {type(self.chip).__name__}")
        if not isinstance(self.runtime, RuntimeSpec):
            raise ValueError(f"Topology.runtime must be a RuntimeSpec, got "
                             f"{type(self.runtime).__name__}")
        if self.lnc is not None:
            self.chip.logical_core(self.lnc)  # raises unless lnc divides the chip's cores
        self._check_faults()

    def _check_faults(self) -> None:
        object.__setattr__(self, "failed_links", frozenset(
            (as_int(a, "failed_links"), as_int(b, "failed_links")) for a, b in self.failed_links))
        object.__setattr__(self, "degraded_links", tuple(
            (as_int(a, "degraded_links"), as_int(b, "degraded_links"), float(f))
            for a, b, f in self.degraded_links))
        object.__setattr__(self, "failed_chips", frozenset(
            as_int(c, "failed_chips") for c in self.failed_chips))
        for a, b, factor in self.degraded_links:
            if not 0 < factor < 1:
                raise ValueError(f"degraded link {a}->{b} needs a bandwidth factor in (0, 1), "
                                 f"got {factor} (fail the link instead of a factor of 0)")
        for a, b in [*self.failed_links, *((a, b) for a, b, _ in self.degraded_links)]:
            self.link(a, b)  # raises unless a and b are neighbours
        for chip in self.failed_chips:
            self._check_chip(chip)

    @property
    def has_faults(self) -> bool:
        return bool(self.failed_links or self.degraded_links or self.failed_chips)

    def healthy(self) -> Topology:
        """The same machine without its faults."""
        return dataclasses.replace(self, failed_links=frozenset(), degraded_links=(),
                                   failed_chips=frozenset())

    def with_failed_cable(self, a: int, b: int) -> Topology:
        """A copy in which the cable between neighbours `a` and `b` failed (both ways)."""
        return dataclasses.replace(self, failed_links=self.failed_links | {(a, b), (b, a)})

    def link_usable(self, src: int, dst: int) -> bool:
        """Whether the link src -> dst carries traffic (neither it nor its ends failed)."""
        return (src, dst) not in self.failed_links and \
            src not in self.failed_chips and dst not in self.failed_chips

    def faults_text(self) -> str:
        """The faults, for listings: '' when there are none."""
        parts = []
        if self.failed_links:
            parts.append("failed links " + ", ".join(f"{a}->{b}"
                                                     for a, b in sorted(self.failed_links)))
        if self.degraded_links:
            parts.append("degraded links " + ", ".join(f"{a}->{b} x{f:g}"
                                                       for a, b, f in self.degraded_links))
        if self.failed_chips:
            parts.append("failed chips " + ", ".join(f"{c} {self.coords(c)}"
                                                     for c in sorted(self.failed_chips)))
        return "; ".join(parts)

    @property
    def num_chips(self) -> int:
        return math.prod(self.shape)

    @property
    def devices_per_chip(self) -> int:
        """Devices (logical NeuronCores) per chip: 1 for the whole-chip view."""
        return 1 if self.lnc is None else self.chip.neuron_cores // self.lnc

    @property
    def num_devices(self) -> int:
        """Devices of the machine: what jax.devices() lists, a collective's possible ranks."""
        return self.num_chips * self.devices_per_chip

    @functools.cached_property
    def device(self) -> ChipSpec:
        """One device's share of a chip: the whole chip, or one logical NeuronCore (its
        cores' engines, SBUF and PSUM, its share of HBM and of the peak FLOP/s). (Made
        once: every instruction's cost reads it.)"""
        return self.chip if self.lnc is None else self.chip.logical_core(self.lnc)

    @property
    def device_kind(self) -> str:
        """'chip' or 'LNC=2 logical core', for messages."""
        return "chip" if self.lnc is None else f"LNC={self.lnc} logical core"

    def chip_of_device(self, device_id: int) -> int:
        """The chip of machine device `device_id`."""
        self._check_device(device_id)
        return device_id // self.devices_per_chip

    def core_of_device(self, device_id: int) -> int:
        """The index of machine device `device_id` among its chip's devices."""
        self._check_device(device_id)
        return device_id % self.devices_per_chip

    def devices_of_chip(self, chip_id: int) -> tuple[int, ...]:
        """The machine device ids on chip `chip_id` (consecutive)."""
        self._check_chip(chip_id)
        n = self.devices_per_chip
        return tuple(range(chip_id * n, (chip_id + 1) * n))

    def device_coords(self, device_id: int) -> tuple[int, ...]:
        """Coordinates of machine device `device_id`: its chip's torus coordinates, then
        (per logical-core machines) its core index on the chip."""
        chip = self.chip_of_device(device_id)
        core = () if self.lnc is None else (self.core_of_device(device_id),)
        return self.coords(chip) + core

    def device_id(self, coords: Sequence[int]) -> int:
        """The machine device at `device_coords` (inverse of device_coords)."""
        coords = tuple(coords)
        if self.lnc is None:
            return self.chip_id(coords)
        chip, core = self.chip_id(coords[:-1]), coords[-1] if coords else -1
        if not 0 <= core < self.devices_per_chip:
            raise ValueError(f"core {core} of coords {coords} is out of range "
                             f"[0, {self.devices_per_chip}) on '{self.name}'")
        return chip * self.devices_per_chip + core

    @property
    def device_shape(self) -> tuple[int, ...]:
        """The grid device_coords range over: the torus, then the cores of a chip."""
        return self.shape + (() if self.lnc is None else (self.devices_per_chip,))

    @property
    def device_axis_names(self) -> tuple[str, ...]:
        """Names of device_shape's axes: the torus axes, then 'core'."""
        return self.axis_names + (() if self.lnc is None else ("core",))

    @property
    def ndim(self) -> int:
        """Number of physical torus axes."""
        return len(self.shape)

    @property
    def diameter(self) -> int:
        """Most hops between any two chips."""
        return sum(size // 2 for size in self.shape)

    def coords(self, chip_id: int) -> tuple[int, ...]:
        """Torus coordinates of ``chip_id`` (row-major numbering)."""
        self._check_chip(chip_id)
        out = []
        for size in reversed(self.shape):
            chip_id, c = divmod(chip_id, size)
            out.append(c)
        return tuple(reversed(out))

    def chip_id(self, coords: Sequence[int]) -> int:
        """Chip id at torus ``coords`` (row-major numbering)."""
        if len(coords) != self.ndim:
            raise ValueError(
                f"coords {tuple(coords)} have {len(coords)} entries, "
                f"torus {self.shape} has {self.ndim} axes"
            )
        chip = 0
        for axis, (c, size) in enumerate(zip(coords, self.shape)):
            if not 0 <= c < size:
                raise ValueError(
                    f"coordinate {c} on axis {axis} ({self.axis_names[axis]!r}) "
                    f"is out of range [0, {size})"
                )
            chip = chip * size + c
        return chip

    def neighbours(self, chip_id: int) -> tuple[tuple[int, int, int], ...]:
        """``(neighbour chip, axis, direction)`` for every link leaving ``chip_id``.

        On an axis of size 2 the +1 and -1 neighbour are the same chip; it is listed once,
        with direction +1. Axes of size 1 contribute no neighbour.
        """
        self._check_chip(chip_id)
        return tuple(
            (self._step(chip_id, axis, direction), axis, direction)
            for axis, size in enumerate(self.shape)
            for direction in _ring_directions(size)
        )

    def ring(self, axis: int, chip_id: int) -> tuple[int, ...]:
        """Chips along torus ``axis`` through ``chip_id``, in + order from coordinate 0."""
        self._check_axis(axis)
        c = list(self.coords(chip_id))
        return tuple(self.chip_id(c[:axis] + [i] + c[axis + 1 :]) for i in range(self.shape[axis]))

    def link(self, src: int, dst: int) -> Link:
        """The link from ``src`` to its immediate neighbour ``dst``."""
        for chip, axis, direction in self.neighbours(src):
            if chip == dst:
                return self._link(src, axis, direction)
        raise ValueError(
            f"chips {src} {self.coords(src)} and {dst} {self.coords(dst)} are not neighbours "
            f"on torus '{self.name}' {self.shape}"
        )

    def route(self, src: int, dst: int, tie_direction: int = 1) -> tuple[Link, ...]:
        """Links of the dimension-order route from ``src`` to ``dst``.

        Axis 0 first, then 1, ...; on each ring the shorter way round, ties (half-way round
        a ring of 3 or more) going ``tie_direction`` (+1 or -1).
        """
        if tie_direction not in (1, -1):
            raise ValueError(f"tie_direction must be +1 or -1, got {tie_direction}")
        links = self._dimension_order_route(src, dst, tie_direction)
        if all(self.link_usable(l.src, l.dst) for l in links):
            return links
        return self._detour(src, dst)

    def _dimension_order_route(self, src: int, dst: int, tie_direction: int) -> tuple[Link, ...]:
        target = self.coords(dst)
        here = src
        links = []
        for axis, size in enumerate(self.shape):
            steps, direction = _ring_offset(self.coords(here)[axis], target[axis], size)
            if size > 2 and 2 * steps == size:
                direction = tie_direction
            for _ in range(steps):
                links.append(self._link(here, axis, direction))
                here = links[-1].dst
        return tuple(links)

    def _detour(self, src: int, dst: int) -> tuple[Link, ...]:
        """The shortest route over usable links (breadth first, neighbours in axis order):
        how traffic goes around failed links and chips."""
        previous = {src: None}
        frontier = [src]
        while frontier and dst not in previous:
            reached = []
            for chip in frontier:
                for peer, axis, direction in self.neighbours(chip):
                    if peer not in previous and self.link_usable(chip, peer):
                        previous[peer] = (chip, axis, direction)
                        reached.append(peer)
            frontier = reached
        if dst not in previous:
            raise ValueError(f"no route from chip {src} {self.coords(src)} to chip {dst} "
                             f"{self.coords(dst)} on '{self.name}' avoids its faults "
                             f"({self.faults_text()})")
        links = []
        here = dst
        while previous[here] is not None:
            chip, axis, direction = previous[here]
            links.append(self._link(chip, axis, direction))
            here = chip
        return tuple(reversed(links))

    def hops(self, src: int, dst: int) -> int:
        """Length of the shortest route (torus Manhattan distance with wraparound)."""
        a, b = self.coords(src), self.coords(dst)
        return sum(_ring_offset(x, y, size)[0] for x, y, size in zip(a, b, self.shape))

    def with_overrides(self, **fields: object) -> Topology:
        """A copy with ``fields`` replaced, e.g. ``link_bandwidth=(100e9,) * 3``."""
        return _replace(self, fields)

    def _step(self, chip_id: int, axis: int, direction: int) -> int:
        c = list(self.coords(chip_id))
        c[axis] = (c[axis] + direction) % self.shape[axis]
        return self.chip_id(c)

    def _link(self, src: int, axis: int, direction: int) -> Link:
        dst = self._step(src, axis, direction)
        return Link(
            src=src,
            dst=dst,
            axis=axis,
            direction=direction,
            bandwidth=self.link_bandwidth[axis] * self.bandwidth_factor(src, dst),
            latency=self.link_latency[axis],
        )

    def bandwidth_factor(self, src: int, dst: int) -> float:
        """The share of its axis' bandwidth the link src -> dst runs at (degraded links)."""
        return next((f for a, b, f in self.degraded_links if (a, b) == (src, dst)), 1.0)

    def _check_chip(self, chip_id: int) -> None:
        if not 0 <= chip_id < self.num_chips:
            raise ValueError(
                f"chip id {chip_id} is out of range [0, {self.num_chips}) for topology '{self.name}'"
            )

    def _check_device(self, device_id: int) -> None:
        if not 0 <= device_id < self.num_devices:
            raise ValueError(f"device id {device_id} is out of range [0, {self.num_devices}) "
                             f"for topology '{self.name}'")

    def _check_axis(self, axis: int) -> None:
        if not 0 <= axis < self.ndim:
            raise ValueError(f"axis {axis} is out of range [0, {self.ndim}) for torus {self.shape}")


def _per_axis(values: object, field: str, convert: Callable[[object], object]) -> tuple:
    """A per-torus-axis field as a tuple of converted entries; ValueError naming the field
    for a lone value (with_overrides(link_bandwidth=100e9)) or an entry of the wrong kind."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"Topology.{field} needs one entry per torus axis (a tuple), got "
                         f"{values!r}")
    try:
        return tuple(convert(v) for v in values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"Topology.{field} = {values!r}: {e}") from None


def as_float(value: object) -> float:
    if isinstance(value, (str, bytes)):  # float("1e9") would parse: a string is a mistake
        raise TypeError(f"entries must be numbers, got {value!r}")
    return float(value)


def as_int(value: object, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{what} entries must be integers, got {value!r}") from None


def _ring_directions(size: int) -> tuple[int, ...]:
    """Directions with a distinct neighbour on a ring of ``size`` chips."""
    return {1: (), 2: (1,)}.get(size, (1, -1))


def _ring_offset(a: int, b: int, size: int) -> tuple[int, int]:
    """(hops, direction) from coordinate ``a`` to ``b`` on a ring: shorter way, ties +1."""
    forward = (b - a) % size
    backward = (a - b) % size
    return (forward, 1) if forward <= backward else (backward, -1)


def _replace(topo: Topology, fields: dict[str, object]) -> Topology:
    known = [f.name for f in dataclasses.fields(Topology)]
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise TypeError(f"unknown Topology field(s) {unknown}; fields are {known}")
    return dataclasses.replace(topo, **fields)


_PRESETS: dict[str, Topology] = {
    "trn2": Topology(
        name="trn2",
        shape=(4, 4),
        axis_names=("x", "y"),
        link_bandwidth=(IN_SERVER_LINK_BANDWIDTH,) * 2,
        link_latency=(DEFAULT_HOP_LATENCY_S,) * 2,
    ),
    "trn2-ultra": Topology(
        name="trn2-ultra",
        shape=(4, 4, 4),
        axis_names=("x", "y", "z"),
        link_bandwidth=(IN_SERVER_LINK_BANDWIDTH,) * 2 + (ACROSS_SERVER_LINK_BANDWIDTH,),
        link_latency=(DEFAULT_HOP_LATENCY_S,) * 3,
    ),
    "trn2-ultra-max": Topology(  # concept SKU "trn2-ultra-max-plus" (seed 001)
        name="trn2-ultra-max",
        shape=(4, 4, 16),
        axis_names=("x", "y", "z"),
        link_bandwidth=(IN_SERVER_LINK_BANDWIDTH,) * 2 + (ACROSS_SERVER_LINK_BANDWIDTH,),
        link_latency=(DEFAULT_HOP_LATENCY_S,) * 3,
    ),
}
TOPOLOGY_NAMES: tuple[str, ...] = tuple(_PRESETS)

# The machines as AWS rents them (trn2_facts.md, "How Trn2 is rented and programmed"): the
# same chips and links, each device a logical NeuronCore at Trn2's default LNC=2 (4 per
# chip; get_topology(name, lnc=1) for 8). A trn2.48xlarge (and the trn2u.48xlarge of an
# UltraServer) is 16 chips on a 4x4 torus: 64 devices of 24 GiB; a Trn2 UltraServer is four
# of them joined by the z ring: 256 devices. ULTRASERVER_CLUSTER_PREFIX + N is N of those.
DEFAULT_LNC = 2
ULTRASERVER_CLUSTER_PREFIX = "trn2-ultraserver-cluster-"
_INSTANCES: dict[str, Topology] = {
    "trn2.3xlarge": dataclasses.replace(_PRESETS["trn2"], name="trn2.3xlarge", shape=(1,),
                                        axis_names=("x",),
                                        link_bandwidth=(IN_SERVER_LINK_BANDWIDTH,),
                                        link_latency=(DEFAULT_HOP_LATENCY_S,),
                                        lnc=DEFAULT_LNC),
    "trn2.48xlarge": dataclasses.replace(_PRESETS["trn2"], name="trn2.48xlarge",
                                         lnc=DEFAULT_LNC),
    "trn2u.48xlarge": dataclasses.replace(_PRESETS["trn2"], name="trn2u.48xlarge",
                                          lnc=DEFAULT_LNC),
    "trn2-ultraserver": dataclasses.replace(_PRESETS["trn2-ultra"], name="trn2-ultraserver",
                                            lnc=DEFAULT_LNC),
}
INSTANCE_NAMES: tuple[str, ...] = tuple(_INSTANCES)


def get_topology(name: str = "trn2-ultra", **overrides: object) -> Topology:
    """The preset ``name`` (see ``TOPOLOGY_NAMES``), or ``trn2-ultracluster-N`` (N
    UltraServers joined by EFA), one device per chip; or a machine as AWS rents it (see
    ``INSTANCE_NAMES``: trn2.3xlarge, trn2.48xlarge, trn2u.48xlarge, trn2-ultraserver, and
    ``trn2-ultraserver-cluster-N``), one device per logical NeuronCore at LNC=2 (``lnc=1``
    for 8 per chip); with any Topology field overridden.

    >>> get_topology("trn2.48xlarge").num_devices
    64

    >>> get_topology("trn2-ultra", link_bandwidth=(100e9, 100e9, 50e9)).num_chips
    64
    >>> get_topology("trn2-ultracluster-16").num_chips
    1024
    """
    if name.startswith(ULTRASERVER_CLUSTER_PREFIX):
        servers = _server_count(name, ULTRASERVER_CLUSTER_PREFIX)
        return _replace(dataclasses.replace(ultracluster(servers), name=name, lnc=DEFAULT_LNC),
                        overrides)
    if name.startswith(ULTRACLUSTER_PREFIX):
        return _replace(ultracluster(_server_count(name, ULTRACLUSTER_PREFIX)), overrides)
    if name in _INSTANCES:
        return _replace(_INSTANCES[name], overrides)
    if name not in _PRESETS:
        raise ValueError(f"unknown topology {name!r}; known presets: {list(TOPOLOGY_NAMES)} "
                         f"and {ULTRACLUSTER_PREFIX}N (N UltraServers), one device per chip; "
                         f"{list(INSTANCE_NAMES)} and {ULTRASERVER_CLUSTER_PREFIX}N, one "
                         f"device per logical NeuronCore")
    if overrides.get("lnc") is not None:
        raise ValueError(f"LNC={overrides['lnc']} applies to the machines as rented, whose "
                         f"devices are logical NeuronCores ({', '.join(INSTANCE_NAMES)}, "
                         f"{ULTRASERVER_CLUSTER_PREFIX}N); {name!r} is the whole-chip view, "
                         f"one device per chip")
    return _replace(_PRESETS[name], overrides)


def ultracluster(servers: int) -> Topology:
    """`servers` Trn2 UltraServers (the 4x4x4 torus of trn2-ultra each) joined by EFA,
    numbered along a leading axis 's': a switched fabric, each chip's NIC reaching any chip
    of another UltraServer in one hop (Topology.efa_axes). Chips are numbered row-major over
    (s, x, y, z), so UltraServer s holds chips 64 s .. 64 s + 63."""
    ultra = _PRESETS["trn2-ultra"]
    return Topology(
        name=f"{ULTRACLUSTER_PREFIX}{servers}",
        shape=(servers, *ultra.shape),
        axis_names=("s", *ultra.axis_names),
        link_bandwidth=(EFA_BYTES_PER_CHIP, *ultra.link_bandwidth),
        link_latency=(EFA_LATENCY_S, *ultra.link_latency),
        efa_axes=frozenset({0}),
    )


def _server_count(name: str, prefix: str) -> int:
    count = name[len(prefix):]
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"{name!r}: the UltraServer count after {prefix!r} must "
                         f"be a positive integer, e.g. {prefix}16")
    return int(count)
