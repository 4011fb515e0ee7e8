"""The performance estimate of a planned program: per-instruction costs and the schedule.

    estimate = ProgramEstimate(planned_program, topology, placement)
    estimate.cost_analysis()   # jax's keys plus a 'trn2' breakdown
    estimate.listing()         # the program with an estimated time on every line
    estimate.trace()           # Chrome trace-event JSON (mesh.perf.trace)
    estimate.memory            # HBM per chip over this schedule (mesh.memory)

Instructions with sub-programs (loops, conditionals; any instruction whose class has no cost
rule and has Program-valued fields) are costed by estimating their sub-programs: a field
holding one program runs `trip_count` times (the instruction's attribute; 1 when it has
none or it is unknown), a field holding a tuple of programs holds alternatives (branches),
of which the slowest is counted.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import Sequence

from mesh import isa
from mesh.isa import printer
from mesh.perf import schedule, trace
from mesh.perf.cost import Cost, has_rule, instruction_cost
from mesh.machine import Placement, Topology, chips_text
from mesh.memory import MemoryAnalysis
from mesh.units import bandwidth_text, bytes_text, seconds_text


class ProgramEstimate:
    """One chip's estimated costs and timeline for `program` (planned by
    lowering.plan.plan_program) on `topology` with the mesh placed by `placement`."""

    def __init__(self, program: isa.Program, topology: Topology,
                 placement: Placement | None = None, input_names: Sequence[str] | None = None):
        self.program = program
        self.topology = topology
        self.placement = placement
        self.input_names = input_names  # for memory messages: `argument 'w'`
        # Exposed communication inside sub-programs, and loops of unknown trip count.
        self._inner_exposed_seconds = 0.0
        self.unknown_trip_counts = 0
        own = [self._cost(instr) for instr in program.instructions]
        self.schedule = schedule.schedule(program, [self._task(instr, c)
                                                    for instr, c in zip(program.instructions, own)])
        # Each instruction's share of the step time is its time on the critical path.
        self.costs: list[Cost] = [dataclasses.replace(c, optimal_seconds=slot.critical_seconds)
                                  for c, slot in zip(own, self.schedule.slots)]

    @property
    def chip(self):
        return self.topology.chip

    @cached_property
    def total(self) -> Cost:
        """The sum of the instructions' costs; `optimal_seconds` is the step time."""
        return sum(self.costs, Cost())

    @cached_property
    def memory(self) -> MemoryAnalysis:
        """HBM use of every chip over this schedule (mesh.memory)."""
        times = [(slot.start, slot.end) for slot in self.schedule.slots]
        chips = self.placement.device_to_chip if self.placement is not None else None
        return MemoryAnalysis(self.program, self.chip, chips, self.topology.num_chips, times,
                              self.input_names)

    @property
    def step_seconds(self) -> float:
        return self.schedule.step_seconds

    @property
    def mfu(self) -> float:
        """Model FLOP utilisation: the time the dots' FLOPs take at the chip's published peak
        for their dtype, over the step time."""
        step = self.step_seconds
        return self.total.peak_seconds / step if step else 0.0

    def busy_seconds(self) -> dict[str, float]:
        """Time each engine is occupied in one step (HBM traffic counts as DMA time)."""
        return {e: self.total.engine_seconds.get(e, 0.0) for e in schedule.ENGINES}

    @property
    def exposed_communication_seconds(self) -> float:
        """Time collectives run while no other engine works."""
        return self.schedule.exposed_seconds(isa.COLLECTIVE) + self._inner_exposed_seconds

    def cost_analysis(self) -> dict:
        """jax's keys ('flops', 'bytes accessed', 'transcendentals', 'optimal_seconds'), per
        chip, each the sum over instructions, plus a 'trn2' breakdown."""
        total = self.total
        busy = self.busy_seconds()
        result = total.jax_dict()
        result["trn2"] = {
            "topology": self.topology.name,
            "chips": self.topology.num_chips,
            "step_seconds": self.step_seconds,
            "mfu": self.mfu,
            "serial_seconds": total.seconds,
            "engine_busy_seconds": busy,
            "communication_seconds": busy[isa.COLLECTIVE],
            "exposed_communication_seconds": self.exposed_communication_seconds,
            "peak_flops_seconds": total.peak_seconds,
            "instructions": len(self.program.instructions),
            "critical_path_seconds": self._critical_by_engine(),
            "loops_of_unknown_trip_count": self.unknown_trip_counts,
        }
        return result

    def listing(self) -> str:
        """The program listing with `start +duration` on every instruction (microseconds;
        `*` marks the critical path), between a target header and the summary."""
        slots = self.schedule.slots

        def prefix(i: int) -> str:
            slot = slots[i]
            mark = "*" if slot.critical_seconds > 0 else " "
            return f"{slot.start * 1e6:10.3f} +{slot.seconds * 1e6:9.3f}{mark}"

        head = f"{'start us':>10} {'+time us':>10} (* critical path)"
        return "\n".join([target_text(self.topology, self.placement), head,
                          printer.program_text(self.program, prefix), "", self.summary()])

    def summary(self) -> str:
        """The step time, MFU, engine busy times and exposed communication, as text."""
        cost = self.cost_analysis()
        info = cost["trn2"]
        step = self.step_seconds
        busy = info["engine_busy_seconds"]
        share = (lambda s: f"{s / step:6.1%}") if step else (lambda s: "     -")
        lines = [
            f"estimated step time {seconds_text(step)} per chip on {self.topology.name} "
            f"({self.program.mesh.num_devices} of its {self.topology.num_chips} chips); "
            f"MFU {self.mfu:.1%} of the published peak",
            f"per chip: {cost['flops']:.4g} FLOPs, {bytes_text(cost['bytes accessed'])} "
            f"HBM traffic, {cost['transcendentals']:.4g} transcendentals; "
            f"{seconds_text(info['serial_seconds'])} if nothing overlapped",
            "engine busy:  " + "  ".join(f"{e} {seconds_text(busy[e])} ({share(busy[e]).strip()})"
                                         for e in schedule.ENGINES),
            f"communication {seconds_text(info['communication_seconds'])}, exposed (no other "
            f"engine busy) {seconds_text(info['exposed_communication_seconds'])}",
            "critical path: " + "  ".join(f"{e} {seconds_text(s)}" for e, s in
                                          info["critical_path_seconds"].items() if s),
        ]
        if self.unknown_trip_counts:
            lines.append(f"{self.unknown_trip_counts} loop(s) of unknown trip count are "
                         "counted as running once")
        lines.append(self.memory.summary())
        return "\n".join(lines)

    def trace(self, chips=None) -> dict:
        """Chrome trace-event JSON (a dict) of the timeline, one process per chip."""
        return trace.chrome_trace(self.program, self.schedule, self.costs, self.topology,
                                  self.placement, chips, self.memory)

    def _critical_by_engine(self) -> dict[str, float]:
        shares: dict[str, float] = {}
        for slot in self.schedule.slots:
            if slot.critical_seconds:
                shares[slot.engine] = shares.get(slot.engine, 0.0) + slot.critical_seconds
        return shares

    def _cost(self, instr: isa.Instruction) -> Cost:
        regions = _regions(instr)
        if has_rule(instr) or not regions:
            return instruction_cost(instr, self.program, self.chip)
        trips = getattr(instr, "trip_count", 1)
        if trips is None:
            self.unknown_trip_counts += 1
            trips = 1
        total = Cost()
        for alternatives in regions:
            estimates = [ProgramEstimate(p, self.topology, self.placement) for p in alternatives]
            slowest = max(estimates, key=lambda e: e.step_seconds)
            total += trips * dataclasses.replace(slowest.total, seconds=slowest.step_seconds)
            self._inner_exposed_seconds += trips * slowest.exposed_communication_seconds
            self.unknown_trip_counts += slowest.unknown_trip_counts
        return total

    @staticmethod
    def _task(instr: isa.Instruction, cost: Cost) -> schedule.Task:
        if _regions(instr) and not has_rule(instr):
            return schedule.Task(schedule.ALL, cost.seconds)
        engine = instr.engine
        hbm = cost.engine_seconds.get(isa.DMA, 0.0) if engine != isa.DMA else 0.0
        return schedule.Task(engine, cost.seconds, hbm)


def _regions(instr: isa.Instruction) -> list[tuple[isa.Program, ...]]:
    """The instruction's sub-programs: one tuple per field (alternatives when several)."""
    return list(isa.subprogram_fields(instr).values())


def target_text(topology: Topology, placement: Placement | None) -> str:
    """Which machine and chip spec the estimate is for."""
    chip = topology.chip
    links = ", ".join(f"{n}: {bandwidth_text(b)} {seconds_text(t)}/hop"
                      for n, b, t in zip(topology.axis_names, topology.link_bandwidth,
                                         topology.link_latency))
    placed = ""
    if placement is not None:
        axes = ", ".join(f"{n}={s} on {placement.axis_text(i, topology.axis_names)}"
                         for i, (n, s) in enumerate(zip(placement.axis_names,
                                                        placement.axis_sizes)))
        placed = (f"\nmesh: {axes}; chips {chips_text(placement.device_to_chip)} "
                  f"({len(placement.device_to_chip)} of {topology.num_chips})")
    if topology.has_faults:
        placed += f"\nfaults: {topology.faults_text()}"
    return (f"target: {topology.name} torus {'x'.join(map(str, topology.shape))} (links per "
            f"direction {links}){placed}\n"
            f"chip: {chip.name}, {chip.neuron_cores} NeuronCores, PE {chip.pe_rows}x"
            f"{chip.pe_cols} at {chip.tensor_clock_hz / 1e9:g} GHz, Vector/Scalar/GpSimd "
            f"{chip.vector_clock_hz / 1e9:g}/{chip.scalar_clock_hz / 1e9:g}/"
            f"{chip.gpsimd_clock_hz / 1e9:g} GHz, HBM {bandwidth_text(chip.hbm_bandwidth)}, "
            f"BF16 peak {chip.peak_flops_for('bfloat16') / 1e12:g} TFLOP/s")
