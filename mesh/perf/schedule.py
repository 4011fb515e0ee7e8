"""One chip's timeline: instructions list-scheduled onto its engines.

Model:
- Each engine (Tensor, Vector, Scalar, GpSimd, DMA, Collective, HostLink) is one in-order queue per
  chip: the chip's eight NeuronCores work on one instruction together (its cost already
  spreads the work over them), and an engine runs one instruction at a time.
- HBM bandwidth is one more shared resource: a compute instruction's HBM traffic occupies
  the DMA queue from its start for its HBM time, while the instruction occupies its own
  engine for max(compute, HBM). So two memory-bound ops on different engines do not both
  get the full bandwidth.
- Collectives run on the collective cores, their own queue: they overlap compute (trn2
  facts: "communication overlaps compute without taking compute resources").
- Transfers between HBM and host memory (isa.HostTransfer) queue on the chip's PCIe link,
  their own queue: the link, not the DMA engines, limits them, and their HBM side occupies
  the DMA queue as a compute instruction's HBM traffic does (mesh.perf.cost).
- An instruction starts when its operands are ready and its queues are free. List
  scheduling: of the instructions whose producers are scheduled, the one that can start
  first goes next (ties in program order), so independent work fills idle engines.
- An instruction with sub-programs (a loop) runs alone: it waits for every queue and holds
  them all until it ends.
- Every chip runs the same program on the same local shapes, so one chip's timeline is
  every chip's.

The critical path is the chain of instructions that set each other's start times, back from
the one that ends last; each gets as its share of the step time the part of its run that
delays its successor on the chain. The shares add up to the step time.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Collection, Sequence

from mesh import isa

ENGINES = (isa.TENSOR, isa.VECTOR, isa.SCALAR, isa.GPSIMD, isa.DMA, isa.COLLECTIVE,
           isa.HOST_LINK)
ALL = "Control"  # the queue of an instruction that holds every engine (one with sub-programs)


@dataclass(frozen=True)
class Task:
    """What the scheduler needs of one instruction (seconds)."""

    engine: str  # one of ENGINES, isa.NONE (no queue) or ALL
    seconds: float  # time on its engine
    hbm_seconds: float = 0.0  # time on the DMA queue from its start (compute engines only)


@dataclass(frozen=True)
class Slot:
    """One scheduled instruction (seconds from the start of the step)."""

    index: int  # position in the program
    engine: str
    start: float
    seconds: float
    hbm_seconds: float
    critical_seconds: float  # its share of the step time (0 off the critical path)

    @property
    def end(self) -> float:
        return self.start + self.seconds


@dataclass(frozen=True)
class Schedule:
    """The timeline of one chip, slots in program order."""

    slots: tuple[Slot, ...]

    @property
    def step_seconds(self) -> float:
        return max((s.end for s in self.slots), default=0.0)

    def exposed_seconds(self, engine: str = isa.COLLECTIVE,
                        indices: Collection[int] | None = None) -> float:
        """Time `engine` is busy while no other engine is: its cost the rest cannot hide.
        Instructions holding every engine (loops) count as other engines' work here.
        `indices`: only these instructions' time on `engine` (one queue runs one
        instruction at a time, so the parts of a partition of its instructions add up)."""
        mine, others = [], []
        for queue, start, end, index in self._intervals():
            if queue != engine:
                others.append((start, end))
            elif indices is None or index in indices:
                mine.append((start, end))
        return _length(_union(mine)) - _overlap(_union(mine), _union(others))

    def _intervals(self):
        """(queue, start, end, instruction) of every queue occupancy."""
        for slot in self.slots:
            if slot.engine in ENGINES or slot.engine == ALL:
                yield slot.engine, slot.start, slot.end, slot.index
            if slot.hbm_seconds and slot.engine not in (isa.DMA, ALL):
                yield isa.DMA, slot.start, slot.start + slot.hbm_seconds, slot.index


def schedule(program: isa.Program, tasks: Sequence[Task]) -> Schedule:
    """List-schedule `program`'s instructions, `tasks[i]` describing instruction i."""
    instructions = program.instructions
    if len(tasks) != len(instructions):
        raise ValueError(f"{len(tasks)} tasks for {len(instructions)} instructions")
    producer = {v: i for i, instr in enumerate(instructions) for v in instr.outs}
    deps = [sorted({producer[v] for v in instr.ins if v in producer})
            for instr in instructions]
    users: list[list[int]] = [[] for _ in instructions]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    waiting = [len(ds) for ds in deps]

    # queue -> (time it frees up, the instruction that holds it until then)
    free: dict[str, tuple[float, int | None]] = {q: (0.0, None) for q in ENGINES}
    start: dict[int, float] = {}
    end: dict[int, float] = {}
    hbm_end: dict[int, float] = {}
    binding: dict[int, tuple[int, float] | None] = {}

    def earliest(i: int) -> tuple[float, tuple[int, float] | None]:
        """Earliest start of i and what sets it: (instruction, the time it lets i go)."""
        limits = [(end[d], d) for d in deps[i]]
        task = tasks[i]
        queues = ENGINES if task.engine == ALL else \
            (task.engine,) if task.engine in ENGINES else ()
        if task.hbm_seconds and task.engine not in (isa.DMA, ALL):
            queues += (isa.DMA,)
        limits += [(t, holder) for t, holder in (free[q] for q in queues) if holder is not None]
        if not limits:
            return 0.0, None
        t, holder = max(limits, key=lambda limit: limit[0])  # first maximum: operands first
        return t, (holder, t)

    heap = [(0.0, i) for i in range(len(instructions)) if not waiting[i]]
    heapq.heapify(heap)
    while heap:
        key, i = heapq.heappop(heap)
        t, why = earliest(i)
        if t > key:  # its queues filled up since it was queued: try again later
            heapq.heappush(heap, (t, i))
            continue
        task = tasks[i]
        start[i], end[i], binding[i] = t, t + task.seconds, why
        hbm_end[i] = t + task.hbm_seconds
        if task.engine == ALL:
            free.update({q: (end[i], i) for q in ENGINES})
        elif task.engine in ENGINES:
            free[task.engine] = (end[i], i)
        if task.hbm_seconds and task.engine not in (isa.DMA, ALL):
            free[isa.DMA] = (hbm_end[i], i)
        for u in users[i]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(heap, (earliest(u)[0], u))

    critical = _critical_path(start, end, binding)
    return Schedule(tuple(
        Slot(index=i, engine=tasks[i].engine, start=start[i], seconds=tasks[i].seconds,
             hbm_seconds=tasks[i].hbm_seconds, critical_seconds=critical.get(i, 0.0))
        for i in range(len(instructions))))


def _critical_path(start, end, binding) -> dict[int, float]:
    """Share of the step time of each instruction on the critical path."""
    if not end:
        return {}
    last = max(end, key=lambda i: (end[i], i))
    shares = {last: end[last] - start[last]}
    i = last
    while binding[i] is not None:
        j, released = binding[i]
        shares[j] = shares.get(j, 0.0) + released - start[j]
        i = j
    return shares


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def _length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two sorted disjoint interval lists."""
    total, j = 0.0, 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            total += max(0.0, min(e, b[k][1]) - max(s, b[k][0]))
            k += 1
    return total
