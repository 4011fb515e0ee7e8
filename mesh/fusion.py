"""What the chip keeps out of HBM: values that stream through SBUF and values that are views.

- Elementwise chains are fused: a value made by an elementwise op, broadcast or iota and
  read only by such ops or reductions streams through SBUF tile by tile and never goes to
  HBM (`on_chip_values`).
- Data movement the reader's DMA does as it reads (a slice, a bitcast) makes no buffer of
  its own: the value is an access pattern over its operand's buffer (`view_values`).

The cost model (mesh.perf.cost) charges no HBM traffic for either, and mesh.memory stores
neither in a buffer of its own.
"""

from __future__ import annotations

import functools

from mesh import isa


# Ops that produce their result element by element, and ops that can consume such a stream
# straight from SBUF.
STREAMING_PRODUCERS = (isa.Elementwise, isa.BroadcastInDim, isa.Iota)
STREAMING_CONSUMERS = STREAMING_PRODUCERS + (isa.Reduce,)


@functools.lru_cache(maxsize=64)
def on_chip_values(program: isa.Program) -> frozenset[int]:
    """Values of `program` that stay in SBUF (fused elementwise chains): made by a
    streaming producer, read only by streaming consumers, and not a program output."""
    consumers: dict[int, list[isa.Instruction]] = {}
    for instr in program.instructions:
        for v in instr.ins:
            consumers.setdefault(v, []).append(instr)
    outputs = set(program.outputs)
    return frozenset(
        v for instr in program.instructions if isinstance(instr, STREAMING_PRODUCERS)
        for v in instr.outs
        if v not in outputs and v in consumers
        and all(isinstance(c, STREAMING_CONSUMERS) for c in consumers[v]))


# Data movement the reader's DMA does as it reads: a slice (static, or at a start the DMA
# descriptor takes at run time) or a bitcast (a reshape; a broadcast adding only dimensions
# of size 1, elements in order). Such a value is an access pattern over its operand's
# buffer, never written to HBM, when every reader reads it through DMA.
VIEW_PRODUCERS = (isa.Slice, isa.DynamicSlice, isa.Reshape, isa.BroadcastInDim)


def adds_unit_dims(instr: isa.Instruction, program: isa.Program) -> bool:
    """A BroadcastInDim that keeps its operand's elements in order, adding only dimensions
    of size 1 (a scan's `x[None]` before it is written into the stacked outputs): a
    bitcast."""
    return isinstance(instr, isa.BroadcastInDim) and \
        list(instr.dimensions) == sorted(instr.dimensions) and \
        program.values[instr.ins[0]].type.size == program.values[instr.outs[0]].type.size


def _reads_in_place(instr: isa.Instruction, operand: int) -> bool:
    """Whether `instr` reads `operand` through DMA at whatever address it has: not as the
    buffer it writes in place (a dynamic-update-slice's or scatter's operand), not as a loop
    or conditional's operand (their sub-programs take whole buffers), not on the host."""
    if isinstance(instr, (isa.DynamicUpdateSlice, isa.Scatter)) and instr.ins[0] == operand:
        return False
    return not isinstance(instr, isa.HostCallback) and not isa.subprogram_fields(instr)


@functools.lru_cache(maxsize=64)
def readers_of(program: isa.Program) -> dict[int, list[isa.Instruction]]:
    """The instructions that read each value of `program`, in program order."""
    readers: dict[int, list[isa.Instruction]] = {}
    for instr in program.instructions:
        for v in dict.fromkeys(instr.ins):
            readers.setdefault(v, []).append(instr)
    return readers


@functools.lru_cache(maxsize=64)
def producers_of(program: isa.Program) -> dict[int, isa.Instruction]:
    """The instruction that makes each value of `program` (inputs have none)."""
    return {v: instr for instr in program.instructions for v in instr.outs}


@functools.lru_cache(maxsize=64)
def view_values(program: isa.Program) -> frozenset[int]:
    """Values of `program` that are access patterns over another value's buffer (see
    VIEW_PRODUCERS): bitcasts of stored values always; slices when everything that reads
    them reads through DMA and they are not program outputs. mesh.memory stores them in
    their operand's buffer."""
    readers = readers_of(program)
    on_chip, outputs = on_chip_values(program), set(program.outputs)
    read_by_dma: dict[int, bool] = {}  # of bitcast results: only DMA reads them

    def only_dma_reads(value: int) -> bool:
        if value in outputs:
            return False
        for r in readers.get(value, ()):
            if is_bitcast(r, program) and r.ins[0] == value:
                if not read_by_dma.get(r.outs[0], False):
                    return False
            elif not (isinstance(r, (isa.Slice, isa.DynamicSlice)) and r.ins[0] == value) \
                    and not _reads_in_place(r, value):
                return False
        return True

    views: set[int] = set()
    for instr in reversed(program.instructions):  # readers before the values they read
        if not isinstance(instr, VIEW_PRODUCERS) or instr.ins[0] in on_chip:
            continue
        (out,) = instr.outs
        if is_bitcast(instr, program):
            views.add(out)
            read_by_dma[out] = only_dma_reads(out)
        elif isinstance(instr, (isa.Slice, isa.DynamicSlice)) and only_dma_reads(out):
            views.add(out)
    return frozenset(views)


def is_bitcast(instr: isa.Instruction, program: isa.Program) -> bool:
    """Whether `instr` only reinterprets its operand's buffer: a reshape, or a broadcast
    adding only dimensions of size 1."""
    return isinstance(instr, isa.Reshape) or adds_unit_dims(instr, program)

