"""How one collective runs: the CollectivePlan value (its algorithm, steps, busiest link,
ideal and expected times) and the LocalStages around its stage between chips (the package
doc, mesh.perf.collectives, holds the model)."""

from __future__ import annotations

from dataclasses import dataclass

from mesh import isa
from mesh.units import bytes_text, seconds_text


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
