"""What one instruction costs one chip: FLOPs, HBM bytes, and time on each engine.

A `Cost` is a value that adds (`a + b`, `k * a`, `sum(costs)`), like JAX's RooflineResult,
so a program's cost is the sum of its instructions'. Costs are per chip: every chip runs
the same program on its own (local) shapes.

Model, per instruction class (numbers from ChipSpec, i.e. mesh/machine/trn2_facts.md):
- Matmul and Convolution (Tensor Engine): mesh.perf.tensor_engine's tiling: cycles of the PE
  arrays of all NeuronCores, HBM bytes, max of the two.
- Vector / Scalar / GpSimd ops: each NeuronCore's engine processes one element per
  partition (sbuf_partitions lanes) per cycle of its clock; the chip's elements are spread
  over its neuron_cores. The op streams its operands from HBM and its result back
  (max(compute, HBM) when DMA is double-buffered against the engine).
- DMA ops (copies, slices, transposes, gathers): bytes read plus bytes written, at the HBM
  bandwidth.
- Collectives: the collective plan's alpha-beta time on the collective cores (which do not
  use the compute engines); HBM bytes are the operand read and the result written.
- Host transfers (offloads to and reloads from host memory): bytes over the chip's PCIe
  link at host_link_bandwidth, on a queue of their own (the link); HBM bytes are the side
  in HBM.
- Constants (in HBM when the program is loaded), reshapes and Shard/Unshard (views of data
  each chip already holds) cost nothing.
- Elementwise chains are fused: a value made by an elementwise op, broadcast or iota and
  read only by such ops or reductions streams through SBUF tile by tile and never goes to
  HBM; a broadcast read that way is an access pattern over its operand and takes no engine
  time, and so does a convert read that way (the engines convert on read, computing in FP32:
  `jnp.sum` of BF16 converts to FP32 into the reduce at no extra pass). Every other value
  is written to HBM and read back by each consumer (mesh.fusion says which values are
  which).

`flops` counts 2*M*N*K per dot and one per element of other arithmetic; `transcendentals`
one per element of exp, log, tanh...; `bytes_accessed` is HBM traffic (JAX's keys).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field, fields
from typing import Callable, Mapping

from mesh import isa
from mesh.fused_kernels import FUSED_KERNELS, is_fused_kernel
from mesh.fusion import is_bitcast, on_chip_values, producers_of, readers_of, view_values
from mesh.machine.chip import PERFORMANCE_MODE_DTYPES, ChipSpec
from mesh.machine.runtime import IDEAL_RUNTIME, RuntimeSpec
from mesh.perf import tensor_engine


@dataclass(frozen=True)
class Cost:
    """Cost of an instruction (or a sum of them) on one chip. Seconds are estimates.

    `seconds` is how long the instruction takes from start to end (summed: the time if
    nothing overlapped); `engine_seconds` how long it occupies each engine queue (its HBM
    traffic occupies the DMA queue); `optimal_seconds` its share of the scheduled step time
    (its time on the critical path; set by the schedule); `peak_seconds` the time its FLOPs
    would take at the chip's published peak for their dtype (for MFU); `recomputed_*` the
    part of `flops` and `peak_seconds` that recomputes values jax.checkpoint did not keep.
    """

    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0
    seconds: float = 0.0
    engine_seconds: Mapping[str, float] = field(default_factory=dict)
    optimal_seconds: float = 0.0
    peak_seconds: float = 0.0
    recomputed_flops: float = 0.0
    recomputed_peak_seconds: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        engines = dict(self.engine_seconds)
        for engine, seconds in other.engine_seconds.items():
            engines[engine] = engines.get(engine, 0.0) + seconds
        return Cost(**{f: getattr(self, f) + getattr(other, f) for f in _SCALARS},
                    engine_seconds=engines)

    def __radd__(self, other) -> Cost:  # sum() starts from 0
        return self if other == 0 else self.__add__(other)

    def __mul__(self, k: float) -> Cost:
        return Cost(**{f: getattr(self, f) * k for f in _SCALARS},
                    engine_seconds={e: s * k for e, s in self.engine_seconds.items()})

    __rmul__ = __mul__

    def jax_dict(self) -> dict[str, float]:
        """The keys of jax's `Compiled.cost_analysis()`."""
        return {"flops": self.flops, "bytes accessed": self.bytes_accessed,
                "transcendentals": self.transcendentals, "optimal_seconds": self.optimal_seconds}


_SCALARS = tuple(f.name for f in fields(Cost) if f.name != "engine_seconds")


@dataclass(frozen=True)
class CostContext:
    """What a cost rule may look at: the program (for value types), the chip and the
    runtime costs in effect (RuntimeSpec.ideal() for the ideal estimate)."""

    program: isa.Program
    chip: ChipSpec
    runtime: RuntimeSpec = IDEAL_RUNTIME

    def hbm_seconds(self, nbytes: float) -> float:
        """Time to stream `nbytes` between HBM and the chip's SBUF (at the DMA's sustained
        rate in the expected estimate)."""
        return nbytes / (self.chip.hbm_bandwidth * self.runtime.hbm_efficiency)

    def dma_latency(self, nbytes: float) -> float:
        """The fixed cost of the DMA an instruction moving `nbytes` of HBM waits for."""
        return self.runtime.dma_fixed_seconds if nbytes else 0.0

    @functools.cached_property
    def on_chip(self) -> frozenset[int]:
        return on_chip_values(self.program)

    @functools.cached_property
    def views(self) -> frozenset[int]:
        return view_values(self.program)

    def type(self, value: int) -> isa.TensorType:
        return self.program.values[value].type

    def nbytes(self, values) -> int:
        return sum(self.type(v).nbytes for v in values)

    def hbm_bytes(self, values) -> int:
        """Bytes of `values` that move through HBM (those not kept in SBUF)."""
        return sum(self.type(v).nbytes for v in values if v not in self.on_chip)

    def size(self, values) -> int:
        return sum(self.type(v).size for v in values)


RULES: dict[type, Callable[[isa.Instruction, CostContext], Cost]] = {}


def cost_rule(*classes: type) -> Callable:
    """Register the decorated `rule(instr, ctx) -> Cost` for these instruction classes."""

    def register(fn: Callable) -> Callable:
        for cls in classes:
            RULES[cls] = fn
        return fn

    return register


# The fused kernels' rules (mesh.fused_kernels: composites the chip runs as one kernel),
# costed by the kernel's own rule, not by walking their decomposition. By name: (the engine
# whose queue the kernel holds, the rule).
KERNEL_RULES: dict[str, tuple[str, Callable[[isa.Instruction, CostContext], Cost]]] = {}


def fused_kernel(name: str, engine: str) -> Callable:
    """Register the decorated `rule(instr, ctx) -> Cost` for composites named `name`, one of
    mesh.fused_kernels.FUSED_KERNELS."""
    if name not in FUSED_KERNELS:
        raise ValueError(f"{name!r} is not a fused kernel: add it to "
                         "mesh.fused_kernels.FUSED_KERNELS first")

    def register(fn: Callable) -> Callable:
        KERNEL_RULES[name] = (engine, fn)
        return fn

    return register


def _rule(instr: isa.Instruction) -> Callable[[isa.Instruction, CostContext], Cost] | None:
    if is_fused_kernel(instr):
        return KERNEL_RULES[instr.name][1]
    return RULES.get(type(instr))


def has_rule(instr: isa.Instruction) -> bool:
    return _rule(instr) is not None


def queue(instr: isa.Instruction) -> str:
    """The engine whose queue `instr` occupies."""
    return KERNEL_RULES[instr.name][0] if is_fused_kernel(instr) else instr.engine


def instruction_cost(instr: isa.Instruction, program: isa.Program, chip: ChipSpec,
                     runtime: RuntimeSpec | None = None) -> Cost:
    """The cost of `instr` (an instruction of `program`) on one chip: expected with the
    runtime costs `runtime`, ideal without them (the default).

    Classes without a rule are costed by their engine: elements of their results through a
    compute engine, or bytes through DMA. Instructions with sub-programs (loops,
    conditionals) are costed by walking those (mesh.perf.estimate), not here.
    """
    ctx = CostContext(program, chip, runtime if runtime is not None else IDEAL_RUNTIME)
    return (_rule(instr) or _by_engine)(instr, ctx)


def engine_op(engine: str, elements: int, nbytes: int, ctx: CostContext, *,
              flops: float = 0.0, transcendentals: float = 0.0,
              passes: float = 1.0, rate: float = 1.0) -> Cost:
    """A Vector/Scalar/GpSimd op over `elements` (times `passes`) at `rate` elements per
    lane per cycle, moving `nbytes` of HBM. Each NeuronCore's engine has one lane per SBUF
    partition; the chip's elements are spread over its cores. The expected time adds each
    instruction's overhead (instructions of at most RuntimeSpec.instruction_free_elements
    per lane) and the DMA's fixed cost."""
    chip, runtime = ctx.chip, ctx.runtime
    clock = {isa.VECTOR: chip.vector_clock_hz, isa.SCALAR: chip.scalar_clock_hz,
             isa.GPSIMD: chip.gpsimd_clock_hz}[engine]
    per_lane = math.ceil(elements / (chip.neuron_cores * chip.sbuf_partitions))
    instructions = math.ceil(per_lane / runtime.instruction_free_elements) * passes
    cycles = per_lane * passes / rate + instructions * runtime.instruction_overhead_cycles
    hbm = ctx.hbm_seconds(nbytes)
    seconds = max(cycles / clock, hbm) + ctx.dma_latency(nbytes)
    return Cost(flops=flops, transcendentals=transcendentals, bytes_accessed=nbytes,
                seconds=seconds, engine_seconds=_engines(engine, seconds, hbm))


def dma_op(nbytes: int, ctx: CostContext) -> Cost:
    """A copy through HBM of `nbytes` read plus written."""
    seconds = ctx.hbm_seconds(nbytes) + ctx.dma_latency(nbytes)
    return Cost(bytes_accessed=nbytes, seconds=seconds, engine_seconds={isa.DMA: seconds})


def tensor_op(tiling: tensor_engine.MatmulTiling, ctx: CostContext) -> Cost:
    """A tiling's time on the Tensor Engine: its cycles or its HBM traffic, whichever is
    longer (DMA is double-buffered against the matmuls); the expected time runs the cycles
    from the engine's warm-up ramp and adds the first DMA's fixed cost."""
    hbm = ctx.hbm_seconds(tiling.hbm_bytes)
    compute = ctx.runtime.warm_compute_seconds(tiling.compute_seconds)
    seconds = max(compute, hbm) + ctx.dma_latency(tiling.hbm_bytes)
    return Cost(flops=tiling.flops, bytes_accessed=tiling.hbm_bytes, seconds=seconds,
                engine_seconds=_engines(isa.TENSOR, seconds, hbm),
                peak_seconds=tiling.flops / _peak(tiling.dtype, ctx.chip))


def _engines(engine: str, seconds: float, hbm_seconds: float) -> dict[str, float]:
    engines = {engine: seconds}
    if hbm_seconds:
        engines[isa.DMA] = hbm_seconds
    return engines


def _peak(dtype: str, chip: ChipSpec) -> float:
    """The chip's peak FLOP/s for matmul inputs of `dtype` (types the Tensor Engine has
    no rate for run at its FP32 rate)."""
    return chip.peak_flops_for(dtype if dtype in chip.matmul_dtypes else "float32")


# --- rules -----------------------------------------------------------------------------------

@cost_rule(isa.Constant, isa.Reshape, isa.Shard, isa.Unshard)
def _free(instr, ctx: CostContext) -> Cost:
    return Cost()


# Dense factorisations: LAPACK's blocked algorithms put their O(n^3) work in matrix
# products, which run on the Tensor Engine at its FP32 rate; the panel factorisation is a
# chain of dependent column steps (pivot search or norm, scale, reflector) on the Vector
# Engine, assumed PANEL_STEP_CYCLES each, one per column. FLOP counts per matrix (m x n,
# k = min(m, n); Golub & Van Loan, LAWN 41): potrf n^3/3, getrf m n^2 - n^3/3 (m >= n),
# geqrf and geqp3 2 m n^2 - 2 n^3/3, orgqr 4 m n k - 2 (m + n) k^2 + 4 k^3/3, ormqr
# 4 r c k - 2 c k^2 (left side, C r x c; r for c on the right), syevd 9 n^3 with vectors
# (4 n^3/3 without), gesdd and gesvd 4 m^2 n + 8 m n^2 + 9 n^3 with vectors (4 m n^2 -
# 4 n^3/3 without), gehrd 10 n^3/3, sytrd 4 n^3/3, geev 10 n^3 for the eigenvalues
# (26 n^3 with one side's vectors, 36 n^3 with both; Golub & Van Loan table 7.7.1), gees
# 10 n^3 (25 n^3 with the Schur vectors), trsm n_rhs m^2 (left side; m n^2 right), gtsv
# 8 n per right-hand side (Thomas' elimination and back substitution). A complex
# multiply-add is 4 real ones (as the complex matmul's 4 real products), so complex
# routines count 4x.
PANEL_STEP_CYCLES = 100


def _dense_flops(routine: str, m: int, n: int, instr: isa.LinearAlgebra) -> float:
    """FLOPs of one real m x n matrix of a factorisation or eigensolver."""
    big, small = max(m, n), min(m, n)
    vectors = instr.option("mode", "V") != "N"
    eigenvector_sides = sum(instr.option(side) == "V"
                            for side in ("compute_left", "compute_right"))
    per = {"potrf": n ** 3 / 3,
           "getrf": big * small ** 2 - small ** 3 / 3,
           "geqrf": 2 * big * small ** 2 - 2 * small ** 3 / 3,
           "orgqr": 4 * m * n * small - 2 * (m + n) * small ** 2 + 4 * small ** 3 / 3,
           "syevd": 9 * n ** 3 if vectors else 4 * n ** 3 / 3,
           "gesdd": (4 * big ** 2 * small + 8 * big * small ** 2 + 9 * small ** 3)
           if vectors else 4 * big * small ** 2 - 4 * small ** 3 / 3,
           "gehrd": 10 * n ** 3 / 3,
           "sytrd": 4 * n ** 3 / 3,
           "geev": (10, 26, 36)[eigenvector_sides] * n ** 3,
           "gees": 25 * n ** 3 if vectors else 10 * n ** 3}
    return float(per[_SAME_FLOPS.get(routine, routine)])


# Routines costed as another: pivoted QR as QR, the QR-iteration SVD as the divide-and-
# conquer one.
_SAME_FLOPS = {"geqp3": "geqrf", "gesvd": "gesdd"}


def linear_algebra_flops(instr: isa.LinearAlgebra, ctx: CostContext) -> tuple[float, int]:
    """(FLOPs of all the matrices, columns of one matrix) of a LinearAlgebra instruction."""
    a = ctx.type(instr.ins[0])
    complex_factor = 4 if a.dtype.startswith("complex") else 1
    routine = instr.routine
    if routine in ("trsm", "ormqr", "gtsv"):  # costed by the right-hand side's shape
        b = ctx.type(instr.ins[-1])
        rows, cols = b.shape[-2:]
        left = instr.option("side", "L") == "L"
        if routine == "trsm":
            per = cols * rows ** 2 if left else rows * cols ** 2
        elif routine == "gtsv":
            per = 8 * rows * cols
        else:
            k = ctx.type(instr.ins[1]).shape[-1]
            per = 4 * rows * cols * k - 2 * (cols if left else rows) * k ** 2
        columns = rows if left else cols
        return float(per) * complex_factor * (b.size // max(rows * cols, 1)), columns
    m, n = a.shape[-2:]
    batch = a.size // max(m * n, 1)
    return _dense_flops(routine, m, n, instr) * complex_factor * batch, min(m, n)


@cost_rule(isa.LinearAlgebra)
def _linear_algebra(instr: isa.LinearAlgebra, ctx: CostContext) -> Cost:
    flops, columns = linear_algebra_flops(instr, ctx)
    tensor = flops / ctx.chip.peak_flops_for("float32")
    panel = columns * PANEL_STEP_CYCLES / ctx.chip.vector_clock_hz
    nbytes = ctx.nbytes((*instr.ins, *instr.outs))
    hbm = ctx.hbm_seconds(nbytes)
    tensor = max(tensor, hbm) + ctx.dma_latency(nbytes)
    engines = {isa.TENSOR: tensor, isa.VECTOR: panel}
    if hbm:
        engines[isa.DMA] = hbm
    return Cost(flops=flops, bytes_accessed=nbytes, seconds=tensor + panel,
                engine_seconds=engines)


# A Fourier transform runs as DFT matrix products on the Tensor Engine at its FP32 rate
# (mesh.isa.kernels.fft): per transformed axis of length N and rows = elements / N, a
# complex transform is 4 real products (8 N^2 rows FLOPs), the real-input transform of RFFT
# and the real-output one of IRFFT 2 real products over N/2+1 frequencies
# (4 N (N/2+1) rows).
@cost_rule(isa.Fft)
def _fft(instr: isa.Fft, ctx: CostContext) -> Cost:
    shape = list(ctx.type(instr.ins[0]).shape)
    size = math.prod(shape)
    flops = 0.0
    rank = len(instr.fft_length)
    for i, n in enumerate(instr.fft_length):
        real_axis = i == rank - 1 and instr.fft_type in ("RFFT", "IRFFT")
        rows = size / max(shape[len(shape) - rank + i], 1)
        flops += (4 * n * (n // 2 + 1) if real_axis else 8 * n * n) * rows
    tensor = flops / ctx.chip.peak_flops_for("float32")
    nbytes = ctx.nbytes((*instr.ins, *instr.outs))
    hbm = ctx.hbm_seconds(nbytes)
    seconds = max(tensor, hbm) + ctx.dma_latency(nbytes)
    return Cost(flops=flops, bytes_accessed=nbytes, seconds=seconds,
                engine_seconds=_engines(isa.TENSOR, seconds, hbm),
                peak_seconds=flops / ctx.chip.peak_flops_for("float32"))


# A host callback stops the chip for a round trip to the host: the operands go out and the
# results come back over PCIe, and the Python function runs (ChipSpec.host_round_trip_seconds
# and host_link_bandwidth: assumed figures, with their reasons).
@cost_rule(isa.HostCallback)
def _host_callback(instr: isa.HostCallback, ctx: CostContext) -> Cost:
    nbytes = ctx.nbytes((*instr.ins, *instr.outs))
    seconds = ctx.chip.host_round_trip_seconds + nbytes / ctx.chip.host_link_bandwidth
    return Cost(bytes_accessed=nbytes, seconds=seconds, engine_seconds={isa.DMA: seconds})


# A move between HBM and host memory (an offload or a reload) streams its bytes over the
# chip's PCIe link: each chip moves its own piece over its own link
# (ChipSpec.host_link_bandwidth, per chip and direction), after the DMA's fixed start
# (RuntimeSpec.dma_fixed_seconds). The chip's DMA engines also carry the transfers between
# HBM and SBUF, but one over PCIe runs at about 1% of the HBM's rate (32 GB/s against 2.9
# TB/s), so it does not hold them: it queues on the link (isa.HOST_LINK), and only its HBM
# side, the bytes read or written at the HBM's rate, occupies the DMA queue.
@cost_rule(isa.HostTransfer)
def _host_transfer(instr: isa.HostTransfer, ctx: CostContext) -> Cost:
    nbytes = ctx.nbytes(instr.ins)
    seconds = nbytes / ctx.chip.host_link_bandwidth + ctx.dma_latency(nbytes)
    return Cost(bytes_accessed=nbytes, seconds=seconds,
                engine_seconds=_engines(isa.HOST_LINK, seconds, ctx.hbm_seconds(nbytes)))


@cost_rule(isa.Matmul, isa.RaggedMatmul)
def _matmul(instr: isa.Matmul | isa.RaggedMatmul, ctx: CostContext) -> Cost:
    if instr.tiling is None:
        raise ValueError(f"Matmul at {instr.loc or 'unknown location'} has no tiling: plan the "
                         "program first (lowering.plan.plan_program)")
    cost = tensor_op(instr.tiling, ctx)
    if instr.recomputed:
        return dataclasses.replace(cost, recomputed_flops=cost.flops,
                                   recomputed_peak_seconds=cost.peak_seconds)
    return cost


@cost_rule(isa.Convolution)
def _convolution(instr: isa.Convolution, ctx: CostContext) -> Cost:
    """An implicit GEMM: rows = batch x output positions, columns = output features of a
    group, contraction = input features of a group x window, one GEMM per group."""
    lhs, rhs = ctx.type(instr.ins[0]), ctx.type(instr.ins[1])
    out = ctx.type(instr.outs[0])
    groups = instr.feature_group_count * instr.batch_group_count
    window = math.prod(rhs.shape[d] for d in instr.rhs_spec[2:])
    positions = math.prod(out.shape[d] for d in instr.out_spec[2:])
    tiling = tensor_engine.tile_matmul(
        groups, out.shape[instr.out_spec[0]] * positions, out.shape[instr.out_spec[1]] // groups,
        rhs.shape[instr.rhs_spec[1]] * window, lhs.dtype, rhs.dtype, instr.out_dtype, ctx.chip)
    return tensor_op(tiling, ctx)


@cost_rule(isa.Elementwise)
def _elementwise(instr: isa.Elementwise, ctx: CostContext) -> Cost:
    """One engine pass over the result's elements; none for a convert fused into its
    consumers (a dtype of their read), which still reads its operand if that is in HBM."""
    elements = ctx.size(instr.outs)
    transcendental = instr.op in isa.TRANSCENDENTAL_OPS
    streamed = instr.op == "convert" and set(instr.outs) <= ctx.on_chip
    return engine_op(instr.engine, 0 if streamed else elements,
                     ctx.hbm_bytes(instr.ins + instr.outs), ctx,
                     flops=0 if transcendental else elements,
                     transcendentals=elements if transcendental else 0,
                     rate=_vector_rate(instr, ctx))


def _vector_rate(instr: isa.Elementwise, ctx: CostContext) -> float:
    """The Vector Engine's element rate per lane and cycle for `instr` by its tensor
    operands and dtypes (ChipSpec.vector_rates); the other engines run at one element per
    lane per cycle."""
    if instr.engine != isa.VECTOR:
        return 1.0
    half = all(ctx.type(v).dtype in PERFORMANCE_MODE_DTYPES for v in instr.ins + instr.outs)
    rates = dict(ctx.chip.vector_performance_mode_rates if half else ctx.chip.vector_rates)
    producers = producers_of(ctx.program)

    def scalar(v: int) -> bool:  # a scalar, or one broadcast to the op's shape
        made_by = producers.get(v)
        return ctx.type(v).size <= 1 or (isinstance(made_by, isa.BroadcastInDim)
                                         and ctx.type(made_by.ins[0]).size <= 1)

    tensors = sum(1 for v in instr.ins if not scalar(v))
    return rates[min(max(tensors, 1), 2)]


@cost_rule(isa.Reduce)
def _reduce(instr: isa.Reduce, ctx: CostContext) -> Cost:
    """One combine per input element; a custom body costs its instruction count each."""
    operands = instr.ins[:len(instr.ins) // 2]
    elements = ctx.size(operands)
    per_element = 1 if instr.body is None else len(instr.body.instructions)
    return engine_op(isa.VECTOR, elements, ctx.hbm_bytes(instr.ins + instr.outs), ctx,
                     flops=elements * per_element, passes=per_element)


@cost_rule(isa.Map)
def _map(instr: isa.Map, ctx: CostContext) -> Cost:
    """The body's instructions on each element, one Vector Engine pass each."""
    elements = ctx.size(instr.outs)
    per_element = max(1, len(instr.body.instructions))
    return engine_op(isa.VECTOR, elements, ctx.hbm_bytes(instr.ins + instr.outs), ctx,
                     flops=elements * per_element, passes=per_element)


@cost_rule(isa.Sort, isa.ApproxTopK)
def _sort(instr: isa.Sort | isa.ApproxTopK, ctx: CostContext) -> Cost:
    """A merge sort: log2(n) passes over the elements of every operand (an approx_max_k
    sorts its values and their indices)."""
    n = ctx.type(instr.ins[0]).shape[instr.dimension] if ctx.type(instr.ins[0]).rank else 1
    passes = max(1, math.ceil(math.log2(max(n, 1))))
    elements = ctx.size(instr.ins) * (2 if isinstance(instr, isa.ApproxTopK) else 1)
    return engine_op(isa.GPSIMD, elements, ctx.hbm_bytes(instr.ins + instr.outs), ctx,
                     flops=elements * passes, passes=passes)


@cost_rule(isa.BroadcastInDim, isa.Iota, isa.DeviceId)
def _fill(instr, ctx: CostContext) -> Cost:
    """Writes its result; reads its (smaller) operand if it has one. A broadcast that stays
    in SBUF is an access pattern of its consumers: it only reads its operand; one that only
    adds dimensions of size 1 is a bitcast: free."""
    if set(instr.outs) <= ctx.views:
        return Cost()
    streamed = isinstance(instr, isa.BroadcastInDim) and set(instr.outs) <= ctx.on_chip
    return engine_op(instr.engine, 0 if streamed else ctx.size(instr.outs),
                     ctx.hbm_bytes(instr.ins + instr.outs), ctx)


@cost_rule(isa.Slice, isa.DynamicSlice, isa.Gather)
def _selection(instr, ctx: CostContext) -> Cost:
    """Reads only what it selects and its start indices, and writes it: a slice, or a
    gather's rows (an indirect DMA: a row of an embedding table, not the table). A slice
    its readers' DMA reads in place (`view_values`) costs nothing: its bytes are counted
    where they are read."""
    if set(instr.outs) <= ctx.views:
        return Cost()
    return dma_op(2 * ctx.nbytes(instr.outs) + ctx.nbytes(instr.ins[1:]), ctx)


@cost_rule(isa.DynamicUpdateSlice)
def _update_slice(instr, ctx: CostContext) -> Cost:
    """In place: reads the update and writes it into the operand. An update that an
    instruction computes for this write alone is written by that instruction straight into
    the operand (XLA's in-place dynamic-update-slice fusion: a scan writing each step's
    output into its stacked outputs): then only the start indices are read."""
    indices = ctx.nbytes(instr.ins[2:])
    if _written_straight_into(instr, ctx):
        return dma_op(indices, ctx)
    return dma_op(2 * ctx.nbytes(instr.ins[1:2]) + indices, ctx)


def _written_straight_into(instr: isa.DynamicUpdateSlice, ctx: CostContext) -> bool:
    """Whether the update is made by an instruction (through bitcasts) only for `instr`."""
    producers = producers_of(ctx.program)
    readers = readers_of(ctx.program)
    value, reader = instr.ins[1], instr
    while True:
        if value in ctx.program.outputs or value in ctx.on_chip or \
                readers.get(value, []) != [reader] or value not in producers:
            return False
        producer = producers[value]
        if not is_bitcast(producer, ctx.program):  # a slice read in place writes nothing
            return not isinstance(producer, isa.Constant) and value not in ctx.views
        value, reader = producer.ins[0], producer


@cost_rule(isa.AllReduce, isa.AllGather, isa.ReduceScatter, isa.AllToAll,
           isa.RaggedAllToAll, isa.CollectivePermute)
def _collective(instr, ctx: CostContext) -> Cost:
    if instr.plan is None:
        raise ValueError(f"{instr.mnemonic} at {instr.loc or 'unknown location'} has no torus "
                         "plan: plan the program first (lowering.plan.plan_program)")
    plan = instr.plan
    if ctx.runtime.is_ideal:
        return Cost(bytes_accessed=plan.device_hbm_bytes, seconds=plan.seconds,
                    engine_seconds={isa.COLLECTIVE: plan.seconds})
    # the collective's own HBM traffic competes with compute for HBM (the DMA queue)
    hbm = ctx.hbm_seconds(plan.device_hbm_bytes)
    return Cost(bytes_accessed=plan.device_hbm_bytes, seconds=plan.expected_seconds,
                engine_seconds=_engines(isa.COLLECTIVE, plan.expected_seconds, hbm))


def _by_engine(instr: isa.Instruction, ctx: CostContext) -> Cost:
    """Any other instruction: DMA moves its operands and results; a compute engine processes
    one element of its results per lane and cycle."""
    nbytes = ctx.hbm_bytes(instr.ins + instr.outs)
    engine = instr.engine
    if engine == isa.DMA:
        return dma_op(nbytes, ctx)
    if engine in (isa.VECTOR, isa.SCALAR, isa.GPSIMD):
        return engine_op(engine, ctx.size(instr.outs), nbytes, ctx)
    if engine == isa.NONE:
        return Cost()
    raise NotImplementedError(f"no cost rule for {type(instr).__name__} on the {engine} engine")


@cost_rule(isa.ReduceWindow)
def _reduce_window(instr: isa.ReduceWindow, ctx: CostContext) -> Cost:
    """One combine per window element of every result element."""
    window = math.prod(instr.window_dimensions)
    elements = ctx.size(instr.outs)
    return engine_op(isa.VECTOR, elements, ctx.hbm_bytes(instr.ins + instr.outs), ctx,
                     flops=elements * window, passes=window)


# Instructions whose Program-valued fields are per-element bodies (reducers, comparators),
# costed by their engine, not walked as sub-programs.
cost_rule(isa.SelectAndScatter)(_by_engine)


@cost_rule(isa.Scatter)
def _scatter(instr: isa.Scatter, ctx: CostContext) -> Cost:
    """In place, as XLA and the Neuron compiler write a scatter into an operand that dies
    there (the dynamic-update-slice rule assumes the same): reads the indices and the
    updates, and reads, combines and writes back only the windows they update."""
    n = len(instr.outs)
    updates = instr.ins[n + 1:]
    nbytes = ctx.nbytes(instr.ins[n:]) + 2 * ctx.nbytes(updates)
    per_element = 1 if instr.body is None else max(1, len(instr.body.instructions))
    return engine_op(instr.engine, ctx.size(updates), nbytes, ctx, passes=per_element)
