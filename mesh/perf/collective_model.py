"""Collectives on the torus: which links carry what, in how many steps, and how long it takes.

A collective's replica groups are lines of the logical mesh (or arbitrary device sets);
the placement (mesh.machine.placement.place_mesh) puts each logical device on a chip, so a logical
axis becomes one or more physical torus axes. Every algorithm below is a sequence of steps;
a step is a set of transfers (source chip, destination chip, bytes) that run at the same
time, each routed hop by hop by dimension-order routing (Topology.route). Alpha-beta model
of a step: the longest route's latency (link latency x hops) plus the bytes on the busiest
link divided by that link's bandwidth. On a logical axis that is a whole torus ring, every
transfer is one hop and no two share a link, so a bidirectional ring gives exactly
mesh/machine/trn2_facts.md's formulas (all-gather (k-1)a + (k-1)/k M/(2B), all-reduce twice
that); on other groups the busiest link shows the contention.

Algorithms (M is the full buffer per chip: the result of an all-gather, the operand of the
others; P is the group size):
  ring            bidirectional ring along each group axis in turn ("one dimension after
                  another"), every axis order tried; all-reduce = reduce-scatter + all-gather.
  line            the same on groups that are not whole torus rings (a segment of a ring:
                  a 2-chip group on a 4-ring is one link), without the wraparound link:
                  each link carries twice a ring's bytes per direction.
  rotated rings   the buffer split into one part per axis, part i running the axes in an
                  order rotated by i, so every axis is busy in every stage (reaches the
                  injection bound on a torus of equal links); the split is equal, or in
                  proportion to the bandwidth of each part's heaviest stage.
  direct          every member sends each other member its block in one step (the
                  latency-optimal choice for small messages); all-reduce as one-shot (full
                  buffers, reduced at the receiver) or two-shot (direct reduce-scatter then
                  direct all-gather); all-to-all also axis by axis.
  recursive halving-doubling
                  the group as a hypercube (a 4x4 torus is a 4-D one): log2(P) exchanges
                  with partners at distance P/2, P/4, ... of halving blocks (reduce-scatter),
                  then of doubling blocks (all-gather); groups of a power of two.
The ideal time is the least alpha-beta time of every candidate: what the links and their
per-hop latency allow.

The expected time is what the Neuron runtime takes (mesh.machine.runtime.RuntimeSpec):
  - the algorithm it picks by message size (its intra-node collectives page): mesh (the
    direct algorithms) below 1 MB, recursive halving-doubling to 56 MB, rings above; the
    fastest of that family;
  - a fixed cost per collective (its launch), and per stage among the ranks of a chip;
  - the per-hop latency of every step, as in the ideal;
  - the transfer time: the busiest link (EFA at its sustained share), the bytes a chip's
    collective DMA rings send, or the HBM traffic the collective makes, whichever is
    longest. HBM traffic: every byte sent is read, every byte received written, and a
    reduction reads the local part and writes the sum for each byte it combines. That
    traffic also occupies HBM against compute (the schedule puts it on the DMA queue).

Across servers (the UltraServers of an UltraCluster, Topology.efa_axes) EFA is a switched
fabric: a transfer between servers is one hop at the EFA latency from the sender's NIC port
to the receiver's, each port at the chip's share of its instance's EFA (the sustained share
in the expected time), so everything a chip sends to other servers in a step shares its
port. Groups that span servers with several chips in each run hierarchically, as the
runtime does by default (_plan_between_chips): the in-server stages over NeuronLink
(LocalStages "in server", planned as above) around the stage over EFA among the chips of
the same in-server index, whose algorithm is the cheapest of ring, RDH and mesh (the
runtime's inter-node choice by group and message size).

Not modelled: the collective cores' arithmetic itself, congestion from other collectives
running at the same time, incast or a per-peer cost of the mesh algorithm over EFA, the
overlap of a hierarchical collective's stages, and faults of EFA (a failed chip takes its
NIC; links between servers cannot fail).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass

import numpy as np

from mesh import isa
from mesh.machine import Placement, Topology
from mesh.units import bytes_text, seconds_text

# Largest group given the direct (all-pairs) candidates, whose n(n-1) transfers make them
# costly to evaluate and, like a collective library's one-shot algorithms, only ever worth
# it in small groups (all-to-all has no other algorithm and always gets them).
DIRECT_MAX_GROUP = 64

KINDS: dict[type, str] = {
    isa.AllReduce: "all-reduce",
    isa.AllGather: "all-gather",
    isa.ReduceScatter: "reduce-scatter",
    isa.AllToAll: "all-to-all",
    isa.RaggedAllToAll: "all-to-all",  # costed as one of its whole operand (RAGGED_BOUND)
    isa.CollectivePermute: "collective-permute",
}

# A ragged all-to-all sends only its send_sizes rows, which are data: the plan is that of an
# all-to-all of the whole operand with every peer sent an equal share (balanced sizes), and
# the listing says so. Routing skewed towards one peer loads its links more than that.
RAGGED_BOUND = ("ragged all-to-all (estimated as an all-to-all of the whole operand: "
                "balanced send sizes assumed)")


@dataclass(frozen=True)
class CollectivePlan(isa.Plan):
    """How one collective runs on the torus, and its alpha-beta time estimate (seconds).

    `message_bytes` is the full buffer per chip; `link_bytes` the bytes the busiest link
    carries in one direction over the whole collective; `rings` the ring (or line) length
    of each stage (empty for direct algorithms).
    """

    kind: str
    message_bytes: int
    group_size: int
    logical_axes: tuple[str, ...] | None  # None: groups that are not lines of the mesh
    torus_axes: tuple[str, ...]
    routed: bool  # some transfers of the chosen algorithm take several hops
    algorithm: str
    rings: tuple[int, ...]
    steps: int
    link_bytes: float
    max_hops: int
    latency_seconds: float
    bandwidth_seconds: float
    candidates: tuple[tuple[str, float], ...]  # (algorithm, seconds) of every one considered
    # The expected time: the runtime's algorithm, its fixed cost, per-hop latency and
    # transfer time (see the module doc), and the HBM bytes it reads and writes per chip.
    expected_algorithm: str = "none"
    fixed_seconds: float = 0.0
    expected_latency_seconds: float = 0.0
    transfer_seconds: float = 0.0
    transfer_bound: str = ""  # "links", "collective DMA" or "HBM"
    hbm_bytes: float = 0.0
    detours: int = 0  # transfers of the chosen algorithm routed around faults
    healthy_seconds: float | None = None  # the same collective without the topology's faults
    # The fields above describe the stage between servers over EFA, a switched fabric
    # (no hop distance between servers, each chip's NIC its bandwidth), when the groups
    # span several servers; then `stage_bytes` is the buffer per chip of that stage.
    over_efa: bool = False
    stage_bytes: float | None = None
    # The stages around the one the fields above describe (see LocalStages): among the
    # chips of each server over NeuronLink (a hierarchical collective across servers), and
    # among the ranks of one chip (a machine of logical NeuronCores, whose groups hold
    # several ranks per chip).
    in_server: LocalStages | None = None
    on_chip: LocalStages | None = None

    @property
    def local_stages(self) -> tuple[LocalStages, ...]:
        """The stages around the one between chips (or servers), outermost first."""
        return tuple(s for s in (self.in_server, self.on_chip) if s is not None)

    @property
    def seconds(self) -> float:
        """The ideal time."""
        return self.latency_seconds + self.bandwidth_seconds + \
            sum(s.seconds for s in self.local_stages)

    @property
    def expected_seconds(self) -> float:
        return self.fixed_seconds + self.expected_latency_seconds + self.transfer_seconds + \
            sum(s.expected_seconds for s in self.local_stages)

    def describe(self) -> str:
        on_chip = "".join("\n" + s.describe() for s in self.local_stages)
        if self.algorithm == ON_CHIP:  # every rank of each group on one chip
            return (f"{self.kind} of {bytes_text(self.message_bytes)} among the ranks of "
                    f"each chip: ideal {seconds_text(self.seconds)}, expected "
                    f"{seconds_text(self.expected_seconds)} (with "
                    f"{seconds_text(self.fixed_seconds)} launch){on_chip}")
        return self._torus_text() + on_chip

    @property
    def device_hbm_bytes(self) -> float:
        """The HBM bytes the collective reads and writes per device (rank): a chip's
        between chips and on it, shared by its ranks in the collective."""
        ranks = 1 if self.on_chip is None else self.on_chip.local_ranks * self.on_chip.groups
        return (self.hbm_bytes + sum(s.hbm_bytes for s in self.local_stages)) / ranks

    def _torus_text(self) -> str:
        """The stage between chips or servers (the whole collective on a whole-chip
        machine, unless it spans servers)."""
        ideal = self.latency_seconds + self.bandwidth_seconds
        expected = self.fixed_seconds + self.expected_latency_seconds + self.transfer_seconds
        axes = ",".join(self.logical_axes) if self.logical_axes is not None else \
            f"groups of {self.group_size}"
        torus = ",".join(self.torus_axes) or "-"
        shape = "lines" if self.algorithm.startswith("line") else "rings"
        rings = f" {shape} {'x'.join(map(str, self.rings))}" if self.rings else ""
        routed = f", routed up to {self.max_hops} hops" if self.routed else ""
        others = sorted((s, a) for a, s in self.candidates if a != self.algorithm)
        runner_up = f" (next: {others[0][1]} {seconds_text(others[0][0])})" if others else ""
        if self.healthy_seconds is not None:
            detours = f"{self.detours} transfers detoured, " if self.detours else ""
            slowdown = ideal / self.healthy_seconds if self.healthy_seconds else 1.0
            runner_up += (f"; faults: {detours}{slowdown:.2f}x the healthy "
                          f"{seconds_text(self.healthy_seconds)}")
        expected = (f"\nexpected (Neuron runtime): {self.expected_algorithm}, "
                    f"{seconds_text(expected)} = {seconds_text(self.fixed_seconds)} "
                    f"fixed + {seconds_text(self.expected_latency_seconds)} latency + "
                    f"{seconds_text(self.transfer_seconds)} transfer (bound by "
                    f"{self.transfer_bound}); HBM {bytes_text(self.hbm_bytes)} per chip"
                    if self.expected_algorithm != "none" else "")
        if self.over_efa:
            stage = "" if self.stage_bytes is None else \
                f", {bytes_text(self.stage_bytes)} per chip between servers"
            where = (f"EFA (switched: one hop between any two servers): {self.kind} of "
                     f"{bytes_text(self.message_bytes)} over logical {axes} -> servers along "
                     f"{torus}{rings}{stage}")
        else:
            where = (f"torus: {self.kind} of {bytes_text(self.message_bytes)} over logical "
                     f"{axes} -> torus {torus}{rings}{routed}")
        busiest = "NIC" if self.over_efa else "link"
        return (f"{where}\n"
                f"ideal: {self.algorithm}, {self.steps} steps, "
                f"busiest {busiest} {bytes_text(self.link_bytes)}/direction; "
                f"{seconds_text(ideal)} = {seconds_text(self.latency_seconds)} latency + "
                f"{seconds_text(self.bandwidth_seconds)} transfer{runner_up}{expected}")


ON_CHIP = "on-chip"  # the algorithm of a collective whose groups each lie on one chip

# The stages the Neuron runtime runs among the local members of a group (the ranks of a
# chip, the chips of a server) around the stage between them: a reduction before, a
# broadcast after, an exchange for all-to-all and permutes.
LOCAL_STAGES = {"all-reduce": ("reduce-scatter", "all-gather"),
                "reduce-scatter": ("reduce-scatter",), "all-gather": ("all-gather",)}


@dataclass(frozen=True)
class LocalStages:
    """The stages of a collective among the local members of each group, run around the
    stage between them (the plan's own fields): among the ranks (logical NeuronCores) of
    each chip (`where` "on chip"), or among the chips of each server over NeuronLink
    around the stage between servers over EFA ("in server"; the runtime's hierarchical
    collectives, the default since Neuron collectives 2.12).

    On chip, as the Neuron runtime runs it (its intra-node collectives page): a reduction
    (reduce-scatter among a chip's local ranks) before the stage between chips, a
    broadcast (all-gather among them) after it, an exchange for all-to-all and permutes.
    Each stage is one step of DMA through the chip's HBM, which the chip's cores share:
    every byte read and written there, and moved by the chip's collective DMA rings. The
    ideal time is the HBM traffic at the chip's HBM bandwidth; the expected adds each
    stage's fixed cost and DMA start (RuntimeSpec.on_chip_stage_seconds,
    dma_fixed_seconds) and takes the longer of HBM at its sustained rate and the
    collective DMA rings' rate.

    In a server: `plans` are the stages as the torus model plans them among the chips of
    each server (the runtime's intra-node algorithm by message size); their latency and
    transfer add up, their fixed costs do not (the collective pays its launch once, with
    the stage between servers).

    Per chip or server, `groups` groups (one per in-chip or in-server index the
    collective's groups take) of `local_ranks` members each; `hbm_bytes` is per chip over
    all stages.
    """

    where: str  # "on chip" or "in server"
    stages: tuple[str, ...]
    local_ranks: int
    groups: int
    hbm_bytes: float
    seconds: float  # ideal
    fixed_seconds: float
    transfer_seconds: float
    transfer_bound: str
    latency_seconds: float = 0.0
    plans: tuple[CollectivePlan, ...] = ()  # in a server: each stage's plan

    @property
    def expected_seconds(self) -> float:
        return self.fixed_seconds + self.latency_seconds + self.transfer_seconds

    def describe(self) -> str:
        member, unit = ("ranks", "chip") if self.where == "on chip" else ("chips", "server")
        runtime = "" if not self.plans else \
            " over NeuronLink, " + ", ".join(f"{p.kind} {p.expected_algorithm}"
                                             for p in self.plans)
        latency = "" if not self.latency_seconds else \
            f" + {seconds_text(self.latency_seconds)} latency"
        return (f"{self.where}: {' + '.join(self.stages)} among {self.local_ranks} local "
                f"{member} (x{self.groups} groups per {unit}){runtime}, HBM "
                f"{bytes_text(self.hbm_bytes)} per chip; ideal {seconds_text(self.seconds)}, "
                f"expected {seconds_text(self.expected_seconds)} = "
                f"{seconds_text(self.fixed_seconds)} fixed{latency} + "
                f"{seconds_text(self.transfer_seconds)} transfer (bound by "
                f"{self.transfer_bound})")


def on_chip_stages(kind: str, local_ranks: int, groups: int, message_bytes: float,
                   group_size: int, topology: Topology) -> LocalStages:
    """The on-chip stages of a `kind` collective of `message_bytes` per rank over groups of
    `group_size` ranks, `local_ranks` of each on every chip it spans, `groups` such
    groups per chip. Per group and chip (r local ranks, M bytes per rank):
      reduce-scatter (the reduction)  each rank reads the r blocks of M/r it reduces and
                                      writes their sum: HBM (r + 1) M; DMA moves (r-1) M
      all-gather (the broadcast)      each rank's block of M/r read once and written to
                                      its r-1 peers (write duplication): HBM r M; DMA (r-1) M
      exchange (all-to-all, permute)  each rank copies its blocks of M/P for its r-1
                                      local peers: HBM 2 r (r-1) M/P; DMA r (r-1) M/P."""
    r, m = local_ranks, float(message_bytes)
    stages = LOCAL_STAGES.get(kind, ("exchange",))
    traffic = {"reduce-scatter": ((r + 1) * m, (r - 1) * m),
               "all-gather": (r * m, (r - 1) * m),
               "exchange": (2 * r * (r - 1) * m / group_size, r * (r - 1) * m / group_size)}
    hbm = groups * sum(traffic[stage][0] for stage in stages)
    dma = groups * sum(traffic[stage][1] for stage in stages)
    chip, runtime = topology.chip, topology.runtime
    times = {"HBM": hbm / (chip.hbm_bandwidth * runtime.hbm_efficiency),
             "collective DMA": dma / runtime.collective_dma_bytes_per_second}
    bound = max(times, key=times.get)
    fixed = len(stages) * (runtime.on_chip_stage_seconds + runtime.dma_fixed_seconds)
    return LocalStages(where="on chip", stages=stages, local_ranks=r, groups=groups,
                       hbm_bytes=hbm, seconds=hbm / chip.hbm_bandwidth, fixed_seconds=fixed,
                       transfer_seconds=times[bound], transfer_bound=bound)


def in_server_stages(plans: tuple[CollectivePlan, ...], local_chips: int,
                     groups: int) -> LocalStages:
    """The stages among the chips of each server (`plans`, planned on the NeuronLink torus)
    of a hierarchical collective: `local_chips` chips of each group in every server it
    spans, `groups` such groups per server."""
    bounds = dict.fromkeys(p.transfer_bound for p in plans)
    return LocalStages(where="in server", stages=tuple(p.kind for p in plans),
                       local_ranks=local_chips, groups=groups,
                       hbm_bytes=sum(p.hbm_bytes for p in plans),
                       seconds=sum(p.seconds for p in plans), fixed_seconds=0.0,
                       latency_seconds=sum(p.expected_latency_seconds for p in plans),
                       transfer_seconds=sum(p.transfer_seconds for p in plans),
                       transfer_bound=", ".join(bounds), plans=plans)


def plan_collective(instr: isa.Instruction, message_bytes: int, topology: Topology,
                    placement: Placement | None) -> CollectivePlan:
    """The fastest algorithm for collective `instr` moving `message_bytes` per chip."""
    kind = KINDS.get(type(instr))
    if kind is None:
        raise ValueError(f"{type(instr).__name__} is not a collective")
    if isinstance(instr, isa.CollectivePermute):
        return _plan_permute(instr.pairs, message_bytes, topology, placement)
    plan = _plan_grouped(kind, instr.groups, message_bytes, topology, placement)
    if isinstance(instr, isa.RaggedAllToAll):
        return dataclasses.replace(plan, kind=RAGGED_BOUND)
    return plan


@functools.lru_cache(maxsize=1024)
def _plan_grouped(kind: str, groups: isa.Groups, message_bytes: int, topology: Topology,
                  placement: Placement | None) -> CollectivePlan:
    size = groups.group_size
    logical = None if groups.axes is None or placement is None else \
        tuple(placement.axis_names[a] for a in groups.axes)
    if size == 1 or message_bytes == 0:
        return _trivial(kind, message_bytes, size, logical)
    _check_placement(placement, size)
    chip_groups, local, per_chip = _chip_groups(groups, placement)
    # The stage between chips runs among ranks of the same in-chip index and carries the
    # chip's whole buffer: `per_chip` groups' of it where several groups share the chips
    # (a mesh's other axes on the cores), and for an all-to-all every local rank's blocks.
    between = message_bytes * per_chip * (local if kind == "all-to-all" else 1)
    plan = _plan_between_chips(kind, chip_groups, between, topology, logical) \
        if len(chip_groups[0]) > 1 else _on_chip_only(kind, message_bytes, size, logical,
                                                       topology)
    if local == 1:
        return plan if per_chip == 1 else dataclasses.replace(plan, message_bytes=message_bytes)
    # several ranks of each group per chip: the runtime's stages on the chip around the
    # stage between chips
    on_chip = on_chip_stages(kind, local, per_chip, message_bytes, size, topology)
    return dataclasses.replace(plan, message_bytes=message_bytes, group_size=size,
                               on_chip=on_chip)


def _chip_groups(groups: isa.Groups, placement: Placement
                 ) -> tuple[tuple[tuple[int, ...], ...], int, int]:
    """(the distinct chip sets the groups span, each in the order of its first rank; the
    most ranks a group has on one chip; how many groups share a chip set). A whole-chip
    machine's groups come back as they are, with 1 and 1."""
    chips = [tuple(placement.chip_of(d) for d in g) for g in groups.device_groups]
    local = max(max(c.count(x) for x in set(c)) for c in chips)
    distinct = tuple(dict.fromkeys(tuple(dict.fromkeys(c)) for c in chips))
    return distinct, local, -(-len(chips) // len(distinct))


def _plan_between_chips(kind: str, chip_groups: tuple[tuple[int, ...], ...],
                        message_bytes: float, topology: Topology,
                        logical: tuple[str, ...] | None) -> CollectivePlan:
    """The stage between chips. Groups that span servers and hold several chips in each
    run hierarchically, as the Neuron runtime does by default since Neuron collectives
    2.12 (trn2_facts.md, the inter-node collectives bullet): an all-reduce or
    reduce-scatter is first reduce-scattered among the chips of each server (NeuronLink),
    the 1/L piece each chip then holds (L chips of the group per server) is all-reduced or
    reduce-scattered over EFA among the chips of the same in-server index, and an
    all-reduce is all-gathered inside each server again; an all-gather runs the same
    backwards. Any other collective over servers runs as one stage over the switched
    fabric."""
    split = _server_split(chip_groups, topology) if kind in LOCAL_STAGES else None
    if split is None:
        return _plan_chips(kind, chip_groups, message_bytes, topology, logical)
    inside, across, local, groups = split
    stage_bytes = message_bytes / local
    between = _plan_chips(kind, across, stage_bytes, topology, logical)
    stages = tuple(_plan_chips(stage, inside, message_bytes, topology, logical)
                   for stage in LOCAL_STAGES[kind])
    return dataclasses.replace(between, message_bytes=message_bytes,
                               group_size=len(chip_groups[0]), stage_bytes=stage_bytes,
                               in_server=in_server_stages(stages, local, groups))


def _server_split(chip_groups: tuple[tuple[int, ...], ...], topology: Topology
                  ) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...],
                             int, int] | None:
    """How groups of chips that span servers split for a hierarchical collective: (the
    groups' chips in each server, the groups of chips of the same in-server index across
    the servers, chips of each group per server, such groups per server); None when the
    groups span no servers (or hold one chip per server, their stage over EFA alone) or
    hold different numbers of chips in different servers (one stage over the fabric).
    A chip's in-server index is its place among its group's chips in that server, in the
    group's order."""
    if not topology.efa_axes:
        return None
    efa = sorted(topology.efa_axes)
    inside, across, servers = [], [], set()
    for group in chip_groups:
        parts: dict[tuple[int, ...], list[int]] = {}
        for chip in group:
            parts.setdefault(tuple(topology.coords(chip)[a] for a in efa), []).append(chip)
        servers |= set(parts)
        inside += [tuple(part) for part in parts.values()]
        across += list(zip(*parts.values()))
    sizes = {len(part) for part in inside}
    if len(inside) == len(chip_groups) or sizes == {1} or len(sizes) > 1:
        return None
    return tuple(inside), tuple(across), sizes.pop(), len(inside) // len(servers)


def _on_chip_only(kind, message_bytes, size, logical, topology: Topology) -> CollectivePlan:
    """A collective whose every group lies on one chip: no stage between chips, the
    runtime's fixed cost of a collective (its launch; the stages add theirs)."""
    plan = dataclasses.replace(_trivial(kind, message_bytes, size, logical),
                               algorithm=ON_CHIP, candidates=((ON_CHIP, 0.0),))
    return dataclasses.replace(plan, expected_algorithm=ON_CHIP,
                               fixed_seconds=topology.runtime.collective_launch_seconds)


@functools.lru_cache(maxsize=1024)
def _plan_chips(kind: str, chip_groups: tuple[tuple[int, ...], ...], message_bytes: float,
                topology: Topology, logical: tuple[str, ...] | None) -> CollectivePlan:
    """The fastest algorithm for a `kind` collective among `chip_groups` (chip ids, one
    rank per chip), `message_bytes` per chip."""
    size = len(chip_groups[0])
    net = _Network.of(topology)
    grids, on_rings = net.grids([list(g) for g in chip_groups])
    candidates, rings = {}, {}
    for name, steps, ring_lengths in _algorithms(kind, grids, message_bytes, net,
                                                  on_rings):
        candidates[name], rings[name] = net.evaluate(steps), ring_lengths
    best = min(candidates, key=lambda name: candidates[name].seconds)
    plan = _plan(kind, message_bytes, size, logical, net, grids[0].ravel(),
                 candidates[best].max_hops > 1, best, rings[best], candidates)
    plan = _with_expected(plan, candidates, topology)
    if not topology.has_faults:
        return plan
    healthy = _plan_chips(kind, chip_groups, message_bytes, topology.healthy(), logical)
    return dataclasses.replace(plan, detours=candidates[best].detours,
                               healthy_seconds=healthy.seconds)


@functools.lru_cache(maxsize=1024)
def _plan_permute(pairs: tuple[tuple[int, int], ...], message_bytes: int, topology: Topology,
                  placement: Placement | None) -> CollectivePlan:
    pairs = tuple((s, t) for s, t in pairs if s != t)
    if not pairs or message_bytes == 0:
        return _trivial("collective-permute", message_bytes, 2 if pairs else 1, ())
    _check_placement(placement, 2)
    src, dst = (np.array(c, dtype=np.int64) for c in zip(*pairs))
    logical = _moved_axes(placement, src, dst)
    between = _between_chips(pairs, placement)
    plan = _plan_permute_chips(between, message_bytes, topology, logical) if between else \
        _on_chip_only("collective-permute", message_bytes, 2, logical, topology)
    # pairs on one chip copy through its HBM (an exchange of 2 ranks), as many at once
    # as the chip holds senders
    on_chip = [placement.chip_of(s) for s, t in pairs
               if placement.chip_of(s) == placement.chip_of(t)]
    if not on_chip:
        return plan
    most = max(on_chip.count(c) for c in set(on_chip))
    return dataclasses.replace(plan, on_chip=on_chip_stages(
        "collective-permute", 2, most, message_bytes, 2, topology))


def _between_chips(pairs: tuple[tuple[int, int], ...],
                   placement: Placement) -> tuple[tuple[int, int], ...]:
    """The (source chip, destination chip) of each pair of devices on different chips."""
    chips = [(placement.chip_of(s), placement.chip_of(t)) for s, t in pairs]
    return tuple((a, b) for a, b in chips if a != b)


@functools.lru_cache(maxsize=1024)
def _plan_permute_chips(chip_pairs: tuple[tuple[int, int], ...], message_bytes: int,
                        topology: Topology, logical: tuple[str, ...]) -> CollectivePlan:
    """A permutation's transfers between chips: chip a sends `message_bytes` to chip b for
    every pair (a, b), all at once."""
    net = _Network.of(topology)
    steps = _permute_steps(chip_pairs, message_bytes)
    result = net.evaluate(steps)
    moved = steps[0][0]
    plan = _plan("collective-permute", message_bytes, 2, logical, net,
                 np.concatenate([moved.src, moved.dst]), result.max_hops > 1, "direct", (),
                 {"direct": result})
    plan = _with_expected(plan, {"direct": result}, topology)
    if not topology.has_faults:
        return plan
    healthy = _plan_permute_chips(chip_pairs, message_bytes, topology.healthy(), logical)
    return dataclasses.replace(plan, detours=result.detours, healthy_seconds=healthy.seconds)


def link_bytes(instr: isa.Instruction, topology: Topology,
               placement: Placement | None) -> np.ndarray:
    """The bytes planned collective `instr` puts on each torus link over its whole run, for
    the algorithm its plan chose, routed as the estimate routed it (around faults too): an
    array [chip the link leaves, torus axis, direction (0: towards lower coordinates, 1:
    higher)]. Zeros for an instruction without a plan or a collective that moves nothing
    (or moves only among the ranks of a chip)."""
    loads = np.zeros((topology.num_chips, topology.ndim, 2))
    plan = getattr(instr, "plan", None)
    if not isinstance(plan, CollectivePlan) or plan.algorithm in ("none", ON_CHIP):
        return loads
    if isinstance(instr, isa.CollectivePermute):
        net = _Network.of(topology)
        steps = _permute_steps(_between_chips(
            tuple((s, t) for s, t in instr.pairs if s != t), placement), plan.message_bytes)
        for pattern, times in steps:
            loads += times * net.loads(pattern)[0].reshape(loads.shape)
        return loads
    kind = KINDS[type(instr)]
    chip_groups, local, per_chip = _chip_groups(instr.groups, placement)
    between = plan.message_bytes * per_chip * (local if kind == "all-to-all" else 1)
    split = _server_split(chip_groups, topology) if plan.in_server is not None else None
    if split is None:
        stages = [(kind, chip_groups, between, plan.algorithm)]
    else:  # hierarchical: the stage between servers and the stages in each server
        inside, across, _, _ = split
        stages = [(kind, across, plan.stage_bytes, plan.algorithm)] + [
            (stage.kind, inside, between, stage.algorithm) for stage in plan.in_server.plans]
    for stage in stages:
        loads += _stage_link_bytes(*stage, topology).reshape(loads.shape)
    return loads


@functools.lru_cache(maxsize=1024)
def _stage_link_bytes(kind: str, chip_groups: tuple[tuple[int, ...], ...],
                      message_bytes: float, algorithm: str, topology: Topology) -> np.ndarray:
    """The bytes each link carries (flat, by _Network.link_id) over one run of candidate
    `algorithm` for a `kind` collective among `chip_groups`: cached (read-only), as a
    step's collectives repeat with the same groups and sizes (one per layer and weight)."""
    net = _Network.of(topology)
    total = np.zeros(net.n_links)
    for pattern, times in _chosen_steps(kind, chip_groups, message_bytes, algorithm, net):
        total += times * net.loads(pattern)[0]
    total.flags.writeable = False
    return total


def _chosen_steps(kind: str, chip_groups: tuple[tuple[int, ...], ...], message_bytes: float,
                  algorithm: str, net: _Network) -> Steps:
    """The steps of candidate `algorithm` for a `kind` collective among `chip_groups`."""
    grids, on_rings = net.grids([list(g) for g in chip_groups], every=True)
    return next(steps for name, steps, _ in _algorithms(
        kind, grids, message_bytes, net, on_rings) if name == algorithm)


def _permute_steps(chip_pairs: tuple[tuple[int, int], ...], message_bytes: int) -> Steps:
    """A permutation's one step: chip a sends a whole buffer to chip b, every pair (a, b)
    at once."""
    src, dst = (np.array(c, dtype=np.int64) for c in zip(*chip_pairs))
    return [(_Pattern(src, dst, np.full(len(src), float(message_bytes))), 1)]


# --- algorithms -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Pattern:
    """Transfers that run at the same time: chip src[i] sends nbytes[i] to chip dst[i]."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray

    @staticmethod
    def concat(patterns: list[_Pattern]) -> _Pattern:
        return _Pattern(*(np.concatenate([getattr(p, f) for p in patterns])
                          for f in ("src", "dst", "nbytes")))


Steps = list[tuple[_Pattern, int]]  # (pattern, how many times it runs back to back)


def _algorithms(kind: str, grids: list[np.ndarray], m: float, net: _Network, on_rings: bool):
    """(name, steps, ring lengths) of every candidate algorithm for `kind`."""
    dims = list(range(grids[0].ndim))
    shape = grids[0].shape
    names = [net.axis_name(grids[0], d) for d in dims]
    ring_stages = {"all-gather": _all_gather, "reduce-scatter": _reduce_scatter,
                   "all-reduce": _all_reduce}.get(kind)
    if ring_stages is not None:
        # Lines first, so that where a line costs what a ring does (2 chips) it is named so.
        line = functools.partial(_line_stage, broken=net.broken)
        stages = (("line", line),) * (not on_rings) + (("ring", _ring_stage),)
        for (label, stage), order in itertools.product(stages, itertools.permutations(dims)):
            if len(dims) > 1:
                label = f"{label}s " + ">".join(names[d] for d in order)
            yield label, ring_stages(grids, order, m, stage), tuple(shape[d] for d in order)
        if len(dims) > 1:
            yield from _rotated(kind, ring_stages, grids, names, m, net)
        if _is_power_of_two(grids[0].size):
            yield RDH, _recursive_halving_doubling(kind, grids, m), ()
    if grids[0].size <= DIRECT_MAX_GROUP or ring_stages is None:
        yield from _direct(kind, grids, m)


def _ring_stage(grids: list[np.ndarray], dim: int, block: float) -> Steps:
    """k-1 steps of a bidirectional ring along grid dim `dim` of every group: each member
    sends half of a `block` to its next and the other half to its previous member."""
    k = grids[0].shape[dim]
    if k == 1:
        return []
    parts = []
    for grid in grids:
        for shift in (-1, 1):
            peer = np.roll(grid, shift, axis=dim).ravel()
            parts.append(_Pattern(grid.ravel(), peer, np.full(grid.size, block / 2)))
    return [(_Pattern.concat(parts), k - 1)]


def _line_stage(grids: list[np.ndarray], dim: int, block: float, broken=None) -> Steps:
    """k-1 steps of a bidirectional line (a ring without its wraparound link: a segment of
    a torus ring, or a ring with a failed link, opened there) along grid dim `dim`: each
    step every member passes a whole `block` on to each neighbour it has, both ways
    pipelined, so a link carries (k-1) blocks each way, twice a ring's (k-1) half blocks.
    `broken(a, b)` says whether neighbours a and b lost their link."""
    k = grids[0].shape[dim]
    if k == 1:
        return []
    parts = []
    for grid in grids:
        lines = np.array([_opened(line, broken) for line in _lines(grid, dim)])
        lower, upper = lines[:, :-1].ravel(), lines[:, 1:].ravel()
        parts.append(_Pattern(np.concatenate([lower, upper]), np.concatenate([upper, lower]),
                              np.full(2 * lower.size, block)))
    return [(_Pattern.concat(parts), k - 1)]


def _opened(ring: np.ndarray, broken) -> np.ndarray:
    """The members of a ring as a line that starts after its first broken link, if any."""
    for r in range(len(ring)):
        if broken is not None and broken(int(ring[r - 1]), int(ring[r])):
            return np.roll(ring, -r)
    return ring


def _all_gather(grids, order, m, stage=_ring_stage) -> Steps:
    held = m / grids[0].size  # bytes each member holds before the first stage
    steps = []
    for d in order:
        steps += stage(grids, d, held)
        held *= grids[0].shape[d]
    return steps


def _reduce_scatter(grids, order, m, stage=_ring_stage) -> Steps:
    held = m
    steps = []
    for d in order:
        k = grids[0].shape[d]
        steps += stage(grids, d, held / k)
        held /= k
    return steps


def _all_reduce(grids, order, m, stage=_ring_stage) -> Steps:
    return _reduce_scatter(grids, order, m, stage) + \
        _all_gather(grids, tuple(reversed(order)), m, stage)


def _rotated(kind, ring_stages, grids, names, m, net: _Network):
    """Rotated rings: one part of the buffer per axis, each starting on a different axis.

    The heaviest stage of part i is its first for reduce-scatter and all-reduce and its last
    for all-gather; the weighted split gives each part a share in proportion to the link
    bandwidth of the axis it uses there.
    """
    dims = list(range(grids[0].ndim))
    n = len(dims)
    for cyclic in _cyclic_orders(dims):
        orders = [cyclic[i:] + cyclic[:i] for i in range(n)]
        heavy = [o[-1] if kind == "all-gather" else o[0] for o in orders]
        bandwidth = np.array([net.axis_bandwidth(grids[0], d) for d in heavy])
        splits = {"": np.full(n, 1.0 / n), ", split by link bandwidth": bandwidth / bandwidth.sum()}
        if np.allclose(splits[""], splits[", split by link bandwidth"]):
            del splits[", split by link bandwidth"]
        label = ">".join(names[d] for d in cyclic)
        for suffix, shares in splits.items():
            parts = [ring_stages(grids, order, m * share) for order, share in zip(orders, shares)]
            yield f"rotated rings {label} ({n} parts{suffix})", _concurrent(parts), \
                tuple(grids[0].shape[d] for d in cyclic)


RDH = "recursive halving-doubling"


def _is_power_of_two(n: int) -> bool:
    return n > 1 and n & (n - 1) == 0


def _recursive_halving_doubling(kind: str, grids: list[np.ndarray], m: float) -> Steps:
    """Recursive halving (reduce-scatter: at step s each member exchanges half of what it
    holds with the member P/2^(s+1) ranks away) and recursive doubling (all-gather: it
    exchanges all it holds with the member 2^s ranks away); all-reduce is both. Members are
    ranked in the grid's row-major order, so on a torus of power-of-two rings the partners
    lie along one axis at a time (a 4x4 torus is a 4-D hypercube)."""
    size = grids[0].size
    rounds = size.bit_length() - 1
    rank = np.arange(size)

    def exchange(distance: int, nbytes: float) -> tuple[_Pattern, int]:
        parts = [_Pattern(g.ravel(), g.ravel()[rank ^ distance], np.full(size, nbytes))
                 for g in grids]
        return _Pattern.concat(parts), 1

    halving = [exchange(size >> (s + 1), m / 2 ** (s + 1)) for s in range(rounds)]
    doubling = [exchange(1 << s, m * 2 ** s / size) for s in range(rounds)]
    return {"reduce-scatter": halving, "all-gather": doubling,
            "all-reduce": halving + doubling}[kind]


def _cyclic_orders(dims: list[int]) -> list[list[int]]:
    """Axis orders up to rotation (each rotation is one part of the rotated algorithm)."""
    first, rest = dims[0], dims[1:]
    return [[first, *p] for p in itertools.permutations(rest)]


def _direct(kind, grids, m):
    members = [g.ravel() for g in grids]
    block = m / grids[0].size
    if kind == "all-reduce":
        yield "one-shot", [(_all_pairs(members, m), 1)], ()
        yield "two-shot", [(_all_pairs(members, block), 1)] * 2, ()
    else:
        yield "direct", [(_all_pairs(members, block), 1)], ()
    if kind == "all-to-all" and grids[0].ndim > 1:
        steps = [(_all_pairs([line for g in grids for line in _lines(g, d)], m / k), 1)
                 for d, k in enumerate(grids[0].shape) if k > 1]
        yield "direct axis by axis", steps, ()


def _lines(grid: np.ndarray, dim: int) -> np.ndarray:
    """The lines of `grid` along `dim`, as rows of a 2-D array."""
    return np.moveaxis(grid, dim, -1).reshape(-1, grid.shape[dim])


def _all_pairs(member_sets: list[np.ndarray], nbytes: float) -> _Pattern:
    """Every chip of each set sends `nbytes` to every other chip of its set."""
    parts = []
    for members in member_sets:
        src, dst = np.repeat(members, members.size), np.tile(members, members.size)
        keep = src != dst
        parts.append(_Pattern(src[keep], dst[keep], np.full(int(keep.sum()), nbytes)))
    return _Pattern.concat(parts)


def _concurrent(parts: list[Steps]) -> Steps:
    """Step sequences run side by side, step by step: step t carries each part's t-th step."""
    expanded = [[pattern for pattern, times in part for _ in range(times)] for part in parts]
    steps: Steps = []
    for t in range(max(len(e) for e in expanded)):
        pattern = _Pattern.concat([e[t] for e in expanded if t < len(e)])
        if steps and _same(steps[-1][0], pattern):
            steps[-1] = (steps[-1][0], steps[-1][1] + 1)
        else:
            steps.append((pattern, 1))
    return steps


def _same(a: _Pattern, b: _Pattern) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("src", "dst", "nbytes"))


# --- the network --------------------------------------------------------------------------

@dataclass(frozen=True)
class _StepCost:
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


class _Network:
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
    def of(topology: Topology) -> _Network:
        return _Network(topology)

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

    def loads(self, pattern: _Pattern) -> tuple[np.ndarray, float, int, int]:
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

    def evaluate(self, steps: Steps) -> _StepCost:
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
        return _StepCost(latency, bandwidth, float(totals.max()), max_hops, count, detours,
                         efa_bandwidth, float(sent.max()), float(received.max()))

    def spanned_axes(self, chips: np.ndarray) -> list[int]:
        """Physical axes along which `chips` differ."""
        return [a for a in range(self.topology.ndim) if len(np.unique(self.coords[chips, a])) > 1]

    def torus_axes(self, chips: np.ndarray) -> tuple[str, ...]:
        return tuple(self.topology.axis_names[a] for a in self.spanned_axes(chips))

    def axis_name(self, grid: np.ndarray, dim: int) -> str:
        """Physical axes spanned along grid dim `dim` (joined with '*' when several)."""
        return "*".join(self.torus_axes(_lines(grid, dim)[0])) or "-"

    def axis_bandwidth(self, grid: np.ndarray, dim: int) -> float:
        """Link bandwidth of the slowest physical axis spanned along grid dim `dim`."""
        spanned = self.spanned_axes(_lines(grid, dim)[0])
        return min(self.topology.link_bandwidth[a] for a in spanned)


def _moved_axes(placement: Placement, src: np.ndarray, dst: np.ndarray) -> tuple[str, ...]:
    """Logical mesh axes along which a permutation moves data."""
    sizes = placement.axis_sizes
    a = np.stack(np.unravel_index(src, sizes), -1)
    b = np.stack(np.unravel_index(dst, sizes), -1)
    return tuple(placement.axis_names[i] for i in np.nonzero((a != b).any(0))[0])


def _check_placement(placement: Placement | None, size: int) -> None:
    if placement is None:
        raise ValueError(f"a collective over {size} devices needs a mesh placement")


def _trivial(kind, message_bytes, size, logical) -> CollectivePlan:
    return CollectivePlan(kind=kind, message_bytes=message_bytes, group_size=size,
                          logical_axes=logical, torus_axes=(), routed=False, algorithm="none",
                          rings=(), steps=0, link_bytes=0.0, max_hops=0, latency_seconds=0.0,
                          bandwidth_seconds=0.0, candidates=(("none", 0.0),))


# Which candidates belong to the runtime's algorithm families (see _with_expected).
MESH_FAMILY = ("direct", "one-shot", "two-shot", "direct axis by axis")


def _family(name: str) -> str:
    return "mesh" if name in MESH_FAMILY else "rdh" if name == RDH else "ring"


def _with_expected(plan: CollectivePlan, candidates: dict[str, _StepCost],
                   topology: Topology) -> CollectivePlan:
    """`plan` with the expected time: the fastest candidate (by expected time) of the family
    the runtime uses at this message size among the chips of a server (its intra-node page),
    or the next family that has candidates. Between servers the runtime's inter-node
    algorithms (ring, mesh, RDH over EFA) are chosen by group and message size (its
    inter-node page): the fastest of every candidate."""
    runtime = topology.runtime
    m = plan.message_bytes
    wanted = ("mesh", "rdh", "ring") if m < runtime.mesh_max_bytes else \
        ("rdh", "ring", "mesh") if m < runtime.rdh_max_bytes else ("ring", "rdh", "mesh")
    family = next(f for f in wanted if any(_family(n) == f for n in candidates))
    timed = {name: _expected(plan.kind, name, cost, topology)
             for name, cost in candidates.items()
             if plan.over_efa or _family(name) == family}
    name = min(timed, key=lambda n: sum(timed[n][:3]))
    fixed, latency, transfer, bound, hbm = timed[name]
    return dataclasses.replace(plan, expected_algorithm=name, fixed_seconds=fixed,
                               expected_latency_seconds=latency, transfer_seconds=transfer,
                               transfer_bound=bound, hbm_bytes=hbm)


def _expected(kind: str, name: str, cost: _StepCost,
              topology: Topology) -> tuple[float, float, float, str, float]:
    """(fixed, latency, transfer seconds, what bounds the transfer, HBM bytes) of one
    candidate as the runtime runs it."""
    runtime = topology.runtime
    fixed = runtime.collective_launch_seconds
    # the share of the bytes a chip receives that it adds into its own (reading both and
    # writing the sum): all of them in a reduce-scatter and a one-shot all-reduce, the
    # reduce-scatter half of any other all-reduce
    reduced = 1.0 if kind == "reduce-scatter" or name == "one-shot" else \
        0.5 if kind == "all-reduce" else 0.0
    hbm = cost.sent_bytes + cost.received_bytes * (1 + 2 * reduced)
    times = {"links": cost.efa_bandwidth,
             "collective DMA": cost.sent_bytes / runtime.collective_dma_bytes_per_second,
             "HBM": hbm / (topology.chip.hbm_bandwidth * runtime.hbm_efficiency)}
    bound = max(times, key=times.get)
    return fixed, cost.latency, times[bound], bound, hbm


def _plan(kind, message_bytes, size, logical, net: _Network, chips: np.ndarray, routed, best,
          rings, candidates) -> CollectivePlan:
    """The plan of candidate `best` among `chips` (the chips the collective moves data
    between)."""
    chosen = candidates[best]
    return CollectivePlan(
        kind=kind, message_bytes=message_bytes, group_size=size, logical_axes=logical,
        torus_axes=net.torus_axes(chips), routed=routed,
        over_efa=bool(set(net.spanned_axes(chips)) & net.topology.efa_axes),
        algorithm=best, rings=rings, steps=chosen.steps, link_bytes=chosen.link_bytes,
        max_hops=chosen.max_hops, latency_seconds=chosen.latency,
        bandwidth_seconds=chosen.bandwidth,
        candidates=tuple((name, c.seconds) for name, c in candidates.items()))


