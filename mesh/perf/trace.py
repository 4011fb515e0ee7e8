"""A schedule as Chrome trace-event JSON, for Perfetto (ui.perfetto.dev) or chrome://tracing.

One process per chip (pid = chip id, named with its torus coordinates and logical device),
one thread per engine, one complete ("X") event per run of an instruction with its name,
result shapes and bytes (a loop's instructions once per iteration, on their engines, the
iteration in their args; the loop itself spans them on a thread of its own); a compute
instruction's HBM traffic is a second event on the DMA thread.
Each chip also has an `HBM` counter track: the bytes of HBM live over the step (mesh.memory).
Every chip runs the same program on the same local shapes, so every chip shows the same
timeline. Times are microseconds, as the format wants. The timeline is the estimate's own
(the expected one, as jax_trn2 draws it); `otherData` gives both step times.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Iterable, Sequence

from mesh import isa
from mesh.isa import printer
from mesh.isa.sites import line_text
from mesh.perf.schedule import ALL, ENGINES
from mesh.machine import Placement, Topology
from mesh.machine.chip import GIB
from mesh.memory import MemoryAnalysis

if TYPE_CHECKING:
    from mesh.perf.estimate import ProgramEstimate, TimelineEvent

# Thread order in the viewer: the engines, then instructions that hold all of them (loops,
# whose iterations' instructions are drawn on the engines), then free ones (constants,
# reshapes).
THREADS = ENGINES + (ALL, isa.NONE)
THREAD_NAMES = {ALL: "Loops and branches (their instructions run on the engines above)",
                isa.NONE: "Free (no engine)"}
US = 1e6  # trace-event times are microseconds
# Events in a whole trace (every chip's copy of the timeline), so that a viewer opens it:
# beyond this, long loops show their first iterations and their last (the others repeat).
MAX_TRACE_EVENTS = 400_000
HBM_COUNTER = "HBM"


def chrome_trace(estimate: ProgramEstimate, chips: Iterable[int] | None = None) -> dict:
    """The trace of `estimate` as a dict ({"traceEvents": [...]}): its timeline with loops
    unrolled into iterations (ProgramEstimate.timeline); `chips` selects chip ids (all by
    default; a program without a mesh runs on chip 0)."""
    topology, placement = estimate.topology, estimate.placement
    chips = _chips(topology, placement, chips)
    per_chip = max(1, MAX_TRACE_EVENTS // len(chips))
    timeline = list(_instruction_events(estimate.timeline(per_chip)))
    step = estimate.step_seconds
    events = []
    for chip in chips:
        events += _process_metadata(chip, topology, placement)
        events += [dict(event, pid=chip) for event in timeline]
        events += _hbm_counter(chip, estimate.memory, step)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"topology": topology.name, "program": estimate.program.name,
                          "model": estimate.model, "step_us": step * US,
                          "ideal_step_us": estimate.ideal.step_seconds * US}}


def write_trace(path: str | os.PathLike, trace: dict) -> None:
    with open(path, "w") as f:
        json.dump(trace, f)


def _chips(topology: Topology, placement: Placement | None, chips) -> list[int]:
    """The machine devices (chips on a whole-chip machine) the trace shows."""
    running = sorted(placement.device_ids) if placement is not None else [0]
    if chips is None:
        return running
    chosen = [int(c) for c in chips]
    missing = [c for c in chosen if c not in running]
    if missing:
        what = "chips" if topology.lnc is None else "devices"
        raise ValueError(f"{what} {missing} are not {what} the program runs on "
                         f"({len(running)} {what}: 0..{max(running)} on {topology.name})")
    return chosen


def _process_metadata(chip: int, topology: Topology, placement: Placement | None) -> list[dict]:
    name = f"chip {chip} {topology.coords(chip)}" if topology.lnc is None else \
        f"device {chip} {topology.device_coords(chip)} on chip {topology.chip_of_device(chip)}"
    if placement is not None:
        device = placement.device_of(chip)
        name += f" device {device}" if topology.lnc is None else f", mesh device {device}"
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


def _instruction_events(timeline: Sequence[TimelineEvent]):
    """The events of one chip (without pid)."""
    for event in timeline:
        program, cost = event.program, event.cost
        instr = program.instructions[event.index]
        args = {
            "outputs": [printer.value_text(program, v) for v in instr.outs],
            "inputs": [f"%{v}" for v in instr.ins],
            "bytes": cost.bytes_accessed,
            "flops": cost.flops,
            "critical_us": cost.optimal_seconds * US,
        }
        if event.iteration:
            args["iteration"] = list(event.iteration)
        args.update({key: value for key, value in (
            ("scope", instr.scope), ("source", line_text(instr.loc)),
            ("via", line_text(instr.via))) if value})
        args.update({name: value.describe() for name, value in instr.params().items()
                     if isinstance(value, isa.Plan)})
        name = f"{instr.scope} {instr.mnemonic}" if instr.scope else instr.mnemonic
        yield {"ph": "X", "tid": THREADS.index(event.engine), "name": name,
               "cat": event.engine, "ts": event.start * US, "dur": event.seconds * US,
               "args": args}
        if event.hbm_seconds and event.engine not in (isa.DMA, ALL):
            yield {"ph": "X", "tid": THREADS.index(isa.DMA), "name": f"hbm {instr.mnemonic}",
                   "cat": isa.DMA, "ts": event.start * US, "dur": event.hbm_seconds * US,
                   "args": {"for": args["outputs"], "bytes": args["bytes"]}}
