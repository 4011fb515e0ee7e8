"""A schedule as Chrome trace-event JSON, for Perfetto (ui.perfetto.dev) or chrome://tracing.

One process per chip (pid = chip id, named with its torus coordinates and logical device),
one thread per engine, one complete ("X") event per instruction with its name, result
shapes and bytes; a compute instruction's HBM traffic is a second event on the DMA thread.
Each chip also has an `HBM` counter track: the bytes of HBM live over the step (mesh.memory).
Every chip runs the same program on the same local shapes, so every chip shows the same
timeline. Times are microseconds, as the format wants.
"""

from __future__ import annotations

import json
import os
from typing import Iterable, Sequence

from mesh import isa
from mesh.isa import printer
from mesh.perf.cost import Cost
from mesh.perf.schedule import ALL, ENGINES, Schedule
from mesh.machine import Placement, Topology
from mesh.machine.chip import GIB
from mesh.memory import MemoryAnalysis

# Thread order in the viewer: the engines, then instructions that hold all of them (loops),
# then free ones (constants, reshapes).
THREADS = ENGINES + (ALL, isa.NONE)
THREAD_NAMES = {ALL: "Control (loops, branches)", isa.NONE: "Free (no engine)"}
US = 1e6  # trace-event times are microseconds
HBM_COUNTER = "HBM"


def chrome_trace(program: isa.Program, schedule: Schedule, costs: Sequence[Cost],
                 topology: Topology, placement: Placement | None,
                 chips: Iterable[int] | None = None,
                 memory: MemoryAnalysis | None = None) -> dict:
    """The trace as a dict ({"traceEvents": [...]}); `costs[i]` is instruction i's cost;
    `chips` selects chip ids (all by default; a program without a mesh runs on chip 0);
    `memory` gives each chip its HBM counter track."""
    chips = _chips(topology, placement, chips)
    timeline = list(_instruction_events(program, schedule, costs))
    events = []
    for chip in chips:
        events += _process_metadata(chip, topology, placement)
        events += [dict(event, pid=chip) for event in timeline]
        if memory is not None:
            events += _hbm_counter(chip, memory, schedule.step_seconds)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"topology": topology.name, "program": program.name,
                          "step_us": schedule.step_seconds * US}}


def write_trace(path: str | os.PathLike, trace: dict) -> None:
    with open(path, "w") as f:
        json.dump(trace, f)


def _chips(topology: Topology, placement: Placement | None, chips) -> list[int]:
    running = sorted(placement.device_to_chip) if placement is not None else [0]
    if chips is None:
        return running
    chosen = [int(c) for c in chips]
    missing = [c for c in chosen if c not in running]
    if missing:
        raise ValueError(f"chips {missing} are not chips the program runs on "
                         f"({len(running)} chips: 0..{max(running)} on {topology.name})")
    return chosen


def _process_metadata(chip: int, topology: Topology, placement: Placement | None) -> list[dict]:
    name = f"chip {chip} {topology.coords(chip)}"
    if placement is not None:
        device = placement.device_of(chip)
        name += f" device {device}"
    meta = [{"ph": "M", "pid": chip, "tid": 0, "name": "process_name", "args": {"name": name}},
            {"ph": "M", "pid": chip, "tid": 0, "name": "process_sort_index",
             "args": {"sort_index": chip}}]
    for tid, engine in enumerate(THREADS):
        meta.append({"ph": "M", "pid": chip, "tid": tid, "name": "thread_name",
                     "args": {"name": THREAD_NAMES.get(engine, engine)}})
        meta.append({"ph": "M", "pid": chip, "tid": tid, "name": "thread_sort_index",
                     "args": {"sort_index": tid}})
    return meta


def _hbm_counter(chip: int, memory: MemoryAnalysis, step_seconds: float) -> list[dict]:
    """Counter events of the HBM bytes live on `chip` (GiB, as people size HBM), from the
    start of the step to its end."""
    stats = memory.stats(chip)
    if stats.peak_memory_in_bytes == 0:
        return []
    samples = list(memory.liveness.samples)
    at_start = stats.argument_size_in_bytes  # before anything runs: the arguments
    if not samples or samples[0][0] > 0:
        samples.insert(0, (0.0, at_start))
    if samples[-1][0] < step_seconds:
        samples.append((step_seconds, samples[-1][1]))
    return [{"ph": "C", "pid": chip, "tid": 0, "name": HBM_COUNTER, "ts": t * US,
             "args": {"GiB": live / GIB}} for t, live in samples]


def _instruction_events(program: isa.Program, schedule: Schedule, costs: Sequence[Cost]):
    """The events of one chip (without pid)."""
    for slot, cost in zip(schedule.slots, costs):
        instr = program.instructions[slot.index]
        args = {
            "outputs": [printer.value_text(program, v) for v in instr.outs],
            "inputs": [f"%{v}" for v in instr.ins],
            "bytes": cost.bytes_accessed,
            "flops": cost.flops,
            "critical_us": slot.critical_seconds * US,
        }
        if instr.loc:
            args["loc"] = instr.loc
        args.update({name: value.describe() for name, value in instr.params().items()
                     if isinstance(value, isa.Plan)})
        yield {"ph": "X", "tid": THREADS.index(slot.engine), "name": instr.mnemonic,
               "cat": slot.engine, "ts": slot.start * US, "dur": slot.seconds * US,
               "args": args}
        if slot.hbm_seconds and slot.engine not in (isa.DMA, ALL):
            yield {"ph": "X", "tid": THREADS.index(isa.DMA), "name": f"hbm {instr.mnemonic}",
                   "cat": isa.DMA, "ts": slot.start * US, "dur": slot.hbm_seconds * US,
                   "args": {"for": args["outputs"], "bytes": args["bytes"]}}
