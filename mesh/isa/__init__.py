"""The Trn2 instruction set: what lowering emits and what the executor runs.

A `Program` is a flat list of instructions over numbered values. Every value has a local
(per-chip) tensor type and a layout: the set of logical mesh axes along which it varies.
The executor stores a value as one array whose leading axes are the logical mesh axes, of
full size where the value varies and of size 1 where it is replicated, so replicated work is
done once.

In a jax program, values outside a shard_map body are global (replicated on every chip,
varying along no axis); `Shard` splits a global value into per-chip pieces and `Unshard`
assembles them again. In an SPMD module (no sdy.mesh), main's arguments are each chip's own
and vary along every axis.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from mesh import dtypes

# Engines of one NeuronCore (NKI Trainium2 guide) plus the data movers between chips.
TENSOR = "Tensor"
VECTOR = "Vector"
SCALAR = "Scalar"
GPSIMD = "GpSimd"
DMA = "DMA"
COLLECTIVE = "Collective"
# The chip's PCIe link to its host: DMA between host memory and HBM at the link's rate
# (ChipSpec.host_link_bandwidth), which HBM-bound DMA runs beside (mesh.perf.cost).
HOST_LINK = "HostLink"
NONE = "-"  # free: constants folded into the program, metadata-only reshapes


@dataclass(frozen=True)
class TensorType:
    """A per-chip tensor type: shape and element type name (see mesh.dtypes)."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        dtypes.numpy_dtype(self.dtype)
        if any(d < 0 for d in self.shape):
            raise ValueError(f"tensor shape {self.shape} has a negative dimension")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * dtypes.itemsize(self.dtype)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class MeshSpec:
    """The logical mesh a program runs on: axis names and sizes, row-major device ids."""

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.axis_names) != len(self.axis_sizes):
            raise ValueError(f"mesh axis names {self.axis_names} and sizes {self.axis_sizes} "
                             "differ in length")

    @property
    def num_devices(self) -> int:
        return int(np.prod(self.axis_sizes, dtype=np.int64))

    @property
    def rank(self) -> int:
        return len(self.axis_sizes)

    def axis_index(self, name: str) -> int:
        try:
            return self.axis_names.index(name)
        except ValueError:
            raise ValueError(f"mesh axis {name!r} is not one of {self.axis_names}") from None

    def layout_shape(self, varying: frozenset[int]) -> tuple[int, ...]:
        """Leading array dims of a value varying along `varying` (size 1 elsewhere)."""
        return tuple(s if a in varying else 1 for a, s in enumerate(self.axis_sizes))

    def device_coords(self) -> np.ndarray:
        """Array [num_devices, rank] of each logical device's mesh coordinates."""
        return np.stack(np.unravel_index(np.arange(self.num_devices), self.axis_sizes), -1) \
            if self.rank else np.zeros((1, 0), np.int64)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.axis_sizes)) + "}"


@dataclass(frozen=True)
class ValueInfo:
    """A value's per-chip type and the logical mesh axes along which it varies."""

    type: TensorType
    varying: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Groups:
    """Who takes part in a collective together.

    `device_groups` lists logical device ids (row-major over the mesh), one tuple per group,
    members in the order the collective uses (rank order). When the groups are exactly the
    lines of the mesh along some logical axes, `axes` names those axes in rank order (major
    first) and the executor works on the mesh dims directly; otherwise `axes` is None.
    """

    device_groups: tuple[tuple[int, ...], ...]
    axes: tuple[int, ...] | None

    @property
    def group_size(self) -> int:
        return len(self.device_groups[0])


class Plan:
    """How the hardware carries out one instruction (a matmul's tiling, a collective's route
    over the torus), attached by the planning pass; `describe()` gives its listing text."""

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class Instruction:
    """One instruction: reads values `ins`, defines values `outs`.

    `loc` is the user's source location (`path:line:col`, the innermost frame of the
    user's own code) of the StableHLO op it came from; `via` the library line inside that
    call which made the op (a flax Dense's matmul: `.../flax/linen/linear.py:287:8`), or
    ''; `scope` the user's name scopes the op was made in, outermost first (a Flax module
    path `Model/block0/attn/q`, jax.named_scope names), or ''; `why` says why a compiler
    put it there when the user did not write it (a collective XLA's SPMD partitioner
    inserted, with the sharding change that needed it); `recomputed` marks the
    recomputation of a value jax.checkpoint did not keep for the backward pass (jax names
    such ops `rematted_computation`). mesh.isa.sites shows them.
    """

    outs: tuple[int, ...]
    ins: tuple[int, ...]
    loc: str = field(default="", kw_only=True)
    via: str = field(default="", kw_only=True)
    scope: str = field(default="", kw_only=True)
    why: str = field(default="", kw_only=True)
    recomputed: bool = field(default=False, kw_only=True)

    engine: ClassVar[str] = NONE

    @property
    def mnemonic(self) -> str:
        return type(self).__name__

    def params(self) -> dict:
        """The instruction's own parameters, for the listing."""
        skip = {"outs", "ins", "loc", "via", "scope", "why", "recomputed"}
        return {k: v for k, v in self.__dict__.items() if k not in skip}


def subprogram_fields(instr: Instruction) -> dict[str, tuple[Program, ...]]:
    """The instruction's sub-programs (loop bodies, branches, reducer bodies) by field: each
    field's Program, or its tuple of alternative Programs."""
    found = {}
    for name, value in instr.params().items():
        if isinstance(value, Program):
            found[name] = (value,)
        elif isinstance(value, tuple) and value and all(isinstance(p, Program) for p in value):
            found[name] = value
    return found


def map_subprograms(instr: Instruction, fn) -> Instruction:
    """`instr` with `fn` applied to each of its sub-programs."""
    changes = {name: tuple(fn(p) for p in programs)
               if isinstance(getattr(instr, name), tuple) else fn(programs[0])
               for name, programs in subprogram_fields(instr).items()}
    return dataclasses.replace(instr, **changes) if changes else instr


# --- values from nowhere ---------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Constant(Instruction):
    value: np.ndarray  # the per-chip value, or per-device values with leading mesh dims


@dataclass(frozen=True, eq=False)
class Iota(Instruction):
    dimension: int
    engine: ClassVar[str] = GPSIMD


@dataclass(frozen=True, eq=False)
class DeviceId(Instruction):
    """partition_id / replica_id: the row-major index of the chip's coordinates along the
    mesh axes `axes` (every axis for the partition id of a shard_map program; the process
    grid of the module says which: lowering.replica_groups.ProcessGrid)."""

    kind: str  # "partition" or "replica"
    axes: tuple[int, ...]
    engine: ClassVar[str] = GPSIMD


# --- engine compute ----------------------------------------------------------------------

TRANSCENDENTAL_OPS = frozenset({
    "exponential", "exponential_minus_one", "log", "log_plus_one", "logistic", "tanh", "sine",
    "cosine", "tan", "sqrt", "rsqrt", "cbrt", "erf", "atan2", "power", "erf_inv",
    "acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "sinh", "erfc", "lgamma",
    "digamma", "bessel_i1e", "polygamma", "zeta",
})


@dataclass(frozen=True, eq=False)
class Elementwise(Instruction):
    """An elementwise op named as in the StableHLO spec (`add`, `exponential`, `compare`...).

    Transcendentals run on the Scalar (activation) engine, the rest on the Vector engine.
    `direction`/`compare_type` are used by `compare` only.
    """

    op: str
    direction: str = ""
    compare_type: str = ""

    @property
    def engine(self) -> str:  # type: ignore[override]
        return SCALAR if self.op in TRANSCENDENTAL_OPS else VECTOR

    @property
    def mnemonic(self) -> str:
        return self.op if not self.direction else f"{self.op}.{self.direction}"


@dataclass(frozen=True, eq=False)
class Reduce(Instruction):
    """Reduce over local `dimensions` with init values `ins[n:]`.

    `combiner` names a known monoid (add, multiply, maximum, minimum, and, or, xor); otherwise
    `body` is a per-element program over scalars (for example argmax's two-operand reducer).
    """

    dimensions: tuple[int, ...]
    combiner: str | None
    body: Program | None = None
    engine: ClassVar[str] = VECTOR


@dataclass(frozen=True, eq=False)
class Matmul(Instruction):
    """dot_general on the Tensor Engine, as StableHLO's dimension numbers describe it.

    Output dims: batch, lhs free, rhs free. Inputs are read in FP32 (exact for BF16/FP16/FP8
    inputs), each pass of up to `pass_size` along the contraction is accumulated in FP32,
    passes add into PSUM in FP32 in order, and the result is rounded once to `out_dtype`.
    """

    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    lhs_contract: tuple[int, ...]
    rhs_contract: tuple[int, ...]
    out_dtype: str
    pass_size: int = 128  # PE-array rows: the contraction length of one matmul pass
    tiling: Plan | None = None  # mesh.perf.tensor_engine.MatmulTiling, set by planning
    engine: ClassVar[str] = TENSOR


@dataclass(frozen=True, eq=False)
class RaggedMatmul(Instruction):
    """chlo.ragged_dot on the Tensor Engine: a dot_general whose lhs dim `lhs_ragged` is cut
    into consecutive groups of the sizes ins[2] gives (its last dim: one size per group,
    leading dims, if any, the batch dims), each group a matmul of its own.

    - `lhs_ragged` a free dim (a mixture of experts): the rhs has a group dim `rhs_group`,
      rows of group i multiply rhs group i, rows after the last group are zeros; the result
      is dot_general's.
    - `lhs_ragged` the contraction dim (rhs_group None): group i contracts its own range;
      the result is [groups, dot_general's dims...].
    Numerics are Matmul's, each group's passes starting at its first element.
    """

    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    lhs_contract: tuple[int, ...]
    rhs_contract: tuple[int, ...]
    lhs_ragged: int
    rhs_group: int | None
    out_dtype: str
    pass_size: int = 128
    tiling: Plan | None = None
    engine: ClassVar[str] = TENSOR


# --- data movement -----------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class BroadcastInDim(Instruction):
    dimensions: tuple[int, ...]
    shape: tuple[int, ...]
    engine: ClassVar[str] = VECTOR


@dataclass(frozen=True, eq=False)
class Reshape(Instruction):
    shape: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Transpose(Instruction):
    permutation: tuple[int, ...]
    engine: ClassVar[str] = DMA


@dataclass(frozen=True, eq=False)
class Slice(Instruction):
    start: tuple[int, ...]
    limit: tuple[int, ...]
    strides: tuple[int, ...]
    engine: ClassVar[str] = DMA


@dataclass(frozen=True, eq=False)
class DynamicSlice(Instruction):
    """ins = (operand, *start_indices); start indices are clamped as the spec says."""

    sizes: tuple[int, ...]
    engine: ClassVar[str] = DMA


@dataclass(frozen=True, eq=False)
class DynamicUpdateSlice(Instruction):
    """ins = (operand, update, *start_indices)."""

    engine: ClassVar[str] = DMA


@dataclass(frozen=True, eq=False)
class Concatenate(Instruction):
    dimension: int
    engine: ClassVar[str] = DMA


@dataclass(frozen=True, eq=False)
class Pad(Instruction):
    """ins = (operand, padding_value)."""

    low: tuple[int, ...]
    high: tuple[int, ...]
    interior: tuple[int, ...]
    engine: ClassVar[str] = DMA


@dataclass(frozen=True, eq=False)
class Reverse(Instruction):
    dimensions: tuple[int, ...]
    engine: ClassVar[str] = DMA


@dataclass(frozen=True, eq=False)
class Shard(Instruction):
    """Split a global value into per-chip pieces: `dim_axes[d]` are the mesh axes dim d is
    split over, major first (sdy's dimension sharding).

    `manual_axes` are the mesh axes of the split (a shard_map over some axes only; None: all
    of them): the value is global along them (the chip at coordinate 0 holds it) and keeps
    its layout along the others."""

    dim_axes: tuple[tuple[int, ...], ...]
    manual_axes: tuple[int, ...] | None = None
    engine: ClassVar[str] = DMA


@dataclass(frozen=True, eq=False)
class Unshard(Instruction):
    """Assemble per-chip pieces into the global value (inverse of Shard). Along `manual_axes`
    (None: all) that no dim is split over, the value of the chip at coordinate 0 is taken;
    along axes that are not manual the value keeps its layout."""

    dim_axes: tuple[tuple[int, ...], ...]
    manual_axes: tuple[int, ...] | None = None
    engine: ClassVar[str] = DMA


# --- collectives -------------------------------------------------------------------------

REDUCTIONS = ("add", "multiply", "maximum", "minimum", "and", "or", "xor")


@dataclass(frozen=True, eq=False)
class AllReduce(Instruction):
    """Each input reduced over its group; several inputs (a combined all-reduce,
    lowering.combine) are one collective launch moving them all."""
    groups: Groups
    reduction: str  # one of REDUCTIONS
    plan: Plan | None = None  # mesh.perf.collectives.CollectivePlan, set by planning
    engine: ClassVar[str] = COLLECTIVE


@dataclass(frozen=True, eq=False)
class AllGather(Instruction):
    groups: Groups
    dimension: int
    plan: Plan | None = None
    engine: ClassVar[str] = COLLECTIVE


@dataclass(frozen=True, eq=False)
class ReduceScatter(Instruction):
    groups: Groups
    dimension: int
    reduction: str
    plan: Plan | None = None
    engine: ClassVar[str] = COLLECTIVE


@dataclass(frozen=True, eq=False)
class AllToAll(Instruction):
    groups: Groups
    split_dimension: int
    concat_dimension: int
    plan: Plan | None = None
    engine: ClassVar[str] = COLLECTIVE


@dataclass(frozen=True, eq=False)
class RaggedAllToAll(Instruction):
    """jax.lax.ragged_all_to_all: ins = (operand, output, input_offsets, send_sizes,
    output_offsets, recv_sizes), offsets and sizes [K] with K = group_size * slices per
    member. Member s sends the rows operand[input_offsets[i] : +send_sizes[i]] to member
    i // (K / group_size), which writes them at rows output_offsets[i] (the sender's value)
    of its copy of `output`, at most recv_sizes[j] of them (j: the receiver's slot for that
    slice, s * K / group_size + i % (K / group_size)). Rows outside the operand or the
    output are skipped (jax leaves them undefined)."""

    groups: Groups
    plan: Plan | None = None
    engine: ClassVar[str] = COLLECTIVE


@dataclass(frozen=True, eq=False)
class CollectivePermute(Instruction):
    """Send from each source device to its target; devices no one sends to receive zeros."""

    pairs: tuple[tuple[int, int], ...]  # (source, target) logical device ids
    plan: Plan | None = None
    engine: ClassVar[str] = COLLECTIVE


# --- indexing, sorting, windows, convolution, random bits ---------------------------------
# Dimension numbers are as in the StableHLO spec; all dims are local (per-chip) dims.

@dataclass(frozen=True, eq=False)
class Gather(Instruction):
    """ins = (operand, start_indices): slices of the operand at data-dependent starts (an
    indirect DMA). Start indices are clamped so that each slice lies inside the operand."""

    offset_dims: tuple[int, ...]
    collapsed_slice_dims: tuple[int, ...]
    operand_batching_dims: tuple[int, ...]
    start_indices_batching_dims: tuple[int, ...]
    start_index_map: tuple[int, ...]
    index_vector_dim: int
    slice_sizes: tuple[int, ...]
    indices_are_sorted: bool = False
    engine: ClassVar[str] = DMA


# Scatter combiners: REPLACE writes the update over the operand element, the others combine.
REPLACE = "replace"
SCATTER_COMBINERS = (REPLACE, "add", "multiply", "minimum", "maximum")


@dataclass(frozen=True, eq=False)
class Scatter(Instruction):
    """ins = (*operands, scatter_indices, *updates): each update window is combined into the
    operands at its start index; windows that do not fit inside the operand are skipped.

    With one operand, `combiner` may name one of SCATTER_COMBINERS; otherwise `body` is the
    spec's update computation over scalars (operand elements, then update elements),
    applied one update window after another in row-major order of the update scatter
    indices.
    """

    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    input_batching_dims: tuple[int, ...]
    scatter_indices_batching_dims: tuple[int, ...]
    scatter_dims_to_operand_dims: tuple[int, ...]
    index_vector_dim: int
    combiner: str | None
    body: Program | None = None
    indices_are_sorted: bool = False
    unique_indices: bool = False
    engine: ClassVar[str] = GPSIMD  # read-modify-write of the operand


@dataclass(frozen=True, eq=False)
class Map(Instruction):
    """stablehlo.map: `body`, a program over scalars, applied to each element of the
    operands (which have the result's shape) in turn."""

    body: Program
    engine: ClassVar[str] = VECTOR


@dataclass(frozen=True, eq=False)
class Sort(Instruction):
    """Sort all operands along `dimension` by a comparator over (lhs, rhs) element pairs.

    `num_keys` is set when the comparator is the one lax.sort builds: lexicographic order of
    the first `num_keys` operands, floats in total order with -0.0 == +0.0 and all NaNs
    equal and last. Otherwise `comparator` is the op's own comparator, a scalar program
    whose arguments are lhs_0, rhs_0, lhs_1, rhs_1, ...
    """

    dimension: int
    is_stable: bool
    num_keys: int | None
    comparator: Program | None = None
    engine: ClassVar[str] = GPSIMD


@dataclass(frozen=True, eq=False)
class TopK(Instruction):
    """chlo.top_k: the k largest elements along the last dim, largest first, ties in index
    order, and their int32 indices."""

    k: int
    engine: ClassVar[str] = GPSIMD


@dataclass(frozen=True, eq=False)
class ApproxTopK(Instruction):
    """lax.approx_max_k (`largest`) or approx_min_k along `dimension`, as XLA computes it on
    platforms other than the TPU: exactly, the top `k` (the user's k, or without
    aggregate_to_topk as many as the TPU's approximation would keep), and their int32
    indices."""

    k: int
    dimension: int
    largest: bool
    engine: ClassVar[str] = GPSIMD


@dataclass(frozen=True, eq=False)
class ReduceWindow(Instruction):
    """ins = (*operands, *init_values): a reduction over each window of the (base-dilated,
    padded) operands. `combiner` names a known monoid (see Reduce), else `body` reduces."""

    window_dimensions: tuple[int, ...]
    window_strides: tuple[int, ...]
    base_dilations: tuple[int, ...]
    window_dilations: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]  # (low, high) per dim
    combiner: str | None
    body: Program | None = None
    engine: ClassVar[str] = VECTOR


@dataclass(frozen=True, eq=False)
class SelectAndScatter(Instruction):
    """ins = (operand, source, init_value): in each window of the padded operand, `select`
    picks one element (the first, replaced by each later one it does not prefer); the
    source element of that window is combined into the result there (the result starts as
    init_value). `scatter_combiner` is one of REDUCTIONS, else `scatter_body` combines."""

    window_dimensions: tuple[int, ...]
    window_strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    select: Program
    scatter_combiner: str | None
    scatter_body: Program | None = None
    engine: ClassVar[str] = VECTOR


@dataclass(frozen=True, eq=False)
class Convolution(Instruction):
    """ins = (lhs, rhs): convolution on the Tensor Engine, as StableHLO describes it.

    `lhs_spec` = (batch dim, feature dim, spatial dims...), `rhs_spec` = (output feature dim,
    input feature dim, spatial dims...), `out_spec` = (batch dim, feature dim, spatial
    dims...), as lax.ConvDimensionNumbers. Float inputs are read in FP32, products summed in
    FP32 and the result rounded once to `out_dtype`, as for Matmul.
    """

    lhs_spec: tuple[int, ...]
    rhs_spec: tuple[int, ...]
    out_spec: tuple[int, ...]
    window_strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    lhs_dilation: tuple[int, ...]
    rhs_dilation: tuple[int, ...]
    window_reversal: tuple[bool, ...]
    feature_group_count: int
    batch_group_count: int
    out_dtype: str
    engine: ClassVar[str] = TENSOR


@dataclass(frozen=True, eq=False)
class RngBitGenerator(Instruction):
    """ins = (state,); outs = (new state, random bits): the named algorithm (DEFAULT,
    THREE_FRY or PHILOX) run on each chip's own state."""

    algorithm: str
    engine: ClassVar[str] = GPSIMD


@dataclass(frozen=True, eq=False)
class Rng(Instruction):
    """ins = (a, b) scalars; outs = (random numbers,): StableHLO's rng, uniform on [a, b)
    (`distribution` "UNIFORM") or normal with mean a and standard deviation b ("NORMAL"),
    from a counter-based generator (mesh.isa.kernels.bits.rng)."""

    distribution: str
    engine: ClassVar[str] = GPSIMD


@dataclass(frozen=True, eq=False)
class ReducePrecision(Instruction):
    """Round floats to a format with `exponent_bits` and `mantissa_bits`, kept in their type."""

    exponent_bits: int
    mantissa_bits: int
    engine: ClassVar[str] = VECTOR


# --- programs ----------------------------------------------------------------------------

# --- linear algebra ----------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class LinearAlgebra(Instruction):
    """A dense factorisation or solve, batched over leading dims, with LAPACK's semantics
    and result layout (mesh.isa.kernels.linalg): `routine` is one of LAPACK's real names
    (potrf, getrf, geqrf, geqp3, orgqr, ormqr, syevd, gesdd, gesvd, gehrd, sytrd, geev,
    gees, gtsv, trsm), for complex types too; `options` the LAPACK character options
    (uplo, side, trans, diag, mode, sort, compute_left, compute_right) as (name, value)
    pairs."""

    routine: str
    options: tuple[tuple[str, str], ...] = ()
    engine: ClassVar[str] = TENSOR

    def option(self, name: str, default: str = "") -> str:
        return dict(self.options).get(name, default)


@dataclass(frozen=True, eq=False)
class Fft(Instruction):
    """stablehlo.fft over the last len(fft_length) dims: FFT, IFFT, RFFT or IRFFT, computed
    as DFT matrix products on the Tensor Engine (mesh.isa.kernels.fft)."""

    fft_type: str  # FFT, IFFT, RFFT or IRFFT
    fft_length: tuple[int, ...]
    engine: ClassVar[str] = TENSOR


# --- the host --------------------------------------------------------------------------

def has_side_effects(instr: "Instruction") -> bool:
    """Whether running `instr` does something besides computing its results (a host
    callback with side effects, itself or in a sub-program): it must run even when nothing
    reads its results."""
    if isinstance(instr, HostCallback):
        return instr.has_side_effect
    return any(has_side_effects(i) for programs in subprogram_fields(instr).values()
               for p in programs for i in p.instructions)


@dataclass(frozen=True, eq=False)
class HostCallback(Instruction):
    """A Python function run on the host with each chip's own operand values, chip by chip
    in device order (jax.debug.print, jax.debug.callback, jax.pure_callback, io_callback).

    `callback(*operands) -> results` is jax's wrapped callback for one device: numpy arrays
    in, one array per result out (a token operand is passed through as the first result).
    `kind` names what the user wrote, for the listing and errors. `x64`: jax_enable_x64 as
    the program was traced, which the callback runs under (jax's wrapper converts its
    results to the types it declared by that setting: a float64 result to float32 without).
    """

    callback: object  # a Python callable
    kind: str
    has_side_effect: bool
    x64: bool = False
    engine: ClassVar[str] = DMA

    def params(self) -> dict:
        return {"kind": self.kind, "has_side_effect": self.has_side_effect}


# jax's memory kinds (jax.device_put(x, s.with_memory_kind(...))): the chip's HBM, and the
# host's memory behind the chip's PCIe link.
DEVICE_MEMORY = "device"
HOST_MEMORIES = ("pinned_host", "unpinned_host")


@dataclass(frozen=True, eq=False)
class HostTransfer(Instruction):
    """A copy of a value between the chip's HBM and its host's memory over the chip's own
    PCIe link (jax.device_put to a memory kind inside jit): into `memory_kind`, one of
    HOST_MEMORIES (an offload) or DEVICE_MEMORY (a reload). The value is unchanged."""

    memory_kind: str
    engine: ClassVar[str] = HOST_LINK

    def __post_init__(self) -> None:
        if self.memory_kind not in (DEVICE_MEMORY, *HOST_MEMORIES):
            raise ValueError(f"HostTransfer to memory kind {self.memory_kind!r}: expected one "
                             f"of {(DEVICE_MEMORY, *HOST_MEMORIES)}")

    @property
    def to_host(self) -> bool:
        return self.memory_kind in HOST_MEMORIES

    @property
    def mnemonic(self) -> str:
        return "Offload" if self.to_host else "Reload"


@dataclass(frozen=True, eq=False)
class Program:
    """A Trn2 program: instructions in execution order over numbered values."""

    mesh: MeshSpec
    instructions: tuple[Instruction, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    values: dict[int, ValueInfo]
    name: str = "main"
    # For PJRT-style per-device buffers: how each input/output of main is split across
    # chips (mesh.sharding dim_axes), None where it is replicated.
    input_shardings: tuple = ()
    output_shardings: tuple = ()
    # How many leading dims of each input/output (none where empty) stack the partial sums
    # of a value unreduced along as many mesh axes (jax's P(unreduced=...)), each split over
    # its axis: the chips hold different parts of the value's sum, not pieces of it.
    input_partials: tuple = ()
    output_partials: tuple = ()
    # Inputs of main whose buffers the caller donates (jit's donate_argnums) and a result
    # is written into: (position in `inputs`, position in `outputs`), as jax aliased them
    # (tf.aliasing_output) or XLA pairs a buffer donor (jax.buffer_donor) with a result.
    donated_inputs: tuple[tuple[int, int], ...] = ()
    # The memory kind of each input/output of main (one of HOST_MEMORIES), None where it is
    # in HBM (jax's "device", or no memory kind); empty when all are.
    input_memory_kinds: tuple = ()
    output_memory_kinds: tuple = ()

    def host_inputs(self) -> tuple[int, ...]:
        """The inputs held in host memory (input_memory_kinds)."""
        return tuple(v for v, kind in zip(self.inputs, self.input_memory_kinds)
                     if kind in HOST_MEMORIES)

    def host_outputs(self) -> tuple[int, ...]:
        """The outputs given back in host memory (output_memory_kinds)."""
        return tuple(v for v, kind in zip(self.outputs, self.output_memory_kinds)
                     if kind in HOST_MEMORIES)

    def info(self, value: int) -> ValueInfo:
        return self.values[value]

    def array_shape(self, value: int) -> tuple[int, ...]:
        """The value's array shape in the executor: mesh dims (1 where replicated), then
        its per-chip shape."""
        info = self.values[value]
        return self.mesh.layout_shape(info.varying) + info.type.shape
