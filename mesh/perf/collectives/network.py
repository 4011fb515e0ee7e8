"""The network a collective's steps run on: transfers routed hop by hop over the torus (and
as one hop over EFA between servers), the bytes each link carries, and a step sequence's
alpha-beta cost (the package doc, mesh.perf.collectives, holds the model)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from mesh.machine import Topology


@dataclass(frozen=True)
class Pattern:
    """Transfers that run at the same time: chip src[i] sends nbytes[i] to chip dst[i]."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray

    @staticmethod
    def concat(patterns: list[Pattern]) -> Pattern:
        return Pattern(*(np.concatenate([getattr(p, f) for p in patterns])
                         for f in ("src", "dst", "nbytes")))


Steps = list[tuple[Pattern, int]]  # (pattern, how many times it runs back to back)


def grid_lines(grid: np.ndarray, dim: int) -> np.ndarray:
    """The lines of `grid` along `dim`, as rows of a 2-D array."""
    return np.moveaxis(grid, dim, -1).reshape(-1, grid.shape[dim])


@dataclass(frozen=True)
class StepCost:
    latency: float
    bandwidth: float
    link_bytes: float
    max_hops: int
    steps: int
    detours: int = 0  # transfers routed around faults
    efa_bandwidth: float = 0.0  # `bandwidth` with EFA links at their sustained share
    sent_bytes: float = 0.0  # the most any chip sends over all steps
    received_bytes: float = 0.0  # the most any chip receives

    @property
    def seconds(self) -> float:
        return self.latency + self.bandwidth


class Network:
    """Routes between chips, the cost of steps of transfers, and group shapes on the torus.

    A chip has two "links" per torus axis, one per direction. On an axis of EFA between
    servers (Topology.efa_axes), a switched fabric, they are the chip's NIC port instead:
    direction +1 what it sends to other servers, -1 what it receives from them, each at
    the axis' link bandwidth (the chip's share of its instance's EFA)."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.coords = np.array([topology.coords(c) for c in range(topology.num_chips)])
        self.n_links = topology.num_chips * topology.ndim * 2
        self.link_bandwidth = np.tile(np.repeat(topology.link_bandwidth, 2), topology.num_chips)
        self.failed = np.zeros(self.n_links, dtype=bool)  # links no route may take
        for chip in range(topology.num_chips):
            for peer, axis, direction in topology.neighbours(chip):
                for a, b, d in ((chip, peer, direction), (peer, chip, -direction)):
                    link = self.link_id(a, axis, d)
                    self.link_bandwidth[link] = topology.link_bandwidth[axis] * \
                        topology.bandwidth_factor(a, b)
                    self.failed[link] = not topology.link_usable(a, b)
        for axis in topology.efa_axes:  # a NIC port fails with its chip only
            for chip in range(topology.num_chips):
                for direction in (1, -1):
                    self.failed[self.link_id(chip, axis, direction)] = \
                        chip in topology.failed_chips
        # Bytes/s of each link as the runtime sustains it: EFA at its measured share.
        efa = np.tile(np.repeat([a in topology.efa_axes for a in range(topology.ndim)], 2),
                      topology.num_chips)
        self.sustained_bandwidth = np.where(
            efa, self.link_bandwidth * topology.runtime.efa_efficiency, self.link_bandwidth)
        self._healthy = topology.healthy()  # the machine templates route on (_template)
        self._templates: dict[int, tuple] = {}
        self._detours: dict[tuple[int, int], tuple] = {}
        self._incidences: dict[tuple[str, bytes, bytes], tuple] = {}  # _incidence

    def link_id(self, src: int, axis: int, direction: int) -> int:
        """Index of the link leaving chip `src` along `axis` in `direction` (+1/-1)."""
        return (src * self.topology.ndim + axis) * 2 + (direction > 0)

    def broken(self, a: int, b: int) -> bool:
        """Whether neighbours a and b cannot use the link between them (either way)."""
        return self.topology.hops(a, b) == 1 and \
            not (self.topology.link_usable(a, b) and self.topology.link_usable(b, a))

    @staticmethod
    @functools.lru_cache(maxsize=8)
    def of(topology: Topology) -> Network:
        return Network(topology)

    def grids(self, groups: list[list[int]], every: bool = False
              ) -> tuple[list[np.ndarray], bool]:
        """Each group's chips as an array over the torus axes it spans, and whether the
        groups are whole torus rings (then they use disjoint links and one stands for all,
        unless `every`: the load on every link is wanted).

        Which member holds which block does not change the traffic of an all-gather,
        reduce-scatter, all-reduce or all-to-all (the collective engines write blocks at
        any offset), so a group whose chips are a product of coordinate sets, one per torus
        axis, runs its rings along the torus axes, in torus order. Other groups keep their
        rank order as one ring.
        """
        grids = [self._torus_grid(np.asarray(g, dtype=np.int64)) for g in groups]
        if any(g is None for g in grids) or len({g.shape for g in grids}) > 1:
            return [np.asarray(g, dtype=np.int64) for g in groups], False
        spanned = self.spanned_axes(grids[0].ravel())
        whole = not self.topology.has_faults and \
            all(len(np.unique(self.coords[g.ravel(), a])) == self.topology.shape[a]
                for g in grids for a in spanned)
        return (grids[:1] if whole and not every else grids), whole

    def _torus_grid(self, chips: np.ndarray) -> np.ndarray | None:
        coords = self.coords[chips]
        axes = self.spanned_axes(chips)
        values = [np.unique(coords[:, a]) for a in axes]
        if int(np.prod([len(v) for v in values])) != len(chips):
            return None
        grid = np.empty([len(v) for v in values], dtype=np.int64)
        index = tuple(np.searchsorted(v, coords[:, a]) for v, a in zip(values, axes))
        grid[index] = chips
        return grid

    def _template(self, offset: int) -> tuple:
        """The route from chip 0 to chip `offset`: (link source coords [h, ndim], axis [h],
        direction [h], share of the bytes [h], latency, hops). Dimension-order routes on a
        torus are the same from every chip up to translation, so one route per coordinate
        offset serves every pair. Where the destination is half-way round a ring both ways
        are equally short and half the bytes go each way (ties going one way only would load
        one direction of every ring twice as much as the other). A transfer to another
        server goes over EFA, a switch: one hop from the source's NIC port to the
        destination's, whatever the servers' or the chips' coordinates."""
        if offset not in self._templates and self._efa_axis(offset) is not None:
            axis = self._efa_axis(offset)
            self._templates[offset] = (
                self.coords[[0, offset]], np.array([axis, axis], dtype=np.int64),
                np.array([1, 0], dtype=np.int64), np.ones(2),
                self.topology.link_latency[axis], 1)
        if offset not in self._templates:
            # the healthy route: transfers whose translated route meets a fault are
            # detoured one by one in loads()
            ways = {self._healthy.route(0, offset, tie) for tie in (1, -1)}
            links = [l for way in ways for l in way]
            way = next(iter(ways))
            self._templates[offset] = (
                self.coords[[l.src for l in links]].reshape(len(links), -1),
                np.array([l.axis for l in links], dtype=np.int64),
                np.array([l.direction > 0 for l in links], dtype=np.int64),
                np.full(len(links), 1.0 / len(ways)),
                sum(l.latency for l in way), len(way))
        return self._templates[offset]

    def _efa_axis(self, offset: int) -> int | None:
        """The first EFA axis along which chip `offset` differs from chip 0, if any."""
        return next((a for a in sorted(self.topology.efa_axes) if self.coords[offset, a]),
                    None)

    def loads(self, pattern: Pattern) -> tuple[np.ndarray, float, int, int]:
        """(bytes on every link, longest route latency, most hops, transfers detoured
        around faults) of one step."""
        ids, transfer, share, latency, hops, detoured = self._incidence(pattern.src,
                                                                        pattern.dst)
        loads = np.bincount(ids, pattern.nbytes[transfer] * share, minlength=self.n_links)
        return loads, latency, hops, detoured

    def _incidence(self, src: np.ndarray, dst: np.ndarray) -> tuple:
        """Where transfers src[i] -> dst[i] go, whatever their sizes: (link ids, the
        transfer each entry belongs to, its share of that transfer's bytes, longest route
        latency, most hops, transfers detoured around faults). Ring algorithms repeat a few
        patterns with other sizes (an FSDP step's 62 steps have 10), so each is routed
        once."""
        key = (src.dtype.str, src.tobytes(), dst.tobytes())
        if key in self._incidences:
            return self._incidences[key]
        shape = np.array(self.topology.shape)
        at_src = self.coords[src]
        offsets = np.ravel_multi_index(((self.coords[dst] - at_src) % shape).T,
                                       self.topology.shape)
        links, transfers, shares = [], [], []
        latency, hops, detoured = 0.0, 0, 0
        for offset in np.unique(offsets):
            at, axis, up, share, lat, h = self._template(int(offset))
            mine = np.nonzero(offsets == offset)[0]
            # link source chips: each transfer's source translated by the template's hops
            chips = np.ravel_multi_index(((at_src[mine][:, None, :] + at[None]) % shape)
                                         .reshape(-1, len(shape)).T, self.topology.shape)
            ids = (chips.reshape(-1, len(axis)) * self.topology.ndim + axis) * 2 + up
            blocked = self.failed[ids].any(axis=1)
            routed = mine[~blocked]
            links.append(ids[~blocked].ravel())
            transfers.append(np.repeat(routed, len(axis)))
            shares.append(np.tile(share, len(routed)))
            if len(routed):
                latency, hops = max(latency, lat), max(hops, h)
            for t in mine[blocked]:
                route_ids, route_latency = self._detour(int(src[t]), int(dst[t]))
                links.append(route_ids)
                transfers.append(np.full(len(route_ids), t))
                shares.append(np.ones(len(route_ids)))
                latency, hops = max(latency, route_latency), max(hops, len(route_ids))
                detoured += 1
        arrays = [np.concatenate(parts) for parts in (links, transfers, shares)]
        for array in arrays:
            array.flags.writeable = False  # shared by every step of this pattern
        self._incidences[key] = (*arrays, latency, hops, detoured)
        return self._incidences[key]

    def _detour(self, src: int, dst: int) -> tuple[np.ndarray, float]:
        """(link ids, latency) of the route around the faults (Topology.route)."""
        if (src, dst) not in self._detours:
            route = self.topology.route(src, dst)
            self._detours[src, dst] = (
                np.array([self.link_id(l.src, l.axis, l.direction) for l in route],
                         dtype=np.int64), sum(l.latency for l in route))
        return self._detours[src, dst]

    def evaluate(self, steps: Steps) -> StepCost:
        """Alpha-beta time of `steps`: per step, the longest route's latency plus the
        busiest link's bytes over its bandwidth; and what each chip sends and receives."""
        latency = bandwidth = efa_bandwidth = 0.0
        totals = np.zeros(self.n_links)
        sent = np.zeros(self.topology.num_chips)
        received = np.zeros(self.topology.num_chips)
        max_hops = count = detours = 0
        for pattern, times in steps:
            loads, step_latency, step_hops, step_detours = self.loads(pattern)
            latency += times * step_latency
            bandwidth += times * float(np.max(loads / self.link_bandwidth))
            efa_bandwidth += times * float(np.max(loads / self.sustained_bandwidth))
            totals += times * loads
            sent += times * np.bincount(pattern.src, pattern.nbytes, len(sent))
            received += times * np.bincount(pattern.dst, pattern.nbytes, len(received))
            max_hops, count = max(max_hops, step_hops), count + times
            detours += times * step_detours
        return StepCost(latency, bandwidth, float(totals.max()), max_hops, count, detours,
                        efa_bandwidth, float(sent.max()), float(received.max()))

    def spanned_axes(self, chips: np.ndarray) -> list[int]:
        """Physical axes along which `chips` differ."""
        return [a for a in range(self.topology.ndim) if len(np.unique(self.coords[chips, a])) > 1]

    def torus_axes(self, chips: np.ndarray) -> tuple[str, ...]:
        return tuple(self.topology.axis_names[a] for a in self.spanned_axes(chips))

    def axis_name(self, grid: np.ndarray, dim: int) -> str:
        """Physical axes spanned along grid dim `dim` (joined with '*' when several)."""
        return "*".join(self.torus_axes(grid_lines(grid, dim)[0])) or "-"

    def axis_bandwidth(self, grid: np.ndarray, dim: int) -> float:
        """Link bandwidth of the slowest physical axis spanned along grid dim `dim`."""
        spanned = self.spanned_axes(grid_lines(grid, dim)[0])
        return min(self.topology.link_bandwidth[a] for a in spanned)
