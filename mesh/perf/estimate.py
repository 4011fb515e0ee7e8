"""The performance estimate of a planned program: per-instruction costs and the schedule.

    estimate = ProgramEstimate(planned_program, topology, placement)
    estimate.cost_analysis()   # jax's keys plus a 'trn2' breakdown
    estimate.listing()         # the program with an estimated time on every line
    trace.chrome_trace(estimate)  # Chrome trace-event JSON (mesh.perf.trace)
    estimate.memory            # HBM per chip over this schedule (mesh.memory)

Instructions with sub-programs (loops, conditionals; any instruction whose class has no cost
rule and has Program-valued fields) are costed by estimating their sub-programs: a field
holding one program runs `trip_count` times (the instruction's attribute; 1 when it has
none or it is unknown), a field holding a tuple of programs holds alternatives (branches),
of which the slowest is counted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

from mesh import isa
from mesh.isa import printer
from mesh.isa.sites import line_text
from mesh.perf import schedule
import numpy as np

from mesh.perf.collectives import KINDS, link_bytes
from mesh.perf.cost import Cost, has_rule, instruction_cost, queue
from mesh.machine import Placement, Topology, chips_text
from mesh.machine.runtime import EXPECTED_LEAVES_OUT, IDEAL_RUNTIME
from mesh.memory import MemoryAnalysis
from mesh.units import bandwidth_text, bytes_text, seconds_text


# The summary names the source lines (and scopes) that take the largest shares of the
# critical path.
SOURCE_LINES_SHOWN = 5


@dataclass(frozen=True)
class RegionEstimate:
    """A sub-program of a loop or conditional and its estimate: `runs` times per run of the
    instruction (a loop's trip count), its first run starting `offset` seconds after the
    instruction starts, one run every `period` seconds (the loop's iteration)."""

    label: str
    estimate: ProgramEstimate
    runs: int
    offset: float
    period: float


@dataclass(frozen=True)
class TimelineEvent:
    """One run of an instruction on one chip's timeline (seconds from the step's start):
    instruction `index` of `program`, `iteration` counting the runs of the loops around it
    (() at the top level)."""

    program: isa.Program
    index: int
    engine: str
    start: float
    seconds: float
    hbm_seconds: float
    cost: Cost
    iteration: tuple[int, ...] = ()


@dataclass(frozen=True)
class CollectiveTimes:
    """One step's collectives of one kind on one chip: how many run (a loop's count per
    trip), their time on the collective queue and the part of it no other engine hides
    (seconds; a loop's slowest branch, as the step time counts it)."""

    kind: str
    count: int
    seconds: float
    exposed_seconds: float

    def __add__(self, other: CollectiveTimes) -> CollectiveTimes:
        return CollectiveTimes(self.kind, self.count + other.count,
                               self.seconds + other.seconds,
                               self.exposed_seconds + other.exposed_seconds)

    def __mul__(self, runs: int) -> CollectiveTimes:
        return CollectiveTimes(self.kind, self.count * runs, self.seconds * runs,
                               self.exposed_seconds * runs)


@dataclass(frozen=True)
class LinkLoad:
    """One direction of a torus cable and the bytes a step puts on it; `seconds` is their
    time at the link's bandwidth."""

    src: int  # chip the link leaves
    dst: int
    axis: str  # torus axis name
    direction: int  # +1 towards higher coordinates, -1 lower
    bytes: float
    seconds: float

    @property
    def name(self) -> str:
        """'chip 3 -> chip 7 (y+)'."""
        return f"chip {self.src} -> chip {self.dst} ({self.axis}{'+' if self.direction > 0 else '-'})"


BUSIEST_LINKS = 3  # links cost_analysis names


def collective_kind(instr: isa.Instruction) -> str:
    """'all-gather', 'reduce-scatter', 'all-reduce', 'all-to-all', 'collective-permute'
    (mesh.perf.collectives.KINDS), or the mnemonic of another instruction on the collective
    queue."""
    return KINDS.get(type(instr), instr.mnemonic)


EXPECTED, IDEAL = "expected", "ideal"


class ProgramEstimate:
    """One chip's estimated costs and timeline for `program` (planned by
    lowering.plan.plan_program) on `topology` with the mesh placed by `placement`.

    `model` EXPECTED (the default) includes the runtime's measured costs
    (topology.runtime: mesh.machine.runtime); IDEAL leaves them out: the hardware's limits.
    `estimate.ideal` is the ideal estimate of the same program."""

    def __init__(self, program: isa.Program, topology: Topology,
                 placement: Placement | None = None, input_names: Sequence[str] | None = None,
                 model: str = EXPECTED):
        if model not in (EXPECTED, IDEAL):
            raise ValueError(f"model must be {EXPECTED!r} or {IDEAL!r}, got {model!r}")
        self.program = program
        self.topology = topology
        self.placement = placement
        self.input_names = input_names  # for memory messages: `argument 'w'`
        self.model = model
        self.runtime = topology.runtime if model == EXPECTED else IDEAL_RUNTIME
        # Exposed communication inside sub-programs, and loops of unknown trip count.
        self._inner_exposed_seconds = 0.0
        self.unknown_trip_counts = 0
        # The estimates of each loop's or conditional's sub-programs, by instruction index.
        self.regions: dict[int, tuple[RegionEstimate, ...]] = {}
        own = [self._cost(i, instr) for i, instr in enumerate(program.instructions)]
        self.schedule = schedule.schedule(program, [self._task(instr, c)
                                                    for instr, c in zip(program.instructions, own)])
        # Each instruction's share of the step time is its time on the critical path.
        self.costs: list[Cost] = [dataclasses.replace(c, optimal_seconds=slot.critical_seconds)
                                  for c, slot in zip(own, self.schedule.slots)]

    @property
    def chip(self):
        """The spec of one device: the chip, or its share a logical NeuronCore has
        (Topology.device): the compute rates and HBM every per-device cost reads."""
        return self.topology.device

    @cached_property
    def ideal(self) -> ProgramEstimate:
        """The ideal estimate of the same program (itself if it is one)."""
        if self.model == IDEAL:
            return self
        return ProgramEstimate(self.program, self.topology, self.placement, self.input_names,
                               model=IDEAL)

    @cached_property
    def total(self) -> Cost:
        """The sum of the instructions' costs; `optimal_seconds` is the step time."""
        return sum(self.costs, Cost())

    @cached_property
    def memory(self) -> MemoryAnalysis:
        """HBM use of every chip over this schedule (mesh.memory)."""
        times = [(slot.start, slot.end) for slot in self.schedule.slots]
        devices = self.placement.device_ids if self.placement is not None else None
        return MemoryAnalysis(self.program, self.chip, devices, self.topology.num_devices,
                              times, self.input_names)

    @property
    def step_seconds(self) -> float:
        return self.schedule.step_seconds

    @property
    def mfu(self) -> float:
        """Model FLOP utilisation: the time the dots' FLOPs the model needs (not jax's
        recomputation under jax.checkpoint) take at the chip's published peak for their
        dtype, over the step time."""
        step = self.step_seconds
        return (self.total.peak_seconds - self.total.recomputed_peak_seconds) / step \
            if step else 0.0

    @property
    def hfu(self) -> float:
        """Hardware FLOP utilisation: as `mfu`, counting every dot the chips run
        (recomputation included)."""
        step = self.step_seconds
        return self.total.peak_seconds / step if step else 0.0

    def busy_seconds(self) -> dict[str, float]:
        """Time each engine is occupied in one step (HBM traffic counts as DMA time)."""
        return {e: self.total.engine_seconds.get(e, 0.0) for e in schedule.ENGINES}

    @property
    def exposed_communication_seconds(self) -> float:
        """Time collectives run while no other engine works."""
        return self.schedule.exposed_seconds(isa.COLLECTIVE) + self._inner_exposed_seconds

    def communication_by_kind(self) -> dict[str, CollectiveTimes]:
        """The step's collectives by kind: count, time and exposed time per chip, loops'
        per trip times their trip count (their sums are busy_seconds()[COLLECTIVE] and
        exposed_communication_seconds)."""
        totals: dict[str, CollectiveTimes] = {}
        mine: dict[str, set[int]] = {}

        def add(times: CollectiveTimes) -> None:
            totals[times.kind] = totals[times.kind] + times if times.kind in totals else times

        for i, instr in enumerate(self.program.instructions):
            for region in self.regions.get(i, ()):
                for times in region.estimate.communication_by_kind().values():
                    add(times * region.runs)
            if i not in self.regions and queue(instr) == isa.COLLECTIVE:
                kind = collective_kind(instr)
                mine.setdefault(kind, set()).add(i)
                add(CollectiveTimes(kind, 1, self.costs[i].engine_seconds.get(isa.COLLECTIVE,
                                                                             0.0), 0.0))
        for kind, indices in mine.items():
            exposed = self.schedule.exposed_seconds(isa.COLLECTIVE, indices)
            add(CollectiveTimes(kind, 0, 0.0, exposed))
        return dict(sorted(totals.items(), key=lambda kv: -kv[1].seconds))

    @cached_property
    def link_bytes(self) -> np.ndarray:
        """The bytes every torus link carries over one step, [chip, torus axis, direction
        (0: towards lower coordinates, 1: higher)] (mesh.perf.collectives.link_bytes): each
        collective's, a loop body's times its trip count (1 when unknown, as the estimate
        counts it), the most any branch puts on each link."""
        return _program_link_bytes(self.program, self.topology, self.placement)

    def busiest_links(self, count: int = BUSIEST_LINKS) -> list[LinkLoad]:
        """The `count` links that carry the most bytes in a step, busiest first (none
        that carry nothing)."""
        loads, topology = self.link_bytes, self.topology
        links = []
        for chip in range(topology.num_chips):
            for peer, axis, direction in topology.neighbours(chip):
                nbytes = loads[chip, axis, 1 if direction > 0 else 0]
                if nbytes:
                    links.append(LinkLoad(chip, peer, topology.axis_names[axis], direction,
                                          float(nbytes),
                                          float(nbytes / topology.link_bandwidth[axis])))
        return sorted(links, key=lambda l: -l.bytes)[:count]

    def cost_analysis(self) -> dict:
        """jax's keys ('flops', 'bytes accessed', 'transcendentals', 'optimal_seconds'), per
        chip, each the sum over instructions, plus a 'trn2' breakdown."""
        total = self.total
        busy = self.busy_seconds()
        result = total.jax_dict()
        ideal = self.ideal
        result["trn2"] = {
            "topology": self.topology.name,
            "chips": self.topology.num_chips,
            "devices": self.topology.num_devices,
            "model": self.model,
            "step_seconds": self.step_seconds,
            "ideal_step_seconds": ideal.step_seconds,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "ideal_mfu": ideal.mfu,
            "ideal_hfu": ideal.hfu,
            "recomputed_flops": total.recomputed_flops,
            "serial_seconds": total.seconds,
            "engine_busy_seconds": busy,
            "communication_seconds": busy[isa.COLLECTIVE],
            "exposed_communication_seconds": self.exposed_communication_seconds,
            "communication_by_kind": {
                kind: {"count": t.count, "seconds": t.seconds,
                       "exposed_seconds": t.exposed_seconds}
                for kind, t in self.communication_by_kind().items()},
            "busiest_links": [{"link": l.name, "bytes": l.bytes, "seconds": l.seconds}
                              for l in self.busiest_links()],
            "peak_flops_seconds": total.peak_seconds,
            "instructions": len(self.program.instructions),
            "critical_path_seconds": self.critical_path_by_engine(),
            "critical_path_by_source": self.critical_path_by_source(),
            "critical_path_by_scope": self.critical_path_by_scope(),
            "engine_seconds_by_source": {
                line: {e: cost.engine_seconds.get(e, 0.0) for e in schedule.ENGINES}
                for line, cost in self.cost_by_source().items()},
            "loops_of_unknown_trip_count": self.unknown_trip_counts,
            "runtime": dict(self.runtime.items()),
            "expected_leaves_out": EXPECTED_LEAVES_OUT,
        }
        return result

    def listing(self) -> str:
        """The program listing with `start +duration` on every instruction (microseconds;
        `*` marks the critical path; inside a loop, its first iteration), between a target
        header and the summary."""
        first_runs = {}  # id(program) -> (its estimate, when its first run starts)

        def note(estimate: ProgramEstimate, start: float) -> None:
            first_runs[id(estimate.program)] = (estimate, start)
            for i, regions in estimate.regions.items():
                for region in regions:
                    note(region.estimate, start + estimate.schedule.slots[i].start + region.offset)

        note(self, 0.0)

        def timed(start: float, seconds: float, mark: str) -> str:
            return f"{start * 1e6:10.3f} +{seconds * 1e6:9.3f}{mark}"

        def prefix(program: isa.Program, i: int) -> str:
            if id(program) not in first_runs:  # a fused kernel's decomposition: not run
                return " " * len(timed(0.0, 0.0, " "))
            estimate, start = first_runs[id(program)]
            slot = estimate.schedule.slots[i]
            return timed(start + slot.start, slot.seconds,
                         "*" if slot.critical_seconds > 0 else " ")

        head = (f"{'start us':>10} {'+time us':>10} ({self.model} times; * critical path; inside "
                "a loop: its first iteration)")
        return "\n".join([target_text(self.topology, self.placement), head,
                          printer.program_text(self.program, prefix), "", self.summary()])

    def summary(self) -> str:
        """The step time, MFU, engine busy times and exposed communication, as text."""
        cost = self.cost_analysis()
        info = cost["trn2"]
        step = self.step_seconds
        busy = info["engine_busy_seconds"]
        share = (lambda s: f"{s / step:6.1%}") if step else (lambda s: "     -")
        ideal = self.ideal
        recomputed = (f"; HFU {self.hfu:.1%} / {ideal.hfu:.1%} counting jax.checkpoint's "
                      f"recomputation" if info["recomputed_flops"] else "")
        peak = self.chip.peak_flops_for("bfloat16") / 1e12
        lines = [
            f"estimated step time per chip on {self.topology.name} "
            f"({self.program.mesh.num_devices} of its {_devices_text(self.topology)}): "
            f"expected {seconds_text(step)} (with the Neuron runtime's measured costs), "
            f"ideal {seconds_text(ideal.step_seconds)} (the hardware's limits)",
            f"MFU {self.mfu:.1%} expected / {ideal.mfu:.1%} ideal of the chips' peak "
            f"({peak:,.0f} TFLOP/s BF16){recomputed}",
            f"per chip: {cost['flops']:.4g} FLOPs, {bytes_text(cost['bytes accessed'])} "
            f"HBM traffic, {cost['transcendentals']:.4g} transcendentals; "
            f"{seconds_text(info['serial_seconds'])} if nothing overlapped",
            "engine busy:  " + "  ".join(f"{e} {seconds_text(busy[e])} ({share(busy[e]).strip()})"
                                         for e in schedule.ENGINES),
            f"communication {seconds_text(info['communication_seconds'])}, exposed (no other "
            f"engine busy) {seconds_text(info['exposed_communication_seconds'])}"
            + "".join(f"; {kind} x{t['count']} {seconds_text(t['seconds'])} (exposed "
                      f"{seconds_text(t['exposed_seconds'])})"
                      for kind, t in info["communication_by_kind"].items()),
            "critical path: " + "  ".join(f"{e} {seconds_text(s)}" for e, s in
                                          info["critical_path_seconds"].items() if s),
        ]
        if step:
            lines += _largest_shares("critical path by source line",
                                     info["critical_path_by_source"], step, "(no source line)")
        if step:
            lines.append("time by source line (busy per engine, one step):")
            lines += ["  " + row for row in self.source_table().splitlines()]
        if step and any(info["critical_path_by_scope"]):
            lines += _largest_shares("critical path by scope", info["critical_path_by_scope"],
                                     step, "(no scope)")
        if self.unknown_trip_counts:
            lines.append(f"{self.unknown_trip_counts} loop(s) of unknown trip count are "
                         "counted as running once")
        lines.append("the expected time's runtime costs (mesh.machine.runtime): "
                     + self.topology.runtime.text())
        lines.append(f"the expected time leaves out: {EXPECTED_LEAVES_OUT}")
        lines.append(self.memory.summary())
        return "\n".join(lines)

    def timeline(self, max_events: int | None = None) -> list[TimelineEvent]:
        """Every instruction run of one chip's step, loops unrolled into their iterations
        (beyond `max_events`, long loops show their first iterations and their last)."""
        max_events = self.event_count if max_events is None else max_events
        events: list[TimelineEvent] = []
        self._unroll(0.0, (), events, max_events)
        return events

    def _unroll(self, start: float, iteration: tuple[int, ...], events: list,
                budget: int) -> None:
        for slot, cost in zip(self.schedule.slots, self.costs):
            events.append(TimelineEvent(self.program, slot.index, slot.engine,
                                        start + slot.start, slot.seconds, slot.hbm_seconds,
                                        cost, iteration))
            for region in self.regions.get(slot.index, ()):
                size = max(1, region.estimate.event_count)
                room = max(1, (budget - len(events)) // size)
                runs = range(region.runs) if region.runs <= room else \
                    [*range(max(1, room - 1)), region.runs - 1]
                for k in runs:
                    region.estimate._unroll(start + slot.start + region.offset
                                            + k * region.period, (*iteration, k), events,
                                            budget)

    @cached_property
    def event_count(self) -> int:
        """Timeline events of one run, loops unrolled."""
        return len(self.schedule.slots) + sum(
            region.runs * region.estimate.event_count
            for regions in self.regions.values() for region in regions)

    def critical_path_by_engine(self) -> dict[str, float]:
        """Seconds of the critical path on each engine; a loop's share is split among the
        engines inside it as its iterations' critical paths are."""
        shares: dict[str, float] = {}
        for instr, engine, seconds in self._critical_leaves():
            shares[engine] = shares.get(engine, 0.0) + seconds
        return shares

    def critical_path_by_source(self) -> dict[str, float]:
        """Seconds of the critical path at each line of the user's code (`model.py:41`, its
        path relative to the working directory, or its file name; '' for instructions
        without one), loops split among the lines inside them: where a step's time goes,
        line by line. A library's op (a flax Dense's matmul) counts at the user's line
        that called the library."""
        shares: dict[str, float] = {}
        for instr, engine, seconds in self._critical_leaves():
            line = line_text(instr.loc)
            shares[line] = shares.get(line, 0.0) + seconds
        return shares

    def cost_by_source(self) -> dict[str, Cost]:
        """The step's cost at each line of the user's code (keys as critical_path_by_source):
        each engine's busy seconds, FLOPs, HBM bytes and peak seconds of the instructions
        the line made, loops counted by their trip counts (sums over the lines equal
        busy_seconds() and the step's FLOPs), with `optimal_seconds` the line's share of the
        critical path. The table a Neuron profile's operator view gives, line by line."""
        costs: dict[str, Cost] = {}
        self._add_costs_by_source(costs, 1.0)
        for line, seconds in self.critical_path_by_source().items():
            costs[line] = dataclasses.replace(costs.get(line, Cost()), optimal_seconds=seconds)
        return costs

    def _add_costs_by_source(self, costs: dict[str, Cost], runs: float) -> None:
        for i, (instr, cost) in enumerate(zip(self.program.instructions, self.costs)):
            regions = self.regions.get(i)
            if regions:
                for region in regions:
                    region.estimate._add_costs_by_source(costs, runs * region.runs)
                continue
            line = line_text(instr.loc)
            costs[line] = costs.get(line, Cost()) + runs * dataclasses.replace(
                cost, optimal_seconds=0.0)

    def source_table(self, rows: int = SOURCE_LINES_SHOWN) -> str:
        """The `rows` lines of the user's code with the most critical-path time, each with
        its share of the step, every engine's busy time and its FLOPs and HBM traffic."""
        step = self.step_seconds
        ranked = sorted(self.cost_by_source().items(), key=lambda kv: -kv[1].optimal_seconds)
        width = max([len(name or "(no source line)") for name, _ in ranked[:rows]] + [11])
        head = (f"{'source line':<{width}} {'critical':>8} "
                + " ".join(f"{e + ' ms':>13}" for e in schedule.ENGINES)
                + f" {'FLOPs':>9} {'HBM':>10}")
        lines = [head]
        for name, cost in ranked[:rows]:
            share = cost.optimal_seconds / step if step else 0.0
            lines.append(f"{name or '(no source line)':<{width}} {share:8.1%} "
                         + " ".join(f"{cost.engine_seconds.get(e, 0.0) * 1e3:13,.3f}"
                                    for e in schedule.ENGINES)
                         + f" {cost.flops:9.3g} {bytes_text(cost.bytes_accessed):>10}")
        if len(ranked) > rows:
            lines.append(f"... {len(ranked) - rows} more lines")
        return "\n".join(lines)

    def critical_path_by_scope(self) -> dict[str, float]:
        """Seconds of the critical path in each of the user's name scopes (a Flax module
        path `Model/block0/attn/q`, jax.named_scope names; '' for instructions in none),
        loops split among the scopes inside them: where a step's time goes, layer by
        layer."""
        shares: dict[str, float] = {}
        for instr, engine, seconds in self._critical_leaves():
            shares[instr.scope] = shares.get(instr.scope, 0.0) + seconds
        return shares

    def _critical_leaves(self, scale: float = 1.0):
        """(instruction, engine, seconds) of the critical path, loops opened up."""
        for slot in self.schedule.slots:
            if not slot.critical_seconds:
                continue
            regions = self.regions.get(slot.index)
            if not regions or not slot.seconds:
                yield self.program.instructions[slot.index], slot.engine, \
                    scale * slot.critical_seconds
                continue
            inner = scale * slot.critical_seconds / slot.seconds
            for region in regions:
                yield from region.estimate._critical_leaves(inner * region.runs)

    def _cost(self, index: int, instr: isa.Instruction) -> Cost:
        fields = list(isa.subprogram_fields(instr).values())
        if has_rule(instr) or not fields:
            return instruction_cost(instr, self.program, self.chip, self.runtime)
        trips = getattr(instr, "trip_count", 1)
        if trips is None:
            self.unknown_trip_counts += 1
            trips = 1
        slowest = []  # of each field: its alternatives' slowest (a branch), in run order
        for alternatives in fields:
            estimates = [ProgramEstimate(p, self.topology, self.placement, model=self.model)
                         for p in alternatives]
            slowest.append(max(estimates, key=lambda e: e.step_seconds))
        period = sum(e.step_seconds for e in slowest)
        total, offset, regions = Cost(), 0.0, []
        for (name, alternatives), estimate in zip(isa.subprogram_fields(instr).items(),
                                                  slowest):
            total += trips * dataclasses.replace(estimate.total, seconds=estimate.step_seconds)
            self._inner_exposed_seconds += trips * estimate.exposed_communication_seconds
            self.unknown_trip_counts += estimate.unknown_trip_counts
            regions.append(RegionEstimate(name, estimate, trips, offset, period))
            offset += estimate.step_seconds
        self.regions[index] = tuple(regions)
        return total

    def _task(self, instr: isa.Instruction, cost: Cost) -> schedule.Task:
        if isa.subprogram_fields(instr) and not has_rule(instr):
            return schedule.Task(schedule.ALL, cost.seconds)
        engine = queue(instr)
        hbm = cost.engine_seconds.get(isa.DMA, 0.0) if engine != isa.DMA else 0.0
        return schedule.Task(engine, cost.seconds, hbm)


def _program_link_bytes(program: isa.Program, topology: Topology,
                        placement: Placement | None) -> np.ndarray:
    total = np.zeros((topology.num_chips, topology.ndim, 2))
    for instr in program.instructions:
        total += link_bytes(instr, topology, placement)
        trips = getattr(instr, "trip_count", 1)
        trips = 1 if trips is None else trips  # unknown: once, as the estimate counts it
        for alternatives in isa.subprogram_fields(instr).values():
            branches = [_program_link_bytes(p, topology, placement) for p in alternatives]
            total += trips * np.max(branches, axis=0)
    return total




def _largest_shares(title: str, shares: dict[str, float], step: float,
                    unnamed: str) -> list[str]:
    """`title: model.py:41 40%  model.py:12 30%  ... 3 more`: the largest shares of the step
    time `step` (seconds), as one line; no line when `shares` is empty."""
    ranked = sorted(shares.items(), key=lambda kv: -kv[1])
    if not ranked:
        return []
    shown = ranked[:SOURCE_LINES_SHOWN]
    more = f"  ... {len(ranked) - len(shown)} more" if len(ranked) > len(shown) else ""
    return [f"{title}: " + "  ".join(f"{name or unnamed} {s / step:.0%}" for name, s in shown)
            + more]


def _devices_text(topology: Topology) -> str:
    """'64 chips', or '64 devices (LNC=2 logical cores, 4 per chip)'."""
    if topology.lnc is None:
        return f"{topology.num_chips} chips"
    return (f"{topology.num_devices} devices ({topology.device_kind}s, "
            f"{topology.devices_per_chip} per chip)")


def target_text(topology: Topology, placement: Placement | None) -> str:
    """Which machine and device spec the estimate is for."""
    chip = topology.device
    links = ", ".join(
        f"{n}: EFA switch, {bandwidth_text(b)} per chip's NIC, {seconds_text(t)}/hop"
        if a in topology.efa_axes else f"{n}: {bandwidth_text(b)} {seconds_text(t)}/hop"
        for a, (n, b, t) in enumerate(zip(topology.axis_names, topology.link_bandwidth,
                                          topology.link_latency)))
    placed = ""
    if placement is not None:
        axes = ", ".join(f"{n}={s} on {placement.axis_text(i, topology.axis_names)}"
                         for i, (n, s) in enumerate(zip(placement.axis_names,
                                                        placement.axis_sizes)))
        chips = placement.chips
        placed = (f"\nmesh: {axes}; chips {chips_text(chips)} "
                  f"({len(chips)} of {topology.num_chips})")
        if topology.lnc is not None:
            placed += f", devices {chips_text(placement.device_ids)} of {_devices_text(topology)}"
    if topology.has_faults:
        placed += f"\nfaults: {topology.faults_text()}"
    return (f"target: {topology.name} torus {'x'.join(map(str, topology.shape))} (links per "
            f"direction {links}){placed}\n"
            f"{'chip' if topology.lnc is None else 'device'}: {chip.name}, "
            f"{chip.neuron_cores} NeuronCores, PE {chip.pe_rows}x"
            f"{chip.pe_cols} at {chip.tensor_clock_hz / 1e9:g} GHz, Vector/Scalar/GpSimd "
            f"{chip.vector_clock_hz / 1e9:g}/{chip.scalar_clock_hz / 1e9:g}/"
            f"{chip.gpsimd_clock_hz / 1e9:g} GHz, HBM {bandwidth_text(chip.hbm_bandwidth)}, "
            f"BF16 peak {chip.peak_flops_for('bfloat16') / 1e12:g} TFLOP/s")
