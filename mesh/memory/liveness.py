"""Which buffers one chip holds in HBM, and when: liveness of a Trn2 program's values.

Model (one chip; every chip of the mesh runs the same program on the same per-chip types,
so every chip of the mesh holds the same bytes):

- A value occupies its per-chip type's bytes. Replicated values count on every chip.
  Values the cost model keeps in SBUF (fused elementwise chains:
  mesh.fusion.on_chip_values) take no HBM, and one-element constants only such chains
  read are immediates. A chain is fused into the instruction that consumes it (XLA's
  fusion), which reads the chain's stored inputs when it runs: they are held until then,
  wherever the schedule puts the chain's own instructions (Adam's `b1 * m`, run early on an
  idle engine, frees no `m` before the add that consumes it).
- Global values of a shard_map or partitioned program (those outside the per-chip code)
  are stored in pieces, as jax stores a sharded jax.Array, when every use splits them the
  same way (a `Shard`, an output sharding) or they come from an `Unshard`; otherwise each
  chip holds the whole value.
- Some instructions write no new buffer: `Reshape` is a bitcast, and so is a
  `BroadcastInDim` that only adds dimensions of size 1 in order (a scan's
  `x[None]` before it is written into the stacked outputs), a slice that its readers'
  DMA reads in place (mesh.fusion.view_values: a scan's layer of stacked weights
  feeding a matmul), `Shard` of a value stored
  in those pieces and `Unshard` into them are views. `DynamicUpdateSlice`, a one-operand
  `Scatter` and a loop's carried state write in place into an operand whose buffer dies
  there (XLA's in-place buffer reuse), so a loop-carried value counts once; so does an
  elementwise op (with the chains fused into it) into a stored input of its size that it
  reads at the index it writes and that dies there. Dying there means every other reader
  has ended when the instruction starts; one buffer takes one result of an instruction (one
  value passed as two loop-state slots is two buffers).
- A broadcast of a constant that a loop only passes through unchanged (jax hoists such
  loop invariants, a scan's `jnp.where(mask, x, -1e9)` fill, out of the body) takes no
  HBM when every reader, in the loop and after it, is an elementwise op or reduction: XLA
  sinks it back into the body (its WhileLoopConstantSinking pass) and fuses it there.
- A buffer is allocated when its producer starts and freed when the last instruction
  reading it ends. Arguments are live from the start of the step (all at once, a donated
  one nothing reads too) and outputs to its end; an argument lives the whole step unless
  it is donated (jit's donate_argnums), in which case it is freed after its last use and
  an output can take its place.
- The step's outputs are buffers of their own (XLA's copy insertion): an output that is an
  argument not donated (or a view of one), or a value already returned at an earlier
  position, is copied into a new buffer that lives from when the value exists to the end.
  A loop body's or branch's results are not copied: the enclosing program holds them.
- Where instructions of the schedule end and start at the same instant, the buffers freed
  by the ones ending are released before the next ones allocate (a chain a -> b -> c never
  holds a and c together), except that an instruction's own inputs and outputs always
  overlap.
- A loop, scan, conditional or composite adds, while it runs, what its body needs beyond
  what the enclosing program counts: the peak of the body (run in program order) less its
  inputs live at that peak (the loop's state, a scan's slices of its inputs at the step,
  captured values) and the results the enclosing program holds: a conditional's or a
  composite's results, a scan's per-step outputs (written into its stacked outputs). A
  scan's carries, like a while loop's state, are written in place, so they count once.
  A composite the chip runs as a fused kernel (flash attention: mesh.perf.attention) keeps
  its intermediates in SBUF and adds nothing.

- Buffers in host memory take no HBM: main's arguments and results whose memory kind is
  pinned_host or unpinned_host (isa.Program.input_memory_kinds), and what an offload
  (isa.HostTransfer into host memory) writes, with its views. They are kept apart
  (Liveness.host_lifetimes), live as HBM buffers would be, for jax's host_* figures. What
  a loop body offloads is not counted in host memory.

Not modelled: fragmentation and alignment padding, the runtime's own reservations, the
instruction streams, collective staging buffers (collectives are assumed to work in place
on their operand and result), and SBUF/PSUM (on-chip, not HBM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from mesh import isa, sharding
from mesh.isa import control
from mesh.fused_kernels import is_fused_kernel
from mesh.fusion import (STREAMING_CONSUMERS, STREAMING_PRODUCERS, adds_unit_dims,
                         on_chip_values, readers_of, view_values)

ARGUMENT = "argument"
OUTPUT = "output"
TEMPORARY = "temporary"
INSIDE = "inside"  # what a loop or conditional needs while it runs, beyond its operands

# Event phases at one instant: frees by instructions that took time, then allocations, then
# frees by instructions that take no time (after their own outputs exist).
_FREE, _ALLOCATE, _FREE_AFTER = 0, 1, 2
_BEFORE_STEP = (float("-inf"), _ALLOCATE)
_ARGUMENTS_HELD = (float("-inf"), _FREE_AFTER)  # every argument is in HBM when the step starts
_AFTER_STEP = (float("inf"), _FREE)


@dataclass(frozen=True)
class Buffer:
    """One allocation on a chip: the values stored in it (aliases share one buffer)."""

    values: tuple[int, ...]  # the first allocated it; later ones are views or in-place results
    type: isa.TensorType | None  # per-chip type stored (a piece of a global value); None INSIDE
    nbytes: int  # per chip
    kind: str  # ARGUMENT, OUTPUT, TEMPORARY, or INSIDE a loop or conditional
    loc: str  # user's source line of the producer ("" for arguments)
    what: str  # `argument 0`, the producing instruction's mnemonic, `while body`...
    donated: bool = False  # an argument the caller donated
    inner: tuple["Buffer", ...] = ()  # INSIDE: the body's buffers live at its peak
    in_host: bool = False  # held in host memory (an offloaded value), not in HBM


@dataclass(frozen=True)
class Lifetime:
    """A buffer and the instants it is allocated and freed: (seconds, phase) keys."""

    buffer: Buffer
    nbytes: int
    allocated: tuple[float, int]
    freed: tuple[float, int]


@dataclass(frozen=True)
class PeakSplit:
    """What holds one chip's peak: the bytes live at its instant by role; they sum to the
    peak. Temporaries are the step's intermediates (activations kept for the backward
    pass, gradients before they are written out, a loop's working set)."""

    donated_arguments: int = 0  # state the step updates in place (jit's donate_argnums)
    other_arguments: int = 0  # arguments held the whole step (inputs, weights only read)
    outputs: int = 0  # results already written (into donated buffers, or their own)
    temporaries: int = 0

    @property
    def total(self) -> int:
        return self.donated_arguments + self.other_arguments + self.outputs + self.temporaries

    @classmethod
    def of(cls, buffers: Iterable[Buffer]) -> "PeakSplit":
        """The split of these buffers (those live at a peak)."""
        parts = dict.fromkeys(("donated_arguments", "other_arguments", "outputs",
                               "temporaries"), 0)
        for b in buffers:
            role = ("donated_arguments" if b.donated else "other_arguments") \
                if b.kind == ARGUMENT else "outputs" if b.kind == OUTPUT else "temporaries"
            parts[role] += b.nbytes
        return cls(**parts)


@dataclass(frozen=True)
class Liveness:
    """The buffers of one chip over one run of a program, and the peak."""

    lifetimes: tuple[Lifetime, ...]
    peak_bytes: int
    peak_seconds: float  # when the peak is first reached
    live_at_peak: tuple[Buffer, ...]  # largest first
    samples: tuple[tuple[float, int], ...] = field(repr=False)  # (seconds, bytes live)
    input_types: tuple[isa.TensorType, ...] = ()  # per-chip stored type of each input
    output_types: tuple[isa.TensorType, ...] = ()  # and of each output
    host_lifetimes: tuple[Lifetime, ...] = ()  # buffers in host memory (not in the peak)

    @property
    def peak_split(self) -> PeakSplit:
        """The peak by what holds it (PeakSplit.total == peak_bytes)."""
        return PeakSplit.of(self.live_at_peak)

    def bytes_of(self, kind: str) -> int:
        return sum(l.nbytes for l in self.lifetimes if l.buffer.kind == kind)

    def peak_of(self, kinds: Sequence[str]) -> int:
        """The most bytes buffers of these kinds hold at once in HBM."""
        return _sweep([l for l in self.lifetimes if l.buffer.kind in kinds])[0]

    def host_peak_of(self, kinds: Sequence[str]) -> int:
        """The most bytes buffers of these kinds hold at once in host memory."""
        return _sweep([l for l in self.host_lifetimes if l.buffer.kind in kinds])[0]


def sequential_times(program: isa.Program) -> list[tuple[float, float]]:
    """(start, end) of each instruction run one after another, one time unit each."""
    return [(float(i), float(i + 1)) for i in range(len(program.instructions))]


def liveness(program: isa.Program, times: Sequence[tuple[float, float]] | None = None,
             input_names: Sequence[str] | None = None, *,
             carried: Iterable[tuple[int, int]] = (), entry: bool = True) -> Liveness:
    """The buffers of one chip running `program`, instruction i from times[i][0] to
    times[i][1] (seconds of a schedule; program order when None).

    Donated inputs (`program.donated_inputs`) are freed after their last use. For a loop
    body, `carried` pairs the (input, output) positions of the loop's state: the input is
    freed after its last use too (the body may overwrite it), and the output is stored in
    its buffer, the loop's state, when the input is dead by the time the output is made (as
    XLA's while loops share it). `entry`: the step's own program, whose outputs are copied
    where they would share a buffer (False for a region's program)."""
    times = list(times) if times is not None else sequential_times(program)
    if len(times) != len(program.instructions):
        raise ValueError(f"{len(times)} times for {len(program.instructions)} instructions")
    names = list(input_names) if input_names is not None else \
        [f"argument {i}" for i in range(len(program.inputs))]
    return _Builder(program, times, names, carried, entry).run()


class _Builder:
    """One liveness computation: where each value is stored, then when each buffer lives."""

    def __init__(self, program: isa.Program, times, names,
                 carried: Iterable[tuple[int, int]], entry: bool):
        self.program = program
        self.entry = entry
        self.times = times
        self.names = names
        carried = list(carried)
        self.donated = {program.inputs[i] for i, _ in [*program.donated_inputs, *carried]}
        # a carried output -> the input whose buffer (the loop's state) it is written into
        self.aliases = {program.outputs[k]: program.inputs[i] for i, k in carried}
        self.piece_types = self._piece_types()
        self.on_chip = on_chip_values(program) | _sunk_constants(program) | \
            _immediate_constants(program)
        self.reads, self.aligned_reads = _stored_reads(program, self.on_chip)
        self.users: dict[int, list[int]] = {}  # stored value -> the instructions reading it
        for i, values in enumerate(self.reads):
            for v in values:
                self.users.setdefault(v, []).append(i)
        self.root: dict[int, int] = {}  # value -> the value whose buffer it is stored in
        self.pinned: set[int] = set()  # buffers live the whole step (see _pin)
        self.in_host: set[int] = set()  # buffers in host memory (see _host_buffers)

    # --- where each value is stored ----------------------------------------------------

    def _piece_types(self) -> dict[int, isa.TensorType]:
        """Per-chip piece type of each global value stored in pieces (see module doc)."""
        program, mesh = self.program, self.program.mesh
        if not mesh.rank:
            return {}
        wanted: dict[int, set] = {}  # value -> the dim_axes each use or producer stores it by

        def want(value: int, dim_axes) -> None:
            if not program.values[value].varying:
                wanted.setdefault(value, set()).add(tuple(dim_axes) if dim_axes else None)

        for v, dims in zip(program.inputs, program.input_shardings):
            if dims is not None:
                want(v, dims)
        for v, dims in zip(program.outputs, program.output_shardings):
            if dims is not None:
                want(v, dims)
        for instr in program.instructions:
            if isinstance(instr, isa.Shard):
                want(instr.ins[0], instr.dim_axes)
            elif isinstance(instr, isa.Unshard):
                want(instr.outs[0], instr.dim_axes)
            else:
                for v in instr.ins:
                    if v in program.values:
                        want(v, None)  # read whole by ordinary instructions
        pieces = {}
        for value, choices in wanted.items():
            if len(choices) == 1 and None not in choices:
                (dims,) = choices
                global_ = program.values[value].type
                pieces[value] = isa.TensorType(
                    sharding.local_shape(global_.shape, dims, mesh.axis_sizes), global_.dtype)
        return pieces

    def stored_type(self, value: int) -> isa.TensorType:
        return self.piece_types.get(value, self.program.values[value].type)

    def find(self, value: int) -> int:
        while self.root.get(value, value) != value:
            value = self.root[value]
        return value

    def _views(self) -> None:
        """Values that are views of another value's buffer, whatever the timing."""
        read_in_place = view_values(self.program)
        for instr in self.program.instructions:
            if isinstance(instr, isa.Reshape) or \
                    (instr.ins and instr.ins[0] not in self.on_chip and
                     adds_unit_dims(instr, self.program)) or (
                    isinstance(instr, (isa.Slice, isa.DynamicSlice)) and
                    instr.outs[0] in read_in_place) or (
                    isinstance(instr, (isa.Shard, isa.Unshard)) and
                    self.stored_type(instr.ins[0]).nbytes == self.stored_type(instr.outs[0]).nbytes):
                self.root[instr.outs[0]] = self.find(instr.ins[0])
            for out, operand in _passed_through(instr):
                self.root[out] = self.find(operand)

    def _in_place(self, order: list[int]) -> None:
        """Results written into an operand's buffer that dies at the instruction, and a
        loop body's new state into its old state's buffer when that is dead by then: every
        other instruction reading that buffer comes before and has ended when the
        instruction starts (a reader still running would read what it overwrites)."""
        position = {i: p for p, i in enumerate(order)}
        members: dict[int, list[int]] = {}
        for v in self.program.values:
            members.setdefault(self.find(v), []).append(v)
        for i in order:
            instr = self.program.instructions[i]
            writes = [(out, operand, {i})  # the instruction reads what it overwrites
                      for out, operand in _in_place_pairs(instr, self.aligned_reads[i])]
            writes += [(out, self.aliases[out], set()) for out in instr.outs
                       if out in self.aliases]
            for out, operand, writer in writes:
                root = self.find(operand)
                if self.find(out) != out or root in self.pinned or \
                        root in self.on_chip or out in self.on_chip or \
                        self.stored_type(operand).nbytes != self.stored_type(out).nbytes or \
                        any(self.find(o) == root for o in instr.outs if o != out):
                    continue  # (the last: one operand in two loop-state slots is two buffers)
                others = {u for m in members[root] for u in self.users.get(m, ())} - writer
                if out != root and all(position[u] < position[i] and
                                       self.times[u][1] <= self.times[i][0] for u in others):
                    self.root[out] = root
                    members[root] += members.pop(out, [out])
                    if out in self.pinned:  # an output now stored there: nothing overwrites it
                        self.pinned.add(root)

    # --- the run -------------------------------------------------------------------------

    def run(self) -> Liveness:
        program = self.program
        self._views()
        order = sorted(range(len(program.instructions)), key=lambda i: (self.times[i][0], i))
        self._pin()
        self._in_place(order)
        self._pin()
        self._host_buffers()
        members: dict[int, list[int]] = {}
        for v in program.values:
            members.setdefault(self.find(v), []).append(v)

        allocated: dict[int, tuple[float, int]] = {}
        freed: dict[int, tuple[float, int]] = {}
        producer: dict[int, int] = {}
        for v in program.inputs:
            allocated[self.find(v)] = _BEFORE_STEP
        for i, instr in enumerate(program.instructions):
            start, end = self.times[i]
            free_phase = _FREE if end > start else _FREE_AFTER
            for v in instr.outs:
                root = self.find(v)
                producer.setdefault(root, i)
                key = (start, _ALLOCATE)
                allocated[root] = min(allocated.get(root, key), key)
                freed[root] = max(freed.get(root, key), (end, free_phase))
            for v in self.reads[i]:
                root = self.find(v)
                freed[root] = max(freed.get(root, (end, free_phase)), (end, free_phase))
        for root in self.pinned:
            freed[root] = _AFTER_STEP
        for v in program.inputs:  # a donated argument nothing reads is released once the
            freed.setdefault(self.find(v), _ARGUMENTS_HELD)  # step holds all arguments

        lifetimes = []
        for root, start in allocated.items():
            if root in self.on_chip:
                continue
            buffer = self._buffer(root, members[root], producer.get(root))
            lifetimes.append(Lifetime(buffer, buffer.nbytes, start, freed[root]))
        if self.entry:
            lifetimes += self._output_copies(allocated)
        for i, instr in enumerate(program.instructions):
            inside = self._inside(instr)
            if inside is not None:
                start, end = self.times[i]
                lifetimes.append(Lifetime(inside, inside.nbytes, (start, _ALLOCATE),
                                          (end, _FREE if end > start else _FREE_AFTER)))
        on_host = [l for l in lifetimes if l.buffer.in_host]
        lifetimes = [l for l in lifetimes if not l.buffer.in_host]
        peak, when, samples = _sweep(lifetimes)
        return Liveness(tuple(lifetimes), peak, when[0] if lifetimes else 0.0,
                        _live_at(lifetimes, when),
                        samples, tuple(self.stored_type(v) for v in program.inputs),
                        tuple(self.stored_type(v) for v in program.outputs), tuple(on_host))

    def _host_buffers(self) -> None:
        """Buffers in host memory: main's arguments and results there (jax's pinned_host
        and unpinned_host memory kinds) and what an offload writes."""
        program = self.program
        offloaded = [v for instr in program.instructions
                     if isinstance(instr, isa.HostTransfer) and instr.to_host for v in instr.outs]
        self.in_host = {self.find(v) for v in
                        (*program.host_inputs(), *program.host_outputs(), *offloaded)}

    def _output_copies(self, allocated: dict[int, tuple[float, int]]) -> list[Lifetime]:
        """The copies XLA makes so that every output of the step has its own buffer: of an
        output stored in an argument not donated, and of a buffer returned a second time."""
        program, copies, returned = self.program, [], set()
        for v in program.outputs:
            root = self.find(v)
            kept_argument = root in program.inputs and root not in self.donated
            if (kept_argument or root in returned) and root not in self.on_chip:
                stored = self.stored_type(v)
                buffer = Buffer((v,), stored, stored.nbytes, OUTPUT, "", "copy of a returned value",
                                in_host=root in self.in_host)
                copies.append(Lifetime(buffer, stored.nbytes, allocated[root], _AFTER_STEP))
            returned.add(root)
        return copies

    def _pin(self) -> None:
        """Buffers that live the whole step: outputs and arguments not donated."""
        program = self.program
        self.pinned = {self.find(v) for v in program.outputs} | \
            {self.find(v) for v in program.inputs if v not in self.donated}

    def _buffer(self, root: int, members: list[int], producer: int | None) -> Buffer:
        program = self.program
        values = tuple(sorted(members, key=lambda v: v != root))
        if root in program.inputs:
            position = program.inputs.index(root)
            kind, loc, what = ARGUMENT, "", self.names[position]
        else:
            instr = program.instructions[producer]
            kind = OUTPUT if any(self.find(v) == root for v in program.outputs) else TEMPORARY
            loc, what = instr.loc, instr.mnemonic
        stored = self.stored_type(root)
        return Buffer(values, stored, stored.nbytes, kind, loc, what,
                      donated=root in self.donated, in_host=root in self.in_host)

    def _inside(self, instr: isa.Instruction) -> Buffer | None:
        """What a loop, scan, conditional or composite needs while it runs beyond its
        operands and results: a pseudo-buffer of that many bytes, for its costliest region.
        The enclosing program holds those operands and results while the instruction runs,
        so a region needs the most its other buffers hold at once, which need not be at its
        own peak (a loop body's state may die early)."""
        regions = _regions_held(instr)
        if not regions:
            return None
        best, label, inner = 0, regions[0][0], ()
        for name, region, counted in regions:
            beyond = [l for l in region.lifetimes if not set(l.buffer.values) & counted]
            extra, when, _ = _sweep(beyond)
            if extra > best:
                best, label, inner = extra, name, _live_at(beyond, when)
        loc = next((b.loc for b in inner if b.loc), instr.loc)
        return Buffer((), None, best, INSIDE, loc, label, inner=inner)


def _regions_held(instr: isa.Instruction) -> list[tuple[str, Liveness, set[int]]]:
    """(label, liveness, values the enclosing program already holds) of each region of a
    control-flow instruction; [] for any other instruction. A while loop's new state is a
    buffer of the body unless written in place (its old state is the loop's operand); a
    scan's per-step outputs go into its stacked outputs, but a carry is its own buffer even
    where it is also a per-step output."""
    if isinstance(instr, control.While):
        state = [(k, k) for k in range(len(instr.outs))]
        return [("while cond", liveness(instr.cond, entry=False), set(instr.cond.inputs)),
                ("while body", liveness(instr.body, carried=state, entry=False),
                 set(instr.body.inputs))]
    if isinstance(instr, control.Scan):
        body, outputs = instr.body, len(instr.outs) - instr.num_carries
        carries = [(instr.num_inputs + j, outputs + j) for j in range(instr.num_carries)]
        stacked = set(body.outputs[:outputs]) - set(body.outputs[outputs:])
        return [("scan body", liveness(body, carried=carries, entry=False),
                 set(body.inputs) | stacked)]
    if isinstance(instr, control.Case):
        return [(f"case branch {k}", liveness(b, entry=False), set(b.inputs) | set(b.outputs))
                for k, b in enumerate(instr.branches)]
    if isinstance(instr, control.Composite) and not is_fused_kernel(instr):
        sub = instr.decomposition
        return [(f"{instr.name} decomposition", liveness(sub, entry=False), set(sub.inputs) | set(sub.outputs))]
    return []


def _immediate_constants(program: isa.Program) -> set[int]:
    """One-element constants read only by streaming consumers: the fused kernel takes them
    as immediates (XLA fuses a scalar constant into its consumers), never from HBM."""
    readers = readers_of(program)
    return {v for instr in program.instructions if isinstance(instr, isa.Constant)
            for v in instr.outs if program.values[v].type.size == 1 and v in readers
            and all(isinstance(r, STREAMING_CONSUMERS) for r in readers[v])}


def _sunk_constants(program: isa.Program) -> set[int]:
    """Broadcasts of constants read only by fusing instructions and by loops that pass them
    through unchanged, and those loops' copies of them: values XLA never stores (see the
    module doc)."""
    producers = {v: instr for instr in program.instructions for v in instr.outs}
    readers = _Readers()
    sunk = set()
    for instr in program.instructions:
        if isinstance(instr, isa.BroadcastInDim) and \
                isinstance(producers.get(instr.ins[0]), isa.Constant):
            copies = _fused_everywhere(program, instr.outs[0], readers)
            if copies is not None:
                sunk |= copies
    return sunk


class _Readers:
    """The instructions that read each value, per program, found once per program."""

    def __init__(self):
        self._by_program: dict[int, dict[int, list[isa.Instruction]]] = {}

    def __call__(self, program: isa.Program, value: int) -> list[isa.Instruction]:
        table = self._by_program.get(id(program))
        if table is None:
            table = self._by_program[id(program)] = {}
            for instr in program.instructions:
                for v in dict.fromkeys(instr.ins):
                    table.setdefault(v, []).append(instr)
        return table.get(value, [])


def _fused_everywhere(program: isa.Program, value: int, readers: _Readers,
                      yielded: bool = False) -> set[int] | None:
    """`value` and the results of the loops that carry it unchanged, when every reader of
    them (inside those loops too) fuses it; None when some reader needs it stored.
    `yielded`: a loop body's input it yields unchanged (its own output is no reader)."""
    if value in program.outputs and not yielded:
        return None
    found = {value}
    for instr in readers(program, value):
        if isinstance(instr, STREAMING_CONSUMERS):
            continue
        if not isinstance(instr, control.While):
            return None
        for k, operand in enumerate(instr.ins):
            if operand != value:
                continue
            state = k < len(instr.outs)
            if state and instr.body.outputs[k] != instr.body.inputs[k]:
                return None  # the loop changes it: its state needs a buffer
            inner = [_fused_everywhere(instr.cond, instr.cond.inputs[k], readers),
                     _fused_everywhere(instr.body, instr.body.inputs[k], readers, yielded=state),
                     _fused_everywhere(program, instr.outs[k], readers) if state else set()]
            if any(part is None for part in inner):
                return None
            found |= inner[2]
    return found


def _passed_through(instr: isa.Instruction):
    """(result, operand) pairs of a while loop's state that its body yields unchanged (a
    scan's stacked inputs, which jax carries through the loop): read-only loop state, which
    XLA keeps in the operand's buffer, never copied."""
    if isinstance(instr, control.While):
        body = instr.body
        yield from ((out, operand) for k, (out, operand) in enumerate(zip(instr.outs, instr.ins))
                    if body.outputs[k] == body.inputs[k])


def _stored_reads(program: isa.Program, on_chip: set[int]) -> tuple[list[tuple[int, ...]],
                                                                    list[tuple[int, ...]]]:
    """The stored values each instruction reads from HBM, and those of them it reads at
    the index of the element it writes (which it may overwrite in place).

    A value kept in SBUF (a fused elementwise chain's) is read from nowhere: the instruction
    that consumes the chain reads the chain's stored inputs when it runs, as XLA's fusion
    does, so they are held until then wherever the schedule puts the chain's own
    instructions; those read nothing themselves."""
    chains: dict[int, tuple[dict, dict]] = {}  # SBUF value -> its chain's (reads, aligned)
    reads, aligned_reads = [], []
    for instr in program.instructions:
        every, aligned = {}, {}  # dicts as ordered sets
        for v in instr.ins:
            if v in chains:
                every.update(chains[v][0])
                aligned.update(chains[v][1])
            elif v not in on_chip:
                every[v] = aligned[v] = None
        if not isinstance(instr, (isa.Elementwise, isa.ReducePrecision)):
            aligned = {}  # a broadcast or reduction reads elements at other indices
        if instr.outs and isinstance(instr, STREAMING_PRODUCERS) and \
                all(v in on_chip for v in instr.outs):
            chains.update((v, (every, aligned)) for v in instr.outs)
            every, aligned = {}, {}
        reads.append(tuple(every))
        aligned_reads.append(tuple(aligned))
    return reads, aligned_reads


def _in_place_pairs(instr: isa.Instruction, aligned_reads: Sequence[int]):
    """(result, operand) pairs of an instruction that may write its result in place;
    `aligned_reads`: the stored values it reads at the index it writes (_stored_reads)."""
    if isinstance(instr, (isa.Elementwise, isa.ReducePrecision)):
        yield from ((instr.outs[0], operand) for operand in aligned_reads)
    elif isinstance(instr, isa.DynamicUpdateSlice):
        yield instr.outs[0], instr.ins[0]
    elif isinstance(instr, isa.Scatter) and len(instr.outs) == 1:
        yield instr.outs[0], instr.ins[0]
    elif isinstance(instr, control.While):
        yield from zip(instr.outs, instr.ins)
    elif isinstance(instr, control.Scan):  # final carries into the initial ones
        outputs = len(instr.outs) - instr.num_carries
        yield from zip(instr.outs[outputs:], instr.ins[instr.num_inputs:])


def _live_at(lifetimes: Sequence[Lifetime], when: tuple[float, int]) -> tuple[Buffer, ...]:
    """The buffers live at the (time, phase) `when`, largest first."""
    live = [l.buffer for l in lifetimes if l.nbytes and l.allocated <= when < l.freed]
    return tuple(sorted(live, key=lambda b: -b.nbytes))


def _sweep(lifetimes: Sequence[Lifetime]):
    """(peak bytes, the (time, phase) it is first reached, samples (seconds, bytes) with the
    most bytes at each instant)."""
    events = []
    for l in lifetimes:
        if l.nbytes and l.allocated < l.freed:
            events.append((l.allocated, l.nbytes))
            events.append((l.freed, -l.nbytes))
    events.sort(key=lambda e: e[0])
    total, peak, when = 0, 0, _BEFORE_STEP
    samples: list[tuple[float, int]] = []
    k = 0
    while k < len(events):
        key = events[k][0]
        while k < len(events) and events[k][0] == key:
            total += events[k][1]
            k += 1
        if total > peak:
            peak, when = total, key
        seconds = key[0] if key[0] not in (float("inf"), float("-inf")) else None
        if seconds is not None:  # the most bytes at each instant
            if samples and samples[-1][0] == seconds:
                samples[-1] = (seconds, max(samples[-1][1], total))
            else:
                samples.append((seconds, total))
    return peak, when, tuple(samples)
